"""The sharding planner: choose a sharding type and placement for every table so that the slowest
rank's step time (cost model: communication + lookups, i.e. Neo's "communication overhead and
load imbalance") is smallest, subject to each rank's memory.

    result = plan_sharding(preset("model_a").model, preset_cluster("zionex"), batch_size=512)
    result.fits, result.estimate.critical_path, result.plan.to_json("plan.json")
    print(result.report())

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
Deterministic: no randomness, ties broken by index. Nothing is allocated per table row.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..config import ModelConfig
from ..topology.spec import ClusterSpec
from .cost_model import CostContext, CostEstimate, TABLE_DTYPES, estimate, shard_memory_bytes
from .loads import GROUP_OF, RankLoads, TableArrays, _max_excluding_self, row_ranges
from .plan import Shard, ShardingPlan, ShardingType, TablePlan, even_splits

__all__ = [
    "TableConstraint",
    "PlannerOptions",
    "PlanResult",
    "PlanningError",
    "plan_sharding",
    "check_coverage",
    "round_robin_plan",
]

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
    split_threshold: float = 0.5
    """Try CW/TWCW only for tables whose TW time exceeds this share of a rank's fair load."""
    refine_iters: int = 200

    def context(self, cluster: ClusterSpec) -> CostContext:
        return CostContext(cluster, self.batch_size, self.table_dtype, self.optimizer, self.dense_optimizer,
                           self.fwd_comm_dtype, self.bwd_comm_dtype)


