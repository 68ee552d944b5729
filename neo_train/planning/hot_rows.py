"""Choosing k for hot-row replication (issue 13 item 4): which tables may replicate hot rows
(``hot_row_refusal``), the expected coverage, touched rows and gradient-sync bytes under the
synthetic generator's power law, and ``choose_hot_rows``, the per-table k that saves the most
step time on the job's cluster (all-to-all time saved, net of the replicas' sync, their extra
memory traffic and the hot-set switches), or the most all-to-all bytes where no cluster is given
(``--hot-rows auto``; ``neo-train plan --hot-rows`` prints it). The profiler that finds the hot
rows at run time is ``sharding/hot_rows.py``; the split itself is ``sharding/collection.py``;
notes/hot_rows.md has the argument.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import TableConfig, cache_factor
from ..data.synthetic import EMPTY_BAG_SHARE
from .plan import ShardingType

__all__ = ["HotRowChoice", "choose_hot_rows", "zipf_coverage", "hot_row_refusal", "HOT_SHARDINGS", "all_hot_fraction",
           "SPARSE_OUTPUT_SHARDINGS", "expected_touched_rows", "replica_sync_bytes", "replica_work_bytes",
           "exchange_seconds", "REPLICA_ROUNDS"]

HOT_SHARDINGS = (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)  # what the replication supports


def hot_row_refusal(table: TableConfig, table_plan: Any, storage: Any) -> str:
    """Why ``table`` cannot have hot-row replication under its plan, '' when it can: the one rule
    both the sharded collection (which refuses, naming the table) and ``choose_hot_rows`` (which
    passes over the table) apply."""
    if table_plan.sharding not in HOT_SHARDINGS:
        return (f"table '{table.name}' is {table_plan.sharding.value}; hot-row replication supports "
                f"{', '.join(x.value for x in HOT_SHARDINGS)} tables")  # fmt: skip
    if table.pooling != "sum":
        return f"table '{table.name}' uses {table.pooling} pooling; hot-row replication needs sum pooling"
    if cache_factor(table, storage, table_plan.cache_load_factor) < 1:
        return f"table '{table.name}' is cached (cache_load_factor < 1); replicate hot rows of resident tables"
    return ""


# the k auto tries: powers of two and the half-octaves between them (1, 2, 3, 4, 6, 8, 12, .. 1M
# rows): the net saving is flat near its peak, and a power-of-two grid can miss it by a factor ~1.4
_K_CANDIDATES = tuple(sorted({1 << i for i in range(21)} | {3 << i for i in range(20)}))


def zipf_coverage(k: int, rows: int, alpha: float) -> float:
    """Fraction of lookups the k most popular of ``rows`` rows take under the synthetic
    generator's power law (``neo_train.data.synthetic.power_law_ids``: popularity rank
    floor(x), x drawn with density ~ x^-alpha on [1, rows]): P(x < k + 1) =
    ((k+1)^(1-alpha) - 1) / (rows^(1-alpha) - 1), ln(k+1) / ln(rows) at alpha = 1, k / rows at 0."""
    if k <= 0:
        return 0.0
    if k >= rows:
        return 1.0
    if alpha == 0:
        return k / rows
    if abs(alpha - 1.0) < 1e-9:
        return min(1.0, math.log(k + 1) / math.log(rows))
    e = 1.0 - alpha
    return min(1.0, ((k + 1) ** e - 1.0) / (rows**e - 1.0))


def all_hot_fraction(coverage: float, pooling_factor: float) -> float:
    """Expected fraction of a feature's bags with no cold id (every id hot, or empty) when a
    fraction ``coverage`` of its ids is hot: E[c^n] over the bag lengths n of the synthetic
    generator (``neo_train.data.synthetic.bag_lengths``): for L >= 1, 5 % empty and 1 +
    Poisson(lam), lam = L / 0.95 - 1 -> 0.05 + 0.95 c exp(-lam (1 - c)); for L < 1, empty with
    probability 1 - L, one id otherwise -> 1 - L + L c. (Ids drawn independently, so a bag's ids are
    hot independently: c^n for n ids.) One-hot features (L = 1): 0.05 + 0.95 c; L = 20: ~c^20."""
    c = min(max(float(coverage), 0.0), 1.0)
    L, e = float(pooling_factor), EMPTY_BAG_SHARE
    if L < 1.0:
        return 1.0 - L + L * c
    lam = max(L / (1.0 - e) - 1.0, 0.0)
    return e + (1.0 - e) * c * math.exp(-lam * (1.0 - c))


@functools.lru_cache(maxsize=64)
def _touched_cumulative(rows: int, alpha: float, ids: float, kmax: int) -> np.ndarray:
    """(kmax,) E[distinct rows among the r most popular touched by ``ids`` draws], r = 1..kmax."""
    r = np.arange(kmax + 1, dtype=np.float64)
    if alpha == 0:
        cov = r / rows
    elif abs(alpha - 1.0) < 1e-9:
        cov = np.log(r + 1.0) / math.log(rows)
    else:
        e = 1.0 - alpha
        cov = ((r + 1.0) ** e - 1.0) / (rows**e - 1.0)
    p = np.clip(np.diff(np.minimum(cov, 1.0)), 0.0, 1.0)  # p[r-1]: the r-th most popular row's share
    return np.cumsum(-np.expm1(ids * np.log1p(-np.minimum(p, 1.0 - 1e-16))))


def expected_touched_rows(k: int, rows: int, alpha: float, ids: float) -> float:
    """Expected distinct rows among the k most popular of ``rows`` that ``ids`` independent draws
    of the synthetic generator's power law touch (a rank's hot rows in one step, ids = b L F):
    sum over r <= k of 1 - (1 - p_r)^ids, p_r = zipf_coverage(r) - zipf_coverage(r - 1)."""
    k = min(int(k), rows)
    if k <= 0 or ids <= 0:
        return 0.0
    # one cached prefix per (table, ids) that covers every k auto tries
    kmax = max(k, min(int(rows), _K_CANDIDATES[-1]))
    return float(_touched_cumulative(int(rows), float(alpha), float(ids), kmax)[k - 1])


def replica_sync_bytes(k: int, dim: int, touched: float, world_size: int) -> tuple[float, float]:
    """Wire bytes per rank and step of a (k, dim) replica's gradient sync, both ways
    (``sharding/data_parallel.py``): (dense, sparse).

        dense   ring all-reduce of the (k, D) gradients + k touched marks: 2 (W - 1) / W * 4 k (D + 1)
        sparse  all-gather of each rank's touched rows, a row as D float32 values + a 4-byte id:
                (W - 1) * touched * 4 (D + 1)   (touched: the rows one rank touches in a step)
    The group takes the cheaper each step, for all its tables at once and with the largest rank's
    count (the (W, T) touched-row counts it decides by, all-gathered before a sparse step or
    carried in a dense step's all-reduce, are left out here)."""
    remote = world_size - 1
    return 2 * remote / world_size * 4 * k * (dim + 1), remote * touched * 4 * (dim + 1)


def replica_work_bytes(k_touched_all: float, touched: float, dim: int, optimizer: str, world_size: int) -> float:
    """Memory bytes per rank and step that a table's replicas add to the work they replace
    (``sharding/data_parallel.py``), ``k_touched_all`` = the hot rows any rank touches in the
    step (the replay's rows), ``touched`` = those one rank touches:

        replay    lookup_bytes(U, U, D) + update_bytes(U, U, U, D)    every rank runs the fused
                  kernel's forward over the U summed rows (the update needs its autograd node)
                  and its fused update
        - owner   U * 2 (D * 4 + state) / W                        the update the owner of those
                  rows ran alone without replication (a rank's share of it)
        + sums    (W - 1) * u * 3 * D * 4                          the peers' gathered rows added
                  into the replay's gradient (read the row, read and write the sum)

    A rank's own hot ids' gradients are summed where the owner would have gathered them: no
    change; the replicas' lookup pools the all-hot bags the cold lookup no longer does: no change
    to first order (notes/hot_rows.md, "Choosing k")."""
    from .cost_formulas import lookup_bytes, state_bytes_per_row, update_bytes

    U, W = float(k_touched_all), world_size
    state = state_bytes_per_row(dim, optimizer)
    replay = lookup_bytes(U, U, dim, 4) + update_bytes(U, U, U, dim, 4, optimizer)
    owner = U * 2 * (dim * 4 + state) / W
    return float(replay - owner + (W - 1) * touched * 3 * dim * 4)


def exchange_seconds(nbytes: float, cluster: Any) -> float:
    """Seconds to send ``nbytes`` from one rank, spread evenly over its W - 1 peers, every rank
    sending at once (an all-to-all or all-gather): ``cost_formulas.a2a_time`` of that symmetric
    exchange, its latency left out (the peers in its node over the intra-node link, the others
    over its share of the NIC, the two in parallel)."""
    from .cost_formulas import a2a_time

    W, G = cluster.world_size, cluster.devices_per_node
    if W <= 1 or nbytes <= 0:
        return 0.0
    per_peer = nbytes / (W - 1)  # every rank alike: its node sends G x that, the world W x
    return float(a2a_time(per_peer, G * per_peer, W * per_peer, cluster, rounds=0))


REPLICA_ROUNDS = 2  # collectives a step of replication adds: the touched-row counts, then the rows (or one all-reduce)


@dataclass(frozen=True)
class HotRowChoice:
    """k hot rows of one table and what they are expected to save, in bytes per step per rank."""

    table: str
    k: int
    coverage: float  # fraction of the table's lookups the k rows take
    saved_bytes: float  # all-to-all bytes no longer sent: input dist + output exchange (both ways)
    added_bytes: float  # the replicas' gradient sync: the cheaper of the dense and sparse exchange
    memory_bytes: float  # replica rows + optimizer state on every rank
    saved_input_bytes: float = 0.0  # of saved_bytes: ids that stay local
    saved_output_bytes: float = 0.0  # of saved_bytes: pooled rows (and gradients) of bags with no cold id
    skip_fraction: float = 0.0  # the bags that skip the output exchange (table-wise only, else 0)
    touched_rows: float = 0.0  # expected hot rows one rank touches in a step
    sync: str = "dense"  # the gradient exchange expected to be cheaper: "dense" or "sparse"
    # priced on a cluster (choose_hot_rows(..., cluster)), seconds per step and rank; 0 without one
    saved_s: float = 0.0  # the all-to-all time of saved_bytes
    sync_s: float = 0.0  # the replicas' gradient sync
    work_s: float = 0.0  # the replicas' extra memory traffic (replica_work_bytes) at the device's bandwidth
    switch_s: float = 0.0  # a hot-set switch (all-reduce of k rows + state), spread over its window

    @property
    def net_bytes(self) -> float:
        return self.saved_bytes - self.added_bytes

    @property
    def net_s(self) -> float:
        return self.saved_s - self.sync_s - self.work_s - self.switch_s


# the plans whose output exchange is an all-to-all of pooled rows per bag, which skips the bags
# with no cold id (table_wise.py); row-wise's reduce-scatter and table-row-wise's
# reduce-scatter + all-to-all stay dense (a row shard's owner does not know a bag's whole cold length)
SPARSE_OUTPUT_SHARDINGS = (ShardingType.TABLE_WISE,)


def choose_hot_rows(cfg: Any, plan: Any, world_size: int, setting: str | int, cluster: Any = None) -> dict[str, HotRowChoice]:
    """Per eligible table (table-wise / row-wise / table-row-wise plan, sum pooling, resident),
    the hot rows to replicate: ``setting`` "off" -> none; an integer K -> K rows of every
    eligible table with more than K rows; "auto" -> the k (a power of two, or 3 times one) with the largest net
    saving, none where no k saves anything. ``cluster`` (``topology.networks.job_cluster``: what the
    trainer and ``neo-train plan`` pass) prices the saving in seconds, and ``auto`` maximises
    that; without one it maximises bytes. Per step and rank (b local samples, L ids per bag,
    c(k) = zipf_coverage with the table's exponent, W ranks, D the dim, F_t the table's features):

        saved_in  = c(k) * b * L * F_t * 8 * (W - 1) / W                     ids that stay local
        saved_out = s(k) * b * F_t * D * (v_fwd + v_bwd) * (W - 1) / W       table-wise only: the
                    pooled rows and gradients of bags with no cold id, s(k) = all_hot_fraction(c(k), L)
                    (E[c^n]: ~ c for one-hot features, ~ c^L for multi-hot ones; it counts the
                    empty bags too, which also skip), v = bytes per value of the pooled exchange's
                    codecs (dist.forward_comm_dtype / backward_comm_dtype; row scales left out)
        added     = min(dense, sparse): the replicas' gradient sync (replica_sync_bytes)
                    dense  = 2 * (W - 1) / W * 4 * k * (D + 1)               ring all-reduce of the
                                                                             (k, D) gradients + marks
                    sparse = (W - 1) * u(k) * 4 * (D + 1)                    all-gather of the touched
                    rows (D values + an int32 id each), u(k) = expected_touched_rows(k, R, a, b L F):
                    the distinct hot rows one rank's b L F ids touch
        memory    = k * (D * 4 + state) on every rank

    Row-wise and table-row-wise tables' pooled exchanges stay dense (saved_out = 0).

    On a cluster (seconds; B_x = exchange_seconds: the rank's bytes over its links, HOT the
    device's memory bandwidth times its hot_set_speedup (the replicas are a small working set
    that stays in cache), T the window, u_all = expected_touched_rows(k, R, a, W b L F)):

        saved_s   = B_x(saved_in + saved_out)
        sync_s    = B_x(sparse) or the ring all-reduce of the dense one, as the bytes chose
        work_s    = replica_work_bytes(u_all, u(k), D) / HOT      the replay every rank runs
        switch_s  = ring all-reduce of k (D * 4 + state) / T      an upper bound: every row of
                    the hot set changes at a switch (at k = 8192, T = 10 on one-hot Zipf 1.05
                    tables 62 % do; fewer at small k, whose rows stay the most popular)

    and replication is on only where the tables' net seconds together exceed the latency of the
    REPLICA_ROUNDS collectives a replicated step adds. The bytes alone favour large k wherever a
    touched row's sync costs less than the pooled rows it keeps local; the replicas' per-row
    work and the switches stop that where memory is slow or the window short (a CPU host).
    notes/hot_rows.md has the rest of the argument."""
    from .cost_formulas import COMM_DTYPES, ring_allreduce_time
    from .cost_model import state_bytes_per_row

    if str(setting) == "off" or world_size < 2:
        return {}
    if cluster is not None and cluster.world_size != world_size:
        raise ValueError(f"choose_hot_rows: the cluster has {cluster.world_size} devices, the job {world_size} ranks")
    fixed = None if str(setting) == "auto" else int(setting)
    W, b = world_size, cfg.train.batch_size
    dist = getattr(cfg, "dist", None)
    window = max(1, int(getattr(dist, "hot_rows_window", 1) or 1))
    v_fwd = COMM_DTYPES.get(getattr(dist, "forward_comm_dtype", "fp32") or "fp32", 4)
    v_bwd = COMM_DTYPES.get(getattr(dist, "backward_comm_dtype", "fp32") or "fp32", 4)
    out: dict[str, HotRowChoice] = {}
    for t in cfg.model.tables:
        if t.num_rows < 2 or hot_row_refusal(t, plan[t.name], cfg.storage):
            continue
        alpha = t.zipf_alpha if t.zipf_alpha is not None else cfg.data.zipf_alpha
        F = len(t.feature_names)
        ids = b * t.pooling_factor * F
        per_id = 8  # an int64 id (weighted features add 4 B of weight: not modelled)
        row_state = state_bytes_per_row(t.dim, cfg.train.sparse_optimizer)
        sparse_out = plan[t.name].sharding in SPARSE_OUTPUT_SHARDINGS
        remote = (W - 1) / W

        def choice(k: int) -> HotRowChoice:
            c = zipf_coverage(k, t.num_rows, alpha)
            s = all_hot_fraction(c, t.pooling_factor) if sparse_out else 0.0
            saved_in = c * ids * per_id * remote
            saved_out = s * b * F * t.dim * (v_fwd + v_bwd) * remote
            u = expected_touched_rows(k, t.num_rows, alpha, ids)
            dense, sparse = replica_sync_bytes(k, t.dim, u, W)
            timed = {}
            if cluster is not None:
                bw, lat = cluster.slowest_bandwidth, cluster.slowest_latency
                hot_bw = cluster.hbm_bandwidth * cluster.hot_set_speedup  # the replicas stay in cache
                u_all = expected_touched_rows(k, t.num_rows, alpha, W * ids)
                timed = dict(
                    saved_s=exchange_seconds(saved_in + saved_out, cluster),
                    sync_s=exchange_seconds(sparse, cluster) if sparse <= dense else ring_allreduce_time(4 * k * (t.dim + 1), W, bw, 0.0),
                    work_s=replica_work_bytes(u_all, u, t.dim, cfg.train.sparse_optimizer, W) / hot_bw,
                    switch_s=ring_allreduce_time(k * (t.dim * 4 + row_state), W, bw, lat) / window)  # fmt: skip
            return HotRowChoice(t.name, k, c, saved_in + saved_out, min(dense, sparse), k * (t.dim * 4 + row_state),
                                saved_in, saved_out, s, u, "sparse" if sparse <= dense else "dense", **timed)  # fmt: skip

        if fixed is not None:
            if 1 <= fixed < t.num_rows:
                out[t.name] = choice(fixed)
            continue
        net = (lambda c: c.net_bytes) if cluster is None else (lambda c: c.net_s)
        best = max((choice(k) for k in _K_CANDIDATES if k < t.num_rows), key=net, default=None)
        if best is not None and net(best) > 0:
            out[t.name] = best
    if fixed is None and cluster is not None and sum(c.net_s for c in out.values()) <= REPLICA_ROUNDS * cluster.slowest_latency:
        return {}  # what the tables save does not pay for the collectives replication adds to every step
    return out
