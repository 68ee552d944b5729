"""Sharding plans: which rank holds which rows and columns of every table.

    plan = ShardingPlan.uniform(model, "row_wise", world_size=4)
    plan = plan.with_overrides(model, {"t0": "data_parallel", "t3": "table_row_wise"})
    plan.validate(model, world_size=4, local_world_size=2)
    ShardingPlan.from_json(plan.to_json()) == plan

Sharding types (Neo's 4D parallelism, recursively combined):
    table_wise          the whole table on one rank
    row_wise            rows split over ranks (any ranks, contiguous ranges in rank order)
    column_wise         columns split into shards, each on one rank
    data_parallel       replicated on every rank
    table_row_wise      the table on one node, rows split over that node's ranks
    table_column_wise   the table on one node, columns split over that node's ranks
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from enum import Enum
from typing import Iterable, Mapping

from ..config import ModelConfig

__all__ = ["ShardingType", "Shard", "TablePlan", "ShardingPlan", "even_splits", "column_splits", "brief_names"]


def brief_names(names: list[str], most: int = 8) -> str:
    """Up to ``most`` names quoted, then how many more: error messages stay one readable line."""
    shown = ", ".join(f"'{n}'" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


class ShardingType(str, Enum):
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    DATA_PARALLEL = "data_parallel"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"

    @classmethod
    def parse(cls, value: "str | ShardingType") -> "ShardingType":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown sharding type {value!r} (known: {', '.join(t.value for t in cls)})") from None


@dataclass(frozen=True)
class Shard:
    """Rows [row_start, row_end) x columns [col_start, col_end) of a table, held by ``rank``."""

    rank: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def cols(self) -> int:
        return self.col_end - self.col_start


@dataclass(frozen=True)
class TablePlan:
    table: str
    sharding: ShardingType
    shards: tuple[Shard, ...]
    cache_load_factor: float | None = None
    """Fraction of each shard's rows kept in the device cache (the rest in the backing store);
    None: the config's (TableConfig, then StorageConfig). Data-parallel tables are never cached."""

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.shards]