class PlanningError(ValueError):
    """No placement fits: names the table, what it needs, and the smallest change that fits."""

    def __init__(self, message: str, table: str | None = None, suggestions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.table, self.suggestions = table, list(suggestions)


@dataclass
class PlanResult:
    plan: ShardingPlan
    estimate: CostEstimate
    cluster: ClusterSpec
    options: PlannerOptions
    fits: bool
    explanation: str = ""
    """Why it does not fit and what would (empty when it fits)."""
    seconds: float = 0.0
    """Planning wall time."""
    counts: dict[str, int] = field(default_factory=dict)
    """Tables per sharding type."""

    def report(self, max_ranks: int = 10) -> str:
        from .plan_report import format_result

        return format_result(self, max_ranks)


# ---- a table's placement --------------------------------------------------------------------------

@dataclass
class _Choice:
    st: ShardingType
    shards: list[Shard]

    def table_plan(self, name: str) -> TablePlan:
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
                 constraints: Mapping[str, TableConstraint]) -> None:
        self.model, self.c, self.o = model, cluster, opts
        self.ctx = opts.context(cluster)
        self.t = TableArrays.from_model(model)
        self.L = RankLoads(self.ctx, self.t, model)
        # the planner does not know the final RW groups: price weights if any table is mean-pooled
        anymean = bool(self.t.mean.any())
        self.L.weighted = {"rw": anymean, "twrw": anymean}
        self.W, self.G, self.N = cluster.world_size, cluster.devices_per_node, cluster.nodes
        self.cap = self.L.capacity(opts.memory_fraction)
        unknown = sorted(set(constraints) - set(self.t.names))
        if unknown:
            raise ValueError(f"constraints name table(s) {unknown} that the model does not have")
        self.cons = [constraints.get(n, TableConstraint()) for n in self.t.names]
        for n, c in zip(self.t.names, self.cons):
            bad = [r for r in (c.ranks or ()) if not 0 <= r < self.W]
            if bad:
                raise ValueError(f"table '{n}': pinned rank(s) {bad} outside 0..{self.W - 1}")
        self.choice: list[_Choice | None] = [None] * len(self.t.names)
        self.overflow: list[str] = []  # tables placed past the memory limit (strict=False)
        self.remaining = 0.0  # standalone cost of the tables not placed yet (the projection)

    # ---- per-table facts ----------------------------------------------------------------------
    def allowed(self, i: int) -> list[ShardingType]:
        c = self.cons[i]
        ok = list(c.allowed) if c.allowed is not None else list(self.o.allowed)
        if c.ranks is not None and len(set(c.ranks)) < self.W:
            ok = [st for st in ok if st != ShardingType.DATA_PARALLEL]
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
        ch = _Choice(ShardingType.ROW_WISE, [Shard(r, a, z, 0, D) for r, (a, z) in zip(ranks, rr)])
        res = self._try_apply(i, ch, check_mem)
        return None if res is None else (res[0], res[1], ch)

    def opt_dp(self, i: int, check_mem: bool):
        R, D = int(self.t.rows[i]), int(self.t.dims[i])
        ch = _Choice(ShardingType.DATA_PARALLEL, [Shard(r, 0, R, 0, D) for r in range(self.W)])
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

    def options(self, i: int, check_mem: bool, heavy: bool) -> list[tuple[float, float, int, _Choice]]:
        out = []
        D = int(self.t.dims[i])
        for rank_of_type, st in enumerate(ShardingType):
            if st not in self.allowed(i):
                continue
            if st == ShardingType.TABLE_WISE:
                found = [self.opt_tw(i, check_mem)]
            elif st == ShardingType.ROW_WISE:
                found = [self.opt_rw(i, check_mem)]
            elif st == ShardingType.DATA_PARALLEL:
                found = [self.opt_dp(i, check_mem)]
            elif st == ShardingType.TABLE_ROW_WISE:
                found = [self.opt_twrw(i, check_mem)]
            elif not heavy:
                continue
            elif st == ShardingType.COLUMN_WISE:
                ks = _col_counts(D, self.min_width(i), self.o.col_shards, int(self.rank_mask(i).sum()))
                found = [self.opt_cols(i, st, k, check_mem) for k in ks]
            else:
                ks = _col_counts(D, self.min_width(i), [*self.o.col_shards, self.G], self.G)
                found = [self.opt_cols(i, st, k, check_mem) for k in ks]
            out += [(f[0], f[1], rank_of_type, f[2]) for f in found if f is not None]
        return out

    # ---- the search -----------------------------------------------------------------------------
    def greedy(self, strict: bool) -> None:
        n = len(self.t.names)
        costs = [self.tw_cost(i) for i in range(n)]
        fair = sum(c[0] for c in costs) / self.W
        order = sorted(range(n), key=lambda i: (-max(costs[i][0] / max(fair, 1e-30), costs[i][1] / max(self.cap, 1.0)), i))
        self.remaining = sum(c[0] for c in costs)
        for i in order:
            self.remaining -= costs[i][0]
            heavy = costs[i][0] > self.o.split_threshold * fair or costs[i][1] > self.cap
            opts = self.options(i, True, heavy)
            if not opts:
                if strict:
                    raise PlanningError(*_explain(self, i))
                self.overflow.append(self.t.names[i])
                opts = self.options(i, False, heavy)
                if not opts:
                    raise PlanningError(f"table '{self.t.names[i]}': no allowed sharding type can place it", self.t.names[i])
            best = min(opts, key=lambda x: (x[0], x[1], x[2]))
            self.choice[i] = best[3]
            self._apply(i, best[3])

    def refine(self) -> int:
        """Move or swap single-rank shards off the critical rank while the max improves."""
        L, tol = self.L, 1e-12
        moves = 0
        for _ in range(self.o.refine_iters):
            r = int(np.argmax(L.total))
            cur = float(L.total[r])
            units = [(i, j) for i, ch in enumerate(self.choice) if ch is not None and GROUP_OF[ch.st] in ("tw", "cw", "twcw")
                     for j, s in enumerate(ch.shards) if s.rank == r]
            if not units:
                break
            units.sort(key=lambda u: (-self._unit_deltas(*u)[1].fwd - self._unit_deltas(*u)[1].bwd, u))
            if not (self._try_moves(units[:8], r, cur, tol) or self._try_swaps(units[:4], r, cur, tol)):
                break
            moves += 1
        return moves

    def _unit_deltas(self, i: int, j: int):
        ch = self.choice[i]
        g = GROUP_OF[ch.st]
        s = ch.shards[j]
        return g, self.L.deltas(g, i, float(self.t.rows[i]), float(s.cols))

    def _unit_mask(self, i: int, j: int, check_same: bool = True) -> np.ndarray:
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

    def _try_swaps(self, units, r: int, cur: float, tol: float) -> bool:
        light = np.argsort(self.L.total, kind="stable")[:4]
        for i, j in units:
            size = self._unit_deltas(i, j)[1]
            for r2 in light.tolist():
                if r2 == r or not self._unit_mask(i, j)[r2]:
                    continue
                others = [(i2, j2) for i2, ch in enumerate(self.choice) if ch is not None and GROUP_OF[ch.st] in ("tw", "cw", "twcw")
                          for j2, s in enumerate(ch.shards) if s.rank == r2 and i2 != i]
                for i2, j2 in others[:16]:
                    d2 = self._unit_deltas(i2, j2)[1]
                    if d2.fwd + d2.bwd >= size.fwd + size.bwd or not self._unit_mask(i2, j2)[r]:
                        continue
                    self._move(i, j, r2)
                    self._move(i2, j2, r)
                    ok = float(self.L.total.max()) < cur - tol and (self.L.mem <= self.cap * (1 + 1e-12)).all()
                    if ok:
                        return True
                    self._move(i2, j2, r2)
                    self._move(i, j, r)
        return False

    def build(self) -> ShardingPlan:
        tps = tuple(ch.table_plan(n) for n, ch in zip(self.t.names, self.choice))  # type: ignore[union-attr]
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


