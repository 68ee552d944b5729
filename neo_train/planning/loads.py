"""Per-rank load accounting for the cost model: what each shard adds to each rank, kept as a few
arrays so the planner can price "put this shard there" for every rank at once.

Groups follow the sharded collection: each sharding type present is one group with its own
collectives, so TW, CW and TWCW pay separate all-to-alls even though they move data alike.

State (W ranks, N nodes):
    hbm_fwd, hbm_bwd, mem    (W,) bytes of lookup traffic, update traffic, resident memory
    inp[g]                   input all-to-all of group g: per-peer bytes owned per rank (W,),
                             their per-node sums (N,) and world total (see cost_formulas.a2a_time)
    out[g]  g in TW/CW/TWCW  output all-to-all, in elements b*D_s per peer (times the wire bytes)
    rw_width                 sum b*D*F of the RW group: every rank's reduce-scatter share
    twrw_node                (N,) sum b*D*F of each node's TWRW tables
    dp_bytes                 bytes of the DP gradient all-reduce
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..config import ModelConfig
from .cost_formulas import (
    CostContext,
    CostEstimate,
    a2a_time,
    cache_miss_bytes,
    dense_flops_per_sample,
    dense_memory_bytes,
    dense_params,
    dp_update_bytes,
    input_bytes_per_peer,
    lookup_bytes,
    ring_allreduce_time,
    shard_memory_bytes,
    update_bytes,
)
from .plan import ShardingType, TablePlan, even_splits

__all__ = ["TableArrays", "Deltas", "RankLoads", "GROUP_OF", "TYPE_OF"]

GROUP_OF = {
    ShardingType.TABLE_WISE: "tw",
    ShardingType.COLUMN_WISE: "cw",
    ShardingType.TABLE_COLUMN_WISE: "twcw",
    ShardingType.ROW_WISE: "rw",
    ShardingType.TABLE_ROW_WISE: "twrw",
    ShardingType.DATA_PARALLEL: "dp",
}
TYPE_OF = {g: st for st, g in GROUP_OF.items()}
UNIT_GROUPS = ("tw", "cw", "twcw")  # one shard = one unit on one rank; output all-to-all
ROW_GROUPS = ("rw", "twrw")


@dataclass(frozen=True)
class TableArrays:
    """The model's tables as arrays (T,): rows R, dims D, pooling factor L, features F, mean pooling."""

    names: tuple[str, ...]
    rows: np.ndarray
    dims: np.ndarray
    pooling: np.ndarray
    features: np.ndarray
    mean: np.ndarray
    cache: np.ndarray
    """Cache load factor (1: resident): device memory holds cache x rows of each shard."""
    alpha: np.ndarray
    """Power-law exponent of the ids (the hit rate of a cached table follows from it)."""

    @classmethod
    def from_model(cls, model: ModelConfig, alpha: float = 1.1) -> "TableArrays":
        ts = model.tables
        return cls(
            tuple(t.name for t in ts),
            np.array([t.num_rows for t in ts], dtype=np.float64),
            np.array([t.dim for t in ts], dtype=np.int64),
            np.array([t.pooling_factor for t in ts], dtype=np.float64),
            np.array([len(t.feature_names) for t in ts], dtype=np.float64),
            np.array([t.pooling == "mean" for t in ts]),
            np.array([1.0 if t.cache_load_factor is None else t.cache_load_factor for t in ts], dtype=np.float64),
            np.array([alpha if t.zipf_alpha is None else t.zipf_alpha for t in ts], dtype=np.float64),
        )


@dataclass(frozen=True)
class Deltas:
    """What one shard adds to its rank: input bytes per peer, output elements per peer, HBM bytes
    forward/backward, resident bytes."""

    inp: float
    out: float
    fwd: float
    bwd: float
    mem: float


class _Channel:
    """Per-peer quantities of one all-to-all: per rank (W,), per node (N,), world total."""

    def __init__(self, W: int, N: int) -> None:
        self.own = np.zeros(W)
        self.node = np.zeros(N)
        self.total = 0.0
        self.count = 0  # shards in the group (the collective runs when > 0)

    def add(self, rank: int, node: int, x: float, sign: int) -> None:
        self.own[rank] += sign * x
        self.node[node] += sign * x
        self.total += sign * x
        self.count += sign