def even_splits(n: int, k: int) -> list[tuple[int, int]]:
    """[start, end) of k near-equal contiguous pieces of n (the first n % k pieces one larger)."""
    base, extra = divmod(n, k)
    out, start = [], 0
    for i in range(k):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def column_splits(dim: int, max_shards: int, unit: int = 4) -> list[tuple[int, int]]:
    """Column ranges for up to ``max_shards`` shards: whole multiples of ``unit`` columns when
    ``dim`` is a multiple of it (fbgemm's kernels need dims in multiples of 4), else near-equal."""
    if dim % unit == 0:
        k = max(1, min(max_shards, dim // unit))
        return [(a * unit, b * unit) for a, b in even_splits(dim // unit, k)]
    return even_splits(dim, max(1, min(max_shards, dim)))


@dataclass(frozen=True)
class ShardingPlan:
    world_size: int
    local_world_size: int
    tables: tuple[TablePlan, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.local_world_size < 1 or self.world_size % self.local_world_size:
            raise ValueError(
                f"plan: world size {self.world_size} must be a positive multiple of the local world size "
                f"{self.local_world_size}"
            )

    # ---- lookup -------------------------------------------------------------------------------
    def __getitem__(self, table: str) -> TablePlan:
        tp = self._by_table.get(table)
        if tp is None:
            raise KeyError(f"plan has no table '{table}'")
        return tp

    @cached_property
    def _by_table(self) -> dict[str, TablePlan]:
        """Table name -> its plan, the first where a name repeats (``validate`` refuses that); built
        on the first lookup: a planner looks up every table several times."""
        out: dict[str, TablePlan] = {}
        for tp in self.tables:
            out.setdefault(tp.table, tp)
        return out

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size

    def node_of(self, rank: int) -> int:
        return rank // self.local_world_size

    # ---- validation ---------------------------------------------------------------------------
    def validate(self, model: ModelConfig, world_size: int | None = None, local_world_size: int | None = None) -> None:
        """Every table of ``model`` exactly once, fully covered, on existing ranks; errors name the table."""
        if world_size is not None and world_size != self.world_size:
            raise ValueError(f"plan is for world size {self.world_size}, but the job has {world_size} ranks")
        if local_world_size is not None and local_world_size != self.local_world_size:
            raise ValueError(
                f"plan is for {self.local_world_size} ranks per node, but the job has {local_world_size}"
            )
        names = [tp.table for tp in self.tables]
        seen: set[str] = set()
        dups: set[str] = set()
        for n in names:
            (dups if n in seen else seen).add(n)
        dup = sorted(dups)
        if dup:
            raise ValueError(f"plan lists table(s) {brief_names(dup)} more than once")
        model_names = {t.name for t in model.tables}
        unknown = sorted(set(names) - model_names)
        if unknown and len(unknown) == len(names):
            raise ValueError(f"plan is for another model: none of its {len(names)} tables ({brief_names(unknown)}) is "
                             f"in this model's {len(model_names)} ({brief_names(sorted(model_names))})")
        if unknown:
            raise ValueError(f"plan names table(s) {brief_names(unknown)} that the model does not have")
        missing = [t.name for t in model.tables if t.name not in seen]
        if missing:
            raise ValueError(f"plan does not place table(s) {brief_names(missing)}")
        for t in model.tables:
            self._validate_table(self[t.name], t.num_rows, t.dim)

    def _validate_table(self, tp: TablePlan, rows: int, dim: int) -> None:
        W, L = self.world_size, self.local_world_size
        w = f"table '{tp.table}' ({tp.sharding.value})"
        if not tp.shards:
            raise ValueError(f"{w}: no shards")
        f = tp.cache_load_factor
        if f is not None and not (isinstance(f, float) and 0 < f <= 1):
            raise ValueError(f"{w}: cache_load_factor must be a number in (0, 1], got {f!r}")
        for s in tp.shards:
            if not 0 <= s.rank < W:
                raise ValueError(f"{w}: shard on rank {s.rank}, but the world has ranks 0..{W - 1}")
            if not (0 <= s.row_start < s.row_end <= rows and 0 <= s.col_start < s.col_end <= dim):
                raise ValueError(
                    f"{w}: shard rows [{s.row_start}, {s.row_end}) cols [{s.col_start}, {s.col_end}) "
                    f"outside the table's {rows} rows x {dim} cols (or empty)"
                )
        full_rows = all(s.row_start == 0 and s.row_end == rows for s in tp.shards)
        full_cols = all(s.col_start == 0 and s.col_end == dim for s in tp.shards)
        ranks = tp.ranks
        st = tp.sharding
        if st == ShardingType.TABLE_WISE:
            if len(tp.shards) != 1 or not (full_rows and full_cols):
                raise ValueError(f"{w}: needs exactly one shard holding the whole table")
        elif st == ShardingType.DATA_PARALLEL:
            if sorted(ranks) != list(range(W)) or not (full_rows and full_cols):
                raise ValueError(f"{w}: needs one full replica on every rank 0..{W - 1}")
        elif st in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
            if not full_cols:
                raise ValueError(f"{w}: row-wise shards must hold every column")
            _check_cover(w, "rows", [(s.row_start, s.row_end) for s in tp.shards], rows)
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"{w}: two row shards on one rank ({ranks})")
        elif st in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
            if not full_rows:
                raise ValueError(f"{w}: column-wise shards must hold every row")
            _check_cover(w, "columns", [(s.col_start, s.col_end) for s in tp.shards], dim)
        if st in (ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE):
            nodes = {r // L for r in ranks}
            if len(nodes) != 1:
                raise ValueError(f"{w}: shards span nodes {sorted(nodes)}; they must stay on one node of {L} ranks")

    # ---- construction -------------------------------------------------------------------------
    @staticmethod
    def table_plan(
        sharding: "str | ShardingType", name: str, rows: int, dim: int, world_size: int,
        local_world_size: int, slot: int = 0, ranks: Iterable[int] | None = None,
    ) -> TablePlan:
        """A plan for one table: ``slot`` picks the rank (TW/CW start) or node (TWRW/TWCW)."""
        st = ShardingType.parse(sharding)
        W, L = world_size, local_world_size
        if st == ShardingType.TABLE_WISE:
            shards = [Shard(slot % W, 0, rows, 0, dim)]
        elif st == ShardingType.DATA_PARALLEL:
            shards = [Shard(r, 0, rows, 0, dim) for r in range(W)]
        elif st in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
            if ranks is None:
                node = slot % (W // L)
                ranks = range(W) if st == ShardingType.ROW_WISE else range(node * L, (node + 1) * L)
            rk = list(ranks)
            rk = rk[: max(1, min(len(rk), rows))]
            shards = [Shard(r, a, b, 0, dim) for r, (a, b) in zip(rk, even_splits(rows, len(rk)))]
        else:  # column-wise kinds
            if ranks is None:
                node = slot % (W // L)
                ranks = [(slot + i) % W for i in range(W)] if st == ShardingType.COLUMN_WISE else range(node * L, (node + 1) * L)
            rk = list(ranks)
            shards = [Shard(r, 0, rows, a, b) for r, (a, b) in zip(rk, column_splits(dim, len(rk)))]
        return TablePlan(name, st, tuple(shards))

    @classmethod
    def uniform(
        cls, model: ModelConfig, sharding: "str | ShardingType", world_size: int, local_world_size: int | None = None
    ) -> "ShardingPlan":
        """Every table one type. TW: heaviest first onto the least loaded rank, load = lookup work
        (ids per sample x dim, every feature of the table), ties by size; TWRW/TWCW tables
        round-robin over nodes. (The cost-model planner, ``--sharding auto``, does better.)"""
        L = local_world_size or world_size
        st = ShardingType.parse(sharding)

        def work(i: int) -> tuple[float, int]:
            t = model.tables[i]
            return (max(t.pooling_factor, 1e-3) * t.dim * len(t.feature_names), t.num_params)

        order = sorted(range(len(model.tables)), key=lambda i: tuple(-x for x in work(i)))
        slots = [0] * len(model.tables)
        if st == ShardingType.TABLE_WISE:
            load = [(0.0, 0)] * world_size
            for i in order:
                r = min(range(world_size), key=lambda k: (load[k], k))
                slots[i] = r
                load[r] = (load[r][0] + work(i)[0], load[r][1] + work(i)[1])
        else:
            for k, i in enumerate(order):
                slots[i] = k
        tps = tuple(
            cls.table_plan(st, t.name, t.num_rows, t.dim, world_size, L, slots[i]) for i, t in enumerate(model.tables)
        )
        return cls(world_size, L, tps)

    def with_overrides(self, model: ModelConfig, overrides: Mapping[str, "str | ShardingType | TablePlan"]) -> "ShardingPlan":
        """A copy where the named tables take another type (or an explicit TablePlan)."""
        known = {t.name: t for t in model.tables}
        for name in overrides:
            if name not in known:
                raise ValueError(f"override names table '{name}' that the model does not have")
        new = []
        for i, tp in enumerate(self.tables):
            o = overrides.get(tp.table)
            if o is None:
                new.append(tp)
            elif isinstance(o, TablePlan):
                new.append(o)
            else:
                t = known[tp.table]
                new.append(self.table_plan(o, t.name, t.num_rows, t.dim, self.world_size, self.local_world_size, i))
        return ShardingPlan(self.world_size, self.local_world_size, tuple(new))

    # ---- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "tables": [
                {
                    "table": tp.table,
                    "sharding": tp.sharding.value,
                    "shards": [[s.rank, s.row_start, s.row_end, s.col_start, s.col_end] for s in tp.shards],
                    **({} if tp.cache_load_factor is None else {"cache_load_factor": tp.cache_load_factor}),
                }
                for tp in self.tables
            ],
        }

    def to_json(self, path: str | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path:
            with open(path, "w") as f:
                f.write(text)
        return text

    @classmethod
    def from_dict(cls, d: dict) -> "ShardingPlan":
        try:
            tps = tuple(
                TablePlan(
                    t["table"], ShardingType.parse(t["sharding"]), tuple(Shard(*map(int, s)) for s in t["shards"]),
                    None if t.get("cache_load_factor") is None else float(t["cache_load_factor"]),
                )
                for t in d["tables"]
            )
            return cls(int(d["world_size"]), int(d["local_world_size"]), tps)
        except (KeyError, TypeError) as e:
            raise ValueError(f"sharding plan JSON is malformed: {e!r}") from None

    @classmethod
    def from_json(cls, text_or_path: str) -> "ShardingPlan":
        text = text_or_path
        if not text_or_path.lstrip().startswith("{"):
            with open(text_or_path) as f:
                text = f.read()
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise ValueError(f"sharding plan is not valid JSON: {e}") from None

    def describe(self) -> str:
        """One line per table: type and shards."""
        lines = [f"plan: {self.world_size} ranks ({self.num_nodes} nodes x {self.local_world_size})"]
        for tp in self.tables:
            sh = ", ".join(
                f"r{s.rank}[{s.row_start}:{s.row_end},{s.col_start}:{s.col_end}]" for s in tp.shards[:6]
            ) + (" ..." if len(tp.shards) > 6 else "")
            cache = "" if tp.cache_load_factor is None else f"  cache {tp.cache_load_factor:g}"
            lines.append(f"  {tp.table:<12} {tp.sharding.value:<18} {sh}{cache}")
        return "\n".join(lines)


def _check_cover(where: str, what: str, ranges: list[tuple[int, int]], n: int) -> None:
    pos = 0
    for a, b in sorted(ranges):
        if a != pos:
            raise ValueError(f"{where}: {what} [{pos}, {a}) are not covered" if a > pos else f"{where}: {what} overlap at {a}")
        pos = b
    if pos != n:
        raise ValueError(f"{where}: {what} [{pos}, {n}) are not covered")