# ---- infeasibility -------------------------------------------------------------------------------

def _fmt_bytes(x: float) -> str:
    for unit, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if x >= s:
            return f"{x / s:.2f} {unit}"
    return f"{x:.0f} B"


def _explain(p: _Planner, i: int) -> tuple[str, str, list[str]]:
    """(message, table, suggestions) for table i that no allowed option could place."""
    t, o, c = p.t, p.o, p.c
    name, R, D = t.names[i], int(t.rows[i]), int(t.dims[i])
    need = float(shard_memory_bytes(R, D, p.ctx.elem_bytes, o.optimizer))
    free = float((p.cap - p.L.mem).max())
    allowed = [st.value for st in p.allowed(i)]
    lines = [
        f"table '{name}' ({R:,} rows x {D} dims, {_fmt_bytes(need)} as {o.table_dtype} weights + "
        f"{o.optimizer} state) cannot be placed: the emptiest rank has {_fmt_bytes(max(free, 0))} free of "
        f"{_fmt_bytes(p.cap)} usable per rank (after {_fmt_bytes(p.L.dense_memory)} of dense replica); "
        f"allowed types: {', '.join(allowed)}",
    ]
    sugg: list[str] = []
    row_types = {ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE}
    if need > p.cap and not row_types & set(p.allowed(i)):
        k = math.ceil(need / max(p.cap, 1))
        sugg.append(f"allow row_wise or table_row_wise for '{name}' (it needs >= {k} ranks of {_fmt_bytes(p.cap)})")
    total = {dt: float(sum(shard_memory_bytes(t.rows, t.dims, e, o.optimizer))) for dt, e in TABLE_DTYPES.items()}
    have = p.cap * p.W
    if o.table_dtype == "fp32" and total["fp16"] < 0.9 * have:
        sugg.append(f"--table-dtype fp16 (tables then need {_fmt_bytes(total['fp16'])} instead of "
                    f"{_fmt_bytes(total['fp32'])}; {_fmt_bytes(have)} is usable)")
    per_node = p.cap * p.G
    # 10% slack over the bare sum: buffers and imperfect packing
    nodes = math.ceil(1.1 * total[o.table_dtype] / max(per_node, 1))
    if nodes > p.N:
        sugg.append(f"--nodes {nodes} ({nodes * p.G} devices; tables need {_fmt_bytes(total[o.table_dtype])}, "
                    f"{p.N} nodes have {_fmt_bytes(have)} usable)")
    if o.table_dtype == "fp32":
        n16 = math.ceil(1.1 * total["fp16"] / max(per_node, 1))
        if n16 > p.N:
            sugg.append(f"--table-dtype fp16 with --nodes {n16}")
    if p.cap <= 0:
        sugg.insert(0, f"the dense replica alone ({_fmt_bytes(p.L.dense_memory)}) fills a device: a smaller MLP or larger devices")
    if not sugg:
        sugg.append("more ranks, fp16 tables, or fewer tables pinned together (memory is fragmented)")
    lines.append("smallest change that would fit: " + sugg[0])
    if len(sugg) > 1:
        lines.append("other options: " + "; ".join(sugg[1:]))
    return "\n".join(lines), name, sugg


# ---- public API ----------------------------------------------------------------------------------

