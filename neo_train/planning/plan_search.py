"""The planner's placement search (``planner.plan_sharding`` drives it): each table takes the
option that keeps the slowest rank's step time smallest, within each rank's memory.

Options per table (each allowed by the table's constraints and the global ``allowed`` types):
    TW    the whole table on one rank (every rank is a candidate)
    CW    k column shards (k in ``col_shards``, widths >= min_col_width, multiples of 4 when
          D is; D % k == 0), each shard on its own rank; tried for heavy tables only
    RW    rows over all allowed ranks
    TWRW  rows over the G ranks of one node (every node is a candidate)
    TWCW  k column shards on ranks of one node (k <= G); heavy tables only
    DP    replicated on every rank
Neo's recursive "table-wise then row/column-wise" is the node-level options: pick a node, then
split within it. TW/CW candidates are scored node and rank together (``RankLoads.trial_unit``).

Search:
 1. greedy, longest processing time first: tables sorted by their standalone TW cost (time or
    memory share, whichever is larger); each takes the option with the smallest
    max(resulting max over ranks, projected mean) -- the projection (time placed so far plus the
    cheapest cost of the tables still to come, over W) keeps the first big tables from being
    spread (RW, CW) just because every rank is still idle; ties go to the option adding the
    least total time, then to the least loaded owner, then to the lowest rank.
 2. refinement: while the critical rank improves (at most ``refine_iters`` rounds), move one of
    its TW/CW/TWCW shards to the best other rank, or swap it with a smaller shard of a lightly
    loaded rank.
Deterministic: no randomness, ties broken by index. Nothing is allocated per table row. A table
no option can place raises PlanningError with ``plan_explain.explain_infeasible``'s report.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..config import ModelConfig
from ..topology.spec import ClusterSpec
from .cost_model import CostContext
from .loads import GROUP_OF, RankLoads, TableArrays, _max_excluding_self, row_ranges
from .plan import Shard, ShardingPlan, ShardingType, TablePlan, brief_names, even_splits
from .plan_explain import Fix, explain_infeasible

__all__ = ["TableConstraint", "PlannerOptions", "PlanningError"]

ALL_TYPES = tuple(ShardingType)


@dataclass(frozen=True)
class TableConstraint:
    """What the user allows for one table."""

    allowed: tuple[ShardingType, ...] | None = None
    """Sharding types it may take (None: the planner's global set)."""
    ranks: tuple[int, ...] | None = None
    """Every shard must live on one of these ranks (None: any)."""
    min_col_width: int | None = None
    """Narrowest column shard (None: the planner's default)."""


@dataclass(frozen=True)
class PlannerOptions:
    batch_size: int = 512
    """b, samples per rank per step."""
    table_dtype: str = "fp32"
    optimizer: str = "rowwise_adagrad"
    dense_optimizer: str = "adagrad"
    fwd_comm_dtype: str = "fp32"
    bwd_comm_dtype: str = "fp32"
    memory_fraction: float = 0.95
    """Usable share of each device's memory (the rest: runtime context, allocator slack)."""
    allowed: tuple[ShardingType, ...] = ALL_TYPES
    min_col_width: int = 4
    col_shards: tuple[int, ...] = (2, 4, 8)
    """Column-shard counts tried for CW (TWCW tries these up to G, and G)."""
    split_tolerance: float = 0.0
    """Try CW/TWCW when a table kept whole (TW) would lift the slowest rank more than this
    fraction above the projected mean (0: any lift), or cannot be placed whole."""
    refine_iters: int = 200
    auto_cache: bool = True
    """When the tables do not fit device memory resident, cache the large ones (keep a share of
    their rows on the device, the rest in host memory or on SSD) before reporting no fit."""
    zipf_alpha: float = 1.1
    """Power-law exponent of the ids (DataConfig.zipf_alpha): a cached table's hit rate."""
    ssd: bool = False
    """Cached tables' backing store is the SSD tier (storage.storage_dir): host memory does not
    bound their size. Otherwise their full rows and state must fit the nodes' host memory."""
    cache_factors: tuple[float, ...] = (0.5, 0.25, 0.1, 0.05, 0.02, 0.01)
    """The load factors auto_cache tries, largest (best hit rate) first."""

    def context(self, cluster: ClusterSpec) -> CostContext:
        return CostContext(cluster, self.batch_size, self.table_dtype, self.optimizer, self.dense_optimizer,
                           self.fwd_comm_dtype, self.bwd_comm_dtype, ssd=self.ssd)


class PlanningError(ValueError):
    """No placement fits: names the table, what it needs, and the smallest change that fits."""

    def __init__(self, message: str, table: str | None = None, suggestions: Sequence[Fix] = ()) -> None:
        super().__init__(message)
        self.table = table
        self.suggestions = list(suggestions)  # the fixes, smallest first (``.text`` in words)


# ---- a table's placement --------------------------------------------------------------------------

@dataclass
class _Choice:
    st: ShardingType
    shards: list[Shard] | None = None
    spread: tuple[list[int], list[tuple[int, int]], int] | None = None
    """RW/DP over many ranks: (ranks, row ranges, D), made into shards only when chosen."""

    def table_plan(self, name: str) -> TablePlan:
        if self.shards is None:
            ranks, rr, D = self.spread  # type: ignore[misc]
            self.shards = [Shard(r, a, z, 0, D) for r, (a, z) in zip(ranks, rr)]
        return TablePlan(name, self.st, tuple(self.shards))


def _col_counts(D: int, min_w: int, candidates: Sequence[int], limit: int) -> list[int]:
    """Column-shard counts k with D % k == 0, width D/k >= min_w (and a multiple of 4 when D is:
    fused kernels want aligned rows), 2 <= k <= limit."""
    out = []
    for k in sorted(set(candidates)):
        if 2 <= k <= limit and D % k == 0 and D // k >= min_w and (D % 4 or (D // k) % 4 == 0):
            out.append(k)
    return out


class _Planner:
    def __init__(self, model: ModelConfig, cluster: ClusterSpec, opts: PlannerOptions,
                 constraints: Mapping[str, TableConstraint], cap_scale: float = 1.0) -> None:
        self.model, self.c, self.o = model, cluster, opts
        self.ctx = opts.context(cluster)
        self.t = TableArrays.from_model(model, opts.zipf_alpha)
        self.L = RankLoads(self.ctx, self.t, model)
        # the planner does not know the final RW groups: price weights if any table is mean-pooled
        anymean = bool(self.t.mean.any())
        self.L.weighted = {"rw": anymean, "twrw": anymean}
        self.W, self.G, self.N = cluster.world_size, cluster.devices_per_node, cluster.nodes
        # cap_scale > 1 pretends devices are larger: the best-effort plan of a model that does not fit
        self.cap = self.L.capacity(opts.memory_fraction) * cap_scale if cap_scale < math.inf else math.inf
        unknown = sorted(set(constraints) - set(self.t.names))
        if unknown:
            raise ValueError(f"constraints name table(s) {brief_names(unknown)} that the model does not have")
        self.cons = [constraints.get(n, TableConstraint()) for n in self.t.names]
        for n, c in zip(self.t.names, self.cons):
            bad = [r for r in (c.ranks or ()) if not 0 <= r < self.W]
            if bad:
                raise ValueError(f"table '{n}': pinned rank(s) {bad} outside 0..{self.W - 1}")
        self.choice: list[_Choice | None] = [None] * len(self.t.names)
        self.remaining = 0.0  # standalone cost of the tables not placed yet (the projection)
        self.tw_max_after = math.inf  # the last TW option's max over ranks (splits are tried above it)

    # ---- per-table facts ----------------------------------------------------------------------
    def allowed(self, i: int) -> list[ShardingType]:
        c = self.cons[i]
        ok = list(c.allowed) if c.allowed is not None else list(self.o.allowed)
        if (c.ranks is not None and len(set(c.ranks)) < self.W) or self.t.cache[i] < 1.0:
            ok = [st for st in ok if st != ShardingType.DATA_PARALLEL]  # replicas are never cached
        return ok

    def rank_mask(self, i: int) -> np.ndarray:
        m = np.ones(self.W, dtype=bool)
        if self.cons[i].ranks is not None:
            m[:] = False
            m[list(self.cons[i].ranks)] = True
        return m

    def min_width(self, i: int) -> int:
        return self.cons[i].min_col_width or self.o.min_col_width

    def tw_cost(self, i: int) -> tuple[float, float]:
        """(seconds, bytes) of table i as one TW unit: its owner's lookup + update + sent bytes."""
        d = self.L.deltas("tw", i, self.t.rows[i], float(self.t.dims[i]))
        c = self.c
        comm = (self.W - 1) * (d.inp + d.out * (self.ctx.fwd_bytes + self.ctx.bwd_bytes)) / c.slowest_bandwidth
        return float((d.fwd + d.bwd) / c.hbm_bandwidth + comm), float(d.mem)

    # ---- scoring ------------------------------------------------------------------------------
    def _key(self, max_after: np.ndarray | float, added: np.ndarray | float) -> np.ndarray | float:
        """max(max over ranks after, projected mean after): see the module docstring."""
        proj = (self.L.total.sum() + added + self.remaining) / self.W
        return np.maximum(max_after, proj)

    def _apply(self, i: int, ch: _Choice, sign: int = 1) -> None:
        if ch.shards is None and ch.st == ShardingType.DATA_PARALLEL:
            self.L.add_dp(i, sign)
        elif ch.shards is None:
            self.L.add_rows(GROUP_OF[ch.st], i, *ch.spread[:2], sign)  # type: ignore[index]
        else:
            self.L.add_table_plan(i, ch.table_plan(self.t.names[i]), sign)

    def _try_apply(self, i: int, ch: _Choice, check_mem: bool) -> tuple[float, float, float] | None:
        """Apply, read (key, added, max), undo; None when a rank would overflow."""
        before = self.L.total.sum()
        self._apply(i, ch)
        ok = (not check_mem) or bool((self.L.mem <= self.cap * (1 + 1e-12)).all())
        mx, added = float(self.L.total.max()), float(self.L.total.sum() - before)
        self._apply(i, ch, -1)
        if not ok:
            return None
        return float(self._key(mx, added)), added, mx

    # ---- options --------------------------------------------------------------------------------
    def opt_tw(self, i: int, check_mem: bool):
        R, D = float(self.t.rows[i]), float(self.t.dims[i])
        d = self.L.deltas("tw", i, R, D)
        mx, added, own = self.L.trial_unit("tw", d)
        mask = self.rank_mask(i)
        if check_mem:
            mask &= self.L.mem + d.mem <= self.cap
        if not mask.any():
            return None
        key = self._key(mx, added)
        o = _argbest(mask, key, added, own)
        self.tw_max_after = float(mx[o])
        return float(key[o]), float(added[o]), _Choice(ShardingType.TABLE_WISE, [Shard(o, 0, int(R), 0, int(D))])

    def _place_units(self, i: int, group: str, widths: list[tuple[int, int]], check_mem: bool, one_node: bool):
        """Place column shards one by one (each on the best rank not yet used by the table);
        returns the shards or None. Leaves them applied: the caller undoes."""
        R = float(self.t.rows[i])
        base_mask = self.rank_mask(i)
        if one_node:  # only nodes with enough eligible ranks
            per_node = base_mask.reshape(self.N, self.G).sum(axis=1)
            base_mask &= np.repeat(per_node >= len(widths), self.G)
        shards: list[Shard] = []
        for a, z in widths:
            d = self.L.deltas(group, i, R, float(z - a))
            mx, added, own = self.L.trial_unit(group, d)
            mask = base_mask.copy()
            for s in shards:
                mask[s.rank] = False
            if check_mem:
                mask &= self.L.mem + d.mem <= self.cap
            if not mask.any():
                for s in shards:
                    self.L.add_unit(group, s.rank, self.L.deltas(group, i, R, float(s.cols)), -1)
                return None
            o = _argbest(mask, mx, own, added)
            if one_node and not shards:
                node_mask = np.zeros(self.W, dtype=bool)
                n = o // self.G
                node_mask[n * self.G:(n + 1) * self.G] = True
                base_mask &= node_mask
            shards.append(Shard(o, 0, int(R), a, z))
            self.L.add_unit(group, o, d)
        return shards

    def opt_cols(self, i: int, st: ShardingType, k: int, check_mem: bool):
        group = GROUP_OF[st]
        D = int(self.t.dims[i])
        before = self.L.total.sum()
        shards = self._place_units(i, group, even_splits(D, k), check_mem, st == ShardingType.TABLE_COLUMN_WISE)
        if shards is None:
            return None
        mx, added = float(self.L.total.max()), float(self.L.total.sum() - before)
        R = float(self.t.rows[i])
        for s in shards:
            self.L.add_unit(group, s.rank, self.L.deltas(group, i, R, float(s.cols)), -1)
        return float(self._key(mx, added)), added, _Choice(st, shards)

    def opt_rw(self, i: int, check_mem: bool):
        R, D = int(self.t.rows[i]), int(self.t.dims[i])
        ranks = np.flatnonzero(self.rank_mask(i)).tolist()
        rr = row_ranges(R, len(ranks))
        ch = _Choice(ShardingType.ROW_WISE, spread=(ranks[: len(rr)], rr, D))
        res = self._try_apply(i, ch, check_mem)
        return None if res is None else (res[0], res[1], ch)

    def opt_dp(self, i: int, check_mem: bool):
        R, D = int(self.t.rows[i]), int(self.t.dims[i])
        ch = _Choice(ShardingType.DATA_PARALLEL, spread=(list(range(self.W)), [(0, R)] * self.W, D))
        res = self._try_apply(i, ch, check_mem)
        return None if res is None else (res[0], res[1], ch)

    def opt_twrw(self, i: int, check_mem: bool):
        """Every node at once: ranks of the host node get row shard j (local index j); other
        nodes see only the input/output totals grow (see RankLoads.trial_unit for the trick)."""
        L, G, N, W = self.L, self.G, self.N, self.W
        R, D = int(self.t.rows[i]), int(self.t.dims[i])
        rr = row_ranges(R, G)
        k = len(rr)
        rows_j = np.zeros(G)
        rows_j[:k] = [z - a for a, z in rr]
        d = L.deltas("twrw", i, rows_j, float(D))
        has = np.arange(G) < k
        inp_j = np.where(has, d.inp, 0.0)
        hbm_j = np.where(has, (d.fwd + d.bwd) / self.c.hbm_bandwidth, 0.0)
        mem_j = np.where(has, d.mem, 0.0) + 2 * W * self.ctx.batch_size * D * float(self.t.features[i]) * 4
        u = self.ctx.batch_size * D * float(self.t.features[i])
        ch, nd, loc = L.inp["twrw"], L.node_of, np.arange(W) % G
        base = L.total - L._ctime["twrw"]
        v = float(inp_j.sum())
        host_in = L.group_time("twrw", ch.own + inp_j[loc], ch.node[nd] + v, ch.total + v)
        other_in = L.group_time("twrw", ch.own, ch.node[nd], ch.total + v)
        host_out, other_out = np.zeros(W), np.zeros(W)
        for wire in (self.ctx.fwd_bytes, self.ctx.bwd_bytes):
            h, o = _twrw_pair(L, u, wire)
            host_out, other_out = host_out + h[nd], other_out + o[nd]
        A = base + hbm_j[loc] + host_in + host_out  # rank r if its node hosts
        C = base + other_in + other_out  # rank r if another node hosts
        Amax = A.reshape(N, G).max(axis=1)
        Cm = _max_excluding_self(C.reshape(N, G).max(axis=1)[None, :])[0] if N > 1 else np.full(N, -np.inf)
        mx = np.maximum(Amax, Cm)
        dA, dC = (A - L.total).reshape(N, G).sum(axis=1), (C - L.total).reshape(N, G).sum(axis=1)
        added = dA + dC.sum() - dC
        mask = self.rank_mask(i).reshape(N, G).all(axis=1)
        if check_mem:
            mask &= (L.mem.reshape(N, G) + mem_j[None, :] <= self.cap).all(axis=1)
        if not mask.any():
            return None
        key = self._key(mx, added)
        n = _argbest(mask, key, added, Amax)
        shards = [Shard(n * G + j, a, z, 0, D) for j, (a, z) in enumerate(rr)]
        return float(key[n]), float(added[n]), _Choice(ShardingType.TABLE_ROW_WISE, shards)

    def options(self, i: int, check_mem: bool) -> list[tuple[float, float, int, _Choice]]:
        """Every allowed option's (key, added time, type order, choice). Column splits are tried
        only when keeping the table whole (TW) would raise the key above today's level, or TW is
        impossible: splitting costs duplicated ids, so it only pays against imbalance."""
        out = []
        D = int(self.t.dims[i])
        heavy = True
        for rank_of_type, st in enumerate(ShardingType):
            if st not in self.allowed(i):
                continue
            if st == ShardingType.TABLE_WISE:
                found = [self.opt_tw(i, check_mem)]
                if found[0] is not None:  # whole, it would be the new critical rank?
                    proj = float(self._key(0.0, found[0][1]))
                    heavy = self.tw_max_after > proj * (1 + self.o.split_tolerance)
            elif st == ShardingType.ROW_WISE:
                found = [self.opt_rw(i, check_mem)]
            elif st == ShardingType.DATA_PARALLEL:
                found = [self.opt_dp(i, check_mem)]
            elif st == ShardingType.TABLE_ROW_WISE:
                found = [self.opt_twrw(i, check_mem)]
            elif not heavy:
                continue
            else:
                # a table too big for one rank also tries every power-of-two split
                big = [2 ** j for j in range(1, 12)] if self.tw_cost(i)[1] > self.cap else []
                # one column shard is table-wise by another name: offered only when TW is not allowed
                one = [1] if ShardingType.TABLE_WISE not in self.allowed(i) and D >= self.min_width(i) else []
                if st == ShardingType.COLUMN_WISE:
                    ks = one + _col_counts(D, self.min_width(i), [*self.o.col_shards, *big], int(self.rank_mask(i).sum()))
                else:  # TWCW moves what CW does, confined to a node: its natural split is G
                    ks = one + _col_counts(D, self.min_width(i), [*big, self.G], self.G)
                found = [self.opt_cols(i, st, k, check_mem) for k in ks]
            out += [(f[0], f[1], rank_of_type, f[2]) for f in found if f is not None]
        return out

    # ---- the search -----------------------------------------------------------------------------
    def greedy(self) -> None:
        n = len(self.t.names)
        costs = [self.tw_cost(i) for i in range(n)]
        fair = sum(c[0] for c in costs) / self.W
        order = sorted(range(n), key=lambda i: (-max(costs[i][0] / max(fair, 1e-30), costs[i][1] / max(self.cap, 1.0)), i))
        self.remaining = sum(c[0] for c in costs)
        for i in order:
            self.remaining -= costs[i][0]
            opts = self.options(i, True)
            if not opts and not self.options(i, False):
                name = self.t.names[i]
                raise PlanningError(
                    f"table '{name}' ({int(self.t.rows[i]):,} x {int(self.t.dims[i])}): its allowed types "
                    f"{[st.value for st in self.allowed(i)]} admit no placement on its ranks (column shards need "
                    f"D % k == 0 and widths >= {self.min_width(i)}; table_row_wise/table_column_wise need a whole "
                    "node of allowed ranks)", name)
            if not opts:
                raise PlanningError(*explain_infeasible(self, i))
            best = min(opts, key=lambda x: (x[0], x[1], x[2]))[3]
            self.choice[i] = best
            self._apply(i, best)

    def refine(self) -> int:
        """Move or swap single-rank shards off the critical rank while the max improves; returns
        the number of moves made."""
        L, tol = self.L, 1e-12
        moves = 0
        for _ in range(self.o.refine_iters):
            r = int(np.argmax(L.total))
            cur = float(L.total[r])
            by_rank: dict[int, list[tuple[int, int]]] = {}
            for i, ch in enumerate(self.choice):
                if ch is not None and GROUP_OF[ch.st] in ("tw", "cw", "twcw"):
                    for j, sh in enumerate(ch.shards or ()):
                        by_rank.setdefault(sh.rank, []).append((i, j))
            units = by_rank.get(r, [])
            if not units:
                break
            units.sort(key=lambda u: (-self._unit_work(*u), u))  # heaviest first
            if not (self._try_moves(units[:8], r, cur, tol) or self._try_swaps(units[:4], r, cur, tol, by_rank)):
                break
            moves += 1
        return moves

    def _unit_work(self, i: int, j: int) -> float:
        d = self._unit_deltas(i, j)[1]
        return float(d.fwd + d.bwd)

    def _unit_deltas(self, i: int, j: int):
        ch = self.choice[i]
        g = GROUP_OF[ch.st]
        s = ch.shards[j]
        return g, self.L.deltas(g, i, float(self.t.rows[i]), float(s.cols))

    def _unit_mask(self, i: int, j: int) -> np.ndarray:
        """Ranks shard j of table i may move to: its table's allowed ranks, not a sibling's rank,
        and for TWCW its node."""
        ch = self.choice[i]
        mask = self.rank_mask(i)
        for k, s in enumerate(ch.shards):
            if k != j:
                mask[s.rank] = False
        if ch.st == ShardingType.TABLE_COLUMN_WISE:
            node = ch.shards[j].rank // self.G
            keep = np.zeros(self.W, dtype=bool)
            keep[node * self.G:(node + 1) * self.G] = True
            mask &= keep
        return mask

    def _move(self, i: int, j: int, to: int) -> None:
        g, d = self._unit_deltas(i, j)
        s = self.choice[i].shards[j]
        self.L.add_unit(g, s.rank, d, -1)
        self.L.add_unit(g, to, d)
        self.choice[i].shards[j] = Shard(to, s.row_start, s.row_end, s.col_start, s.col_end)

    def _try_moves(self, units, r: int, cur: float, tol: float) -> bool:
        for i, j in units:
            g, d = self._unit_deltas(i, j)
            self.L.add_unit(g, r, d, -1)
            mx, added, own = self.L.trial_unit(g, d)
            mask = self._unit_mask(i, j) & (self.L.mem + d.mem <= self.cap)
            mask[r] = False
            self.L.add_unit(g, r, d)
            if mask.any():
                o = _argbest(mask, mx, own, added)
                if mx[o] < cur - tol:
                    self._move(i, j, int(o))
                    return True
        return False

    def _try_swaps(self, units, r: int, cur: float, tol: float, by_rank: dict[int, list[tuple[int, int]]]) -> bool:
        """Swap a heavy shard of the critical rank with a lighter one of the 4 least loaded ranks."""
        light = np.argsort(self.L.total, kind="stable")[:4]
        for i, j in units:
            work = self._unit_work(i, j)
            for r2 in light.tolist():
                if r2 == r or not self._unit_mask(i, j)[r2]:
                    continue
                for i2, j2 in [u for u in by_rank.get(r2, []) if u[0] != i][:16]:
                    if self._unit_work(i2, j2) >= work or not self._unit_mask(i2, j2)[r]:
                        continue
                    self._move(i, j, r2)
                    self._move(i2, j2, r)
                    if float(self.L.total.max()) < cur - tol and (self.L.mem <= self.cap * (1 + 1e-12)).all():
                        return True
                    self._move(i2, j2, r2)
                    self._move(i, j, r)
        return False

    def build(self) -> ShardingPlan:
        tps = tuple(ch.table_plan(n) for n, ch in zip(self.t.names, self.choice))  # type: ignore[union-attr]
        tps = tuple(  # the cached tables carry their load factor in the plan
            tp if c >= 1.0 else dataclasses.replace(tp, cache_load_factor=float(c)) for tp, c in zip(tps, self.t.cache)
        )
        return ShardingPlan(self.W, self.G, tps)


def _argbest(mask: np.ndarray, *keys: np.ndarray) -> int:
    """Index of the lexicographically smallest (keys..., index) among mask."""
    idx = np.flatnonzero(mask)
    order = np.lexsort(tuple(np.asarray(k)[idx] for k in reversed(keys)))
    return int(idx[order[0]])


def _twrw_pair(L: RankLoads, u: float, wire: int) -> tuple[np.ndarray, np.ndarray]:
    """TWRW output time per node (N,) if that node hosts a new table of width u, and if another
    node does (its own width unchanged, the cross all-to-all's total grows by u)."""
    c, G, N = L.c, L.G, L.N
    w, S = L.twrw_node * wire, float(L.twrw_node.sum() + u) * wire
    uw = u * wire

    def t(width: np.ndarray) -> np.ndarray:
        out = np.zeros(N)
        if G > 1:
            out = out + (G - 1) * N * width / c.intra_node_bandwidth + c.intra_node_latency
        if N > 1:
            out = out + np.maximum((N - 1) * width, S - width) / c.inter_node_bandwidth_per_device + c.inter_node_latency
        return out

    return t(w + uw), t(w)


def _plan_once(model: ModelConfig, cluster: ClusterSpec, opts: PlannerOptions,
               constraints: Mapping[str, TableConstraint], cap_scale: float = 1.0) -> _Planner:
    """One search, greedy then refinement: the planner holding its placement (``build()``: the
    plan). ``cap_scale`` > 1 pretends the devices have that much more memory."""
    p = _Planner(model, cluster, opts, constraints, cap_scale)
    p.greedy()
    p.refine()
    return p