class RankLoads:
    """Loads of every rank under a (partial) plan; ``add_*`` with sign -1 removes."""

    def __init__(self, ctx: CostContext, tables: TableArrays, model: ModelConfig) -> None:
        c = ctx.cluster
        self.ctx, self.t, self.c = ctx, tables, c
        self.W, self.G, self.N = c.world_size, c.devices_per_node, c.nodes
        self.node_of = np.arange(self.W) // self.G
        W, N = self.W, self.N
        self.hbm_fwd, self.hbm_bwd, self.mem = np.zeros(W), np.zeros(W), np.zeros(W)
        self.inp = {g: _Channel(W, N) for g in ("tw", "cw", "twcw", "rw", "twrw")}
        self.out = {g: _Channel(W, N) for g in UNIT_GROUPS}
        self.rw_width, self.twrw_node = 0.0, np.zeros(N)
        self.dp_bytes, self.dp_count = 0.0, 0
        self.weighted = {"rw": False, "twrw": False}
        b = ctx.batch_size
        # the dense part: the same on every rank
        self.dense_params = dense_params(model)
        self.dense_memory = dense_memory_bytes(model, b, ctx.dense_optimizer)
        self.dense_compute = dense_flops_per_sample(model) * b / c.device_flops
        self.dense_allreduce = ring_allreduce_time(4.0 * self.dense_params, W, c.slowest_bandwidth, c.slowest_latency)
        self._ctime = {g: np.zeros(W) for g in ("tw", "cw", "twcw", "rw", "twrw")}
        self._dp_time = 0.0
        self._deferred = False  # bulk mode: skip per-add refreshes, refresh_all() once at the end
        self._refresh_total()

    # ---- what a shard adds ----------------------------------------------------------------------
    def deltas(self, group: str, i: int, rows, cols) -> Deltas:
        """Shard(s) of table i (``rows`` x ``cols``, scalars or arrays) in ``group`` (not DP):

        TW/CW/TWCW: bags = W*b*F, ids = W*b*L*F, every id reaches the shard.
        RW/TWRW: bags = W*b*F (every bag reaches every owner), ids = W*b*L*F*R_s/R.
        Resident: the shard + buffers 2*bags*D_s*4 (pooled output and its gradient) + routed ids.
        A cached table (cache factor c < 1) keeps c x its rows on the device, and its misses cross
        the host link (``cache_miss_bytes``), priced as the HBM bytes that take as long.
        """
        ctx, t = self.ctx, self.t
        b, W, e = ctx.batch_size, self.W, ctx.elem_bytes
        F, L = float(t.features[i]), float(t.pooling[i])
        frac = rows / t.rows[i] if group in ROW_GROUPS else 1.0
        weighted = self.weighted.get(group, False)
        bags, ids = W * b * F, W * b * L * F * frac
        per_id = ctx.id_bytes + (4 if weighted else 0)
        c = float(t.cache[i])
        miss = 0.0
        if c < 1.0:
            link = self.c.hbm_bandwidth / ctx.miss_bandwidth
            miss = link * cache_miss_bytes(ids, c, t.rows[i], t.alpha[i], cols, e, ctx.optimizer)
        return Deltas(
            inp=input_bytes_per_peer(b, F, L, frac, weighted, ctx.id_bytes, ctx.length_bytes),
            out=b * cols * F,
            fwd=lookup_bytes(bags, ids, cols, e, ctx.id_bytes, weighted) + miss,
            bwd=update_bytes(bags, ids, rows, cols, e, ctx.optimizer, ctx.id_bytes),
            mem=shard_memory_bytes(np.ceil(c * rows), cols, e, ctx.optimizer) + 2 * bags * cols * 4 + ids * per_id,
        )

    def dp_deltas(self, i: int) -> tuple[float, float, float, float]:
        """(fwd, bwd, mem on every rank, all-reduce bytes) of table i replicated: lookups of the
        rank's own b bags; resident replica + (R, D+1) gradient/marks buffer + pooled buffers."""
        ctx, t = self.ctx, self.t
        b, W, e = ctx.batch_size, self.W, ctx.elem_bytes
        R, D, F, L = float(t.rows[i]), float(t.dims[i]), float(t.features[i]), float(t.pooling[i])
        fwd = float(lookup_bytes(b * F, b * L * F, D, e, ctx.id_bytes))
        bwd = float(dp_update_bytes(R, D, b * L * F, W * b * L * F, b * F, e, ctx.optimizer))
        ar = R * (D + 1) * 4
        mem = float(shard_memory_bytes(R, D, e, ctx.optimizer)) + ar + 2 * b * F * D * 4
        return fwd, bwd, mem, ar

    # ---- adding and removing ----------------------------------------------------------------------
    def add_unit(self, group: str, rank: int, d: Deltas, sign: int = 1) -> None:
        """A TW/CW/TWCW shard (or one row shard's per-rank part) on ``rank``."""
        n = int(self.node_of[rank])
        self.hbm_fwd[rank] += sign * d.fwd
        self.hbm_bwd[rank] += sign * d.bwd
        self.mem[rank] += sign * d.mem
        self.inp[group].add(rank, n, d.inp, sign)
        if group in self.out:
            self.out[group].add(rank, n, d.out, sign)
        self._refresh_group(group)

    def add_rows(self, group: str, i: int, ranks, row_ranges, sign: int = 1) -> None:
        """Row shards of table i on distinct ``ranks``: each a unit of the input all-to-all; the
        output is RW's world-wide reduce-scatter or TWRW's per-node two-stage exchange."""
        t, b, W = self.t, self.ctx.batch_size, self.W
        D, F = float(t.dims[i]), float(t.features[i])
        rk = np.asarray(ranks, dtype=np.int64)
        rr = np.asarray(row_ranges, dtype=np.float64).reshape(-1, 2)
        d = self.deltas(group, i, rr[:, 1] - rr[:, 0], D)
        self.hbm_fwd[rk] += sign * d.fwd
        self.hbm_bwd[rk] += sign * d.bwd
        self.mem[rk] += sign * d.mem
        ch = self.inp[group]
        inp = np.broadcast_to(np.asarray(d.inp, dtype=np.float64), rk.shape)
        ch.own[rk] += sign * inp
        np.add.at(ch.node, self.node_of[rk], sign * inp)
        ch.total += sign * float(inp.sum())
        ch.count += sign * len(rk)
        width = b * D * F
        partial = 2 * W * b * D * F * 4  # (W*b, D) partial sums and their gradient
        if group == "rw":
            self.rw_width += sign * width
            self.mem += sign * partial  # every rank builds the partial-sum matrix, owner or not
        else:
            node = int(self.node_of[rk[0]])
            self.twrw_node[node] += sign * width
            self.mem[self.node_of == node] += sign * partial
        self._refresh_group(group)

    def add_dp(self, i: int, sign: int = 1) -> None:
        fwd, bwd, mem, ar = self.dp_deltas(i)
        self.hbm_fwd += sign * fwd
        self.hbm_bwd += sign * bwd
        self.mem += sign * mem
        self.dp_bytes += sign * ar
        self.dp_count += sign
        c = self.c
        self._dp_time = ring_allreduce_time(self.dp_bytes, self.W, c.slowest_bandwidth, c.slowest_latency) if self.dp_count else 0.0
        self._refresh_total()

    def add_table_plan(self, i: int, tp: TablePlan, sign: int = 1) -> None:
        """Every shard of table i as the plan places it."""
        g = GROUP_OF[tp.sharding]
        if g == "dp":
            self.add_dp(i, sign)
        elif g in ROW_GROUPS:
            self.add_rows(g, i, [s.rank for s in tp.shards], [(s.row_start, s.row_end) for s in tp.shards], sign)
        else:
            rows = float(self.t.rows[i])
            for s in tp.shards:
                self.add_unit(g, s.rank, self.deltas(g, i, rows, float(s.cols)), sign)

    def set_group_weighting(self, model: ModelConfig, plan) -> None:
        """RW and TWRW groups send per-id weights for every feature when any of their tables is
        mean-pooled (row_wise.py folds the mean into weights 1/L)."""
        for g in ROW_GROUPS:
            st = TYPE_OF[g]
            self.weighted[g] = any(t.pooling == "mean" for t in model.tables if plan[t.name].sharding == st)

    # ---- times ------------------------------------------------------------------------------------
    def input_rounds(self, group: str) -> int:
        """Collectives of an input dist: one all-to-all of lengths, ids (and weights), sized from
        earlier batches' counts (``sharding.common.IdExchange``; its header and padding, a few
        per cent of the ids where counts vary, are left out of the bytes)."""
        return 1

    def group_time(self, group: str, in_own, in_node, in_total, out_own=None, out_node=None, out_total=None):
        """(W,) seconds of a group's collectives: input a2a + output a2a + its backward mirror."""
        t = a2a_time(in_own, in_node, in_total, self.c, self.input_rounds(group))
        if group in UNIT_GROUPS:
            # a2a_time is linear in the bytes (plus a latency): the forward and the backward
            # mirror together cost (fwd_bytes + bwd_bytes) per element and two latencies
            wire = self.ctx.fwd_bytes + self.ctx.bwd_bytes
            t = t + a2a_time(out_own * wire, out_node * wire, out_total * wire, self.c, 2)
        return t

    def _rw_out_time(self, width: float, wire: int) -> float:
        """RW output (reduce-scatter as an all-to-all): every rank exchanges b*D with every peer."""
        if self.W == 1:
            return 0.0
        w = width * wire
        return float(a2a_time(w, self.G * w, self.W * w, self.c, 1))

    def _twrw_out_time(self, node_width: np.ndarray, wire: int) -> np.ndarray:
        """TWRW output on each rank of node n (node_width (N,) elements b*D per peer):

            intra reduce-scatter: (G-1)*N*node_width[n]*wire / B_intra + alpha_intra
            cross all-to-all:     max((N-1)*node_width[n], sum - node_width[n])*wire / B_inter + alpha_inter
        """
        c, G, N = self.c, self.G, self.N
        w = node_width * wire
        t = np.zeros(N)
        if G > 1:
            t = t + (G - 1) * N * w / c.intra_node_bandwidth + c.intra_node_latency
        if N > 1:
            t = t + np.maximum((N - 1) * w, w.sum() - w) / c.inter_node_bandwidth_per_device + c.inter_node_latency
        return t[self.node_of]

    @contextmanager
    def bulk(self) -> Iterator[None]:
        """Many adds at once: per-rank times are refreshed once, at the end."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False
            for g in self._ctime:
                self._refresh_group(g)

    def _refresh_group(self, g: str) -> None:
        if self._deferred:
            return
        ch = self.inp[g]
        if ch.count <= 0 and not (g == "rw" and self.rw_width > 0) and not (g == "twrw" and self.twrw_node.any()):
            self._ctime[g] = np.zeros(self.W)
        else:
            nd = self.node_of
            if g in self.out:
                o = self.out[g]
                self._ctime[g] = self.group_time(g, ch.own, ch.node[nd], ch.total, o.own, o.node[nd], o.total)
            else:
                t = self.group_time(g, ch.own, ch.node[nd], ch.total)
                for wire in (self.ctx.fwd_bytes, self.ctx.bwd_bytes):
                    t = t + (self._rw_out_time(self.rw_width, wire) if g == "rw" else self._twrw_out_time(self.twrw_node, wire))
                self._ctime[g] = t
        self._refresh_total()

    def _refresh_total(self) -> None:
        if self._deferred:
            return
        hbm = (self.hbm_fwd + self.hbm_bwd) / self.c.hbm_bandwidth
        self.total = hbm + sum(self._ctime.values()) + self._dp_time + self.dense_compute + self.dense_allreduce

    def phases(self) -> dict[str, np.ndarray]:
        """(W,) seconds per phase (the PHASES of cost_formulas)."""
        c, W, nd = self.c, self.W, self.node_of
        inp = np.zeros(W)
        for g, ch in self.inp.items():
            if ch.count > 0:
                inp = inp + a2a_time(ch.own, ch.node[nd], ch.total, c, self.input_rounds(g))
        out = {}
        for key, wire in (("output_a2a", self.ctx.fwd_bytes), ("backward_exchange", self.ctx.bwd_bytes)):
            t = np.zeros(W)
            for g, o in self.out.items():
                if o.count > 0:
                    t = t + a2a_time(o.own * wire, o.node[nd] * wire, o.total * wire, c, 1)
            if self.rw_width > 0:
                t = t + self._rw_out_time(self.rw_width, wire)
            if self.twrw_node.any():
                t = t + self._twrw_out_time(self.twrw_node, wire)
            out[key] = t
        return {
            "lookup": self.hbm_fwd / c.hbm_bandwidth,
            "input_a2a": inp,
            "output_a2a": out["output_a2a"],
            "backward_exchange": out["backward_exchange"],
            "fused_update": self.hbm_bwd / c.hbm_bandwidth,
            "dp_allreduce": np.full(W, self._dp_time),
            "dense_compute": np.full(W, self.dense_compute),
            "dense_allreduce": np.full(W, self.dense_allreduce),
        }

    def capacity(self, memory_fraction: float = 1.0) -> float:
        """Usable bytes per rank for tables and buffers (the dense replica already subtracted)."""
        return self.c.device_memory_bytes * memory_fraction - self.dense_memory

    def estimate(self, memory_fraction: float = 1.0) -> CostEstimate:
        return CostEstimate(
            phases=self.phases(),
            memory=self.mem + self.dense_memory,
            capacity=self.c.device_memory_bytes * memory_fraction,
            dense_memory=self.dense_memory,
            extras={"dense_params": float(self.dense_params), "dp_allreduce_bytes": self.dp_bytes},
        )

    # ---- what-if, for every rank at once (the planner's inner loop) -----------------------------
    def trial_unit(self, group: str, d: Deltas) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Put a shard with deltas ``d`` on each candidate rank o in turn: returns (W,) arrays
        (max over ranks afterwards, sum over ranks of the time added, o's own time afterwards).

        Only three cases exist for a rank r: r is the owner (A), r shares the owner's node (B),
        r is elsewhere (C); so the max for owner o is max(A[o], max_{r in node(o), r != o} B[r],
        max_{r not in node(o)} C[r]), computed from per-node top-2 maxima in O(W).
        """
        ch, nd = self.inp[group], self.node_of
        o = self.out[group]
        base = self.total - self._ctime[group]
        hbm = (d.fwd + d.bwd) / self.c.hbm_bandwidth
        i_own, i_node, o_own, o_node = ch.own, ch.node[nd], o.own, o.node[nd]
        A = base + hbm + self.group_time(group, i_own + d.inp, i_node + d.inp, ch.total + d.inp,
                                         o_own + d.out, o_node + d.out, o.total + d.out)
        B = base + self.group_time(group, i_own, i_node + d.inp, ch.total + d.inp, o_own, o_node + d.out, o.total + d.out)
        C = base + self.group_time(group, i_own, i_node, ch.total + d.inp, o_own, o_node, o.total + d.out)
        G, N = self.G, self.N
        Bm = _max_excluding_self(B.reshape(N, G)).reshape(-1) if G > 1 else np.full(self.W, -np.inf)
        Cn = C.reshape(N, G).max(axis=1)
        Cm = _max_excluding_self(Cn[None, :])[0][nd] if N > 1 else np.full(self.W, -np.inf)
        max_after = np.maximum(A, np.maximum(Bm, Cm))
        dA, dB, dC = A - self.total, B - self.total, C - self.total
        sB = dB.reshape(N, G).sum(axis=1)[nd] - dB
        sC = dC.sum() - dC.reshape(N, G).sum(axis=1)[nd]
        return max_after, dA + sB + sC, A

    def trial_total(self, apply, undo) -> np.ndarray:
        """(W,) totals after ``apply()`` (then ``undo()``): for options that touch many ranks."""
        apply()
        out = self.total.copy()
        undo()
        return out


def _max_excluding_self(x: np.ndarray) -> np.ndarray:
    """For x (N, G): out[n, g] = max over g' != g of x[n, g'] (top-2 per row)."""
    G = x.shape[1]
    if G == 1:
        return np.full_like(x, -np.inf)
    top = np.argmax(x, axis=1)
    first = x[np.arange(x.shape[0]), top]
    y = x.copy()
    y[np.arange(x.shape[0]), top] = -np.inf
    second = y.max(axis=1)
    out = np.repeat(first[:, None], G, axis=1)
    out[np.arange(x.shape[0]), top] = second
    return out


def row_ranges(rows: int, k: int) -> list[tuple[int, int]]:
    """The contiguous row pieces of ``ShardingPlan.table_plan`` (k capped at rows)."""
    return even_splits(rows, max(1, min(k, rows)))