def plan_sharding(
    model: ModelConfig,
    cluster: ClusterSpec,
    options: PlannerOptions | None = None,
    constraints: Mapping[str, TableConstraint] | None = None,
    *,
    strict: bool = True,
) -> PlanResult:
    """Plan ``model`` for ``cluster``. ``strict``: raise PlanningError when memory does not
    suffice; otherwise return the best plan ignoring memory for the tables that overflow, with
    ``fits=False`` and the explanation."""
    start = time.perf_counter()
    opts = options or PlannerOptions()
    p = _Planner(model, cluster, opts, constraints or {})
    explanation = ""
    try:
        p.greedy(strict=True)
    except PlanningError as e:
        if strict:
            raise
        explanation = str(e)
        p = _Planner(model, cluster, opts, constraints or {})
        p.greedy(strict=False)
    p.refine()
    plan = p.build()
    check_coverage(model, plan)
    plan.validate(model, cluster.world_size, cluster.devices_per_node)
    est = estimate(model, plan, cluster, opts.batch_size, opts.table_dtype, opts.optimizer,
                   dense_optimizer=opts.dense_optimizer, fwd_comm_dtype=opts.fwd_comm_dtype,
                   bwd_comm_dtype=opts.bwd_comm_dtype, memory_fraction=opts.memory_fraction)
    counts: dict[str, int] = {}
    for tp in plan.tables:
        counts[tp.sharding.value] = counts.get(tp.sharding.value, 0) + 1
    fits = est.fits and not explanation
    if not est.fits and not explanation:
        explanation = "the plan overflows device memory on some ranks (buffers the planner under-counted)"
    return PlanResult(plan, est, cluster, opts, fits, explanation, time.perf_counter() - start, counts)


def round_robin_plan(model: ModelConfig, world_size: int, local_world_size: int) -> ShardingPlan:
    """The naive baseline: table i whole on rank i % W (no cost model)."""
    tps = tuple(ShardingPlan.table_plan("table_wise", t.name, t.num_rows, t.dim, world_size, local_world_size, i)
                for i, t in enumerate(model.tables))
    return ShardingPlan(world_size, local_world_size, tps)


def check_coverage(model: ModelConfig, plan: ShardingPlan) -> None:
    """Every table of ``model`` appears in ``plan`` exactly once, and its shards tile all its rows
    and columns exactly once (a replica per rank for data-parallel). Raises ValueError naming
    the table."""
    names = [tp.table for tp in plan.tables]
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"table '{n}' appears more than once in the plan")
        seen.add(n)
    known = {t.name for t in model.tables}
    for n in names:
        if n not in known:
            raise ValueError(f"table '{n}' is in the plan but not in the model")
    for t in model.tables:
        if t.name not in seen:
            raise ValueError(f"table '{t.name}' is missing from the plan")
        tp = plan[t.name]
        if tp.sharding == ShardingType.DATA_PARALLEL:
            ranks = sorted(s.rank for s in tp.shards)
            full = all((s.row_start, s.row_end, s.col_start, s.col_end) == (0, t.num_rows, 0, t.dim) for s in tp.shards)
            if ranks != list(range(plan.world_size)) or not full:
                raise ValueError(f"table '{t.name}': data-parallel needs one full replica on each of ranks 0..{plan.world_size - 1}")
            continue
        _check_tiling(t.name, [(s.row_start, s.row_end, s.col_start, s.col_end) for s in tp.shards], t.num_rows, t.dim)


def _check_tiling(name: str, rects: list[tuple[int, int, int, int]], rows: int, cols: int) -> None:
    """Each cell of the grid cut by every shard edge must be covered exactly once."""
    for a, z, c0, c1 in rects:
        if not (0 <= a < z <= rows and 0 <= c0 < c1 <= cols):
            raise ValueError(f"table '{name}': shard rows [{a}, {z}) x cols [{c0}, {c1}) is empty or outside "
                             f"its {rows} rows x {cols} cols")
    rcut = np.unique([0, rows, *[x for r in rects for x in r[:2]]])
    ccut = np.unique([0, cols, *[x for r in rects for x in r[2:]]])
    count = np.zeros((len(rcut) - 1, len(ccut) - 1), dtype=np.int64)
    for a, z, c0, c1 in rects:
        i0, i1 = np.searchsorted(rcut, [a, z])
        j0, j1 = np.searchsorted(ccut, [c0, c1])
        count[i0:i1, j0:j1] += 1
    bad = np.argwhere(count != 1)
    if len(bad):
        i, j = bad[0]
        what = "not covered" if count[i, j] == 0 else f"covered {count[i, j]} times"
        raise ValueError(f"table '{name}': rows [{rcut[i]}, {rcut[i + 1]}) x cols [{ccut[j]}, {ccut[j + 1]}) are {what}")
