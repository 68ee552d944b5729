"""The cost model's formulas: the context of a pricing (``CostContext``), per-shard byte counts,
collective times, the dense part, and a priced plan (``CostEstimate``). ``cost_model``'s docstring
says what they price, what they assume and the shape letters; ``loads.RankLoads`` adds them up
per rank, and ``cost_model`` re-exports every name here beside ``estimate``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import ModelConfig, SPARSE_OPTIMIZERS
from ..topology.spec import ClusterSpec

__all__ = [
    "CostContext",
    "PHASES",
    "EMBEDDING_PHASES",
    "TABLE_DTYPES",
    "COMM_DTYPES",
    "state_bytes_per_row",
    "shard_memory_bytes",
    "cache_hit_rate",
    "cache_miss_bytes",
    "lookup_bytes",
    "update_bytes",
    "dp_update_bytes",
    "input_bytes_per_peer",
    "a2a_time",
    "ring_allreduce_time",
    "dense_params",
    "dense_flops_per_sample",
    "dense_memory_bytes",
    "CostEstimate",
]

TABLE_DTYPES = {"fp32": 4, "fp16": 2}
# bytes per value on the wire; the row-scaled codecs' 4 (fp8) or 8 (int8) bytes of scale per row
# are left out (1/16 or 1/8 more at D = 64)
COMM_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
PHASES = (
    "lookup", "input_a2a", "output_a2a", "backward_exchange", "fused_update",
    "dp_allreduce", "dense_compute", "dense_allreduce",
)  # fmt: skip
EMBEDDING_PHASES = ("lookup", "input_a2a", "output_a2a", "backward_exchange", "fused_update")
"""The phases a plan changes from rank to rank (the rest cost every rank the same)."""


@dataclass(frozen=True)
class CostContext:
    """Everything the formulas need besides the tables and the plan."""

    cluster: ClusterSpec
    batch_size: int
    """b, samples per rank per step."""
    table_dtype: str = "fp32"
    """Embedding weights: 'fp32' (4 bytes) or 'fp16' (2 bytes); optimizer state stays fp32."""
    optimizer: str = "rowwise_adagrad"
    """The fused sparse optimizer (sets the state bytes per row)."""
    dense_optimizer: str = "adagrad"
    """The dense optimizer (sets the dense state bytes)."""
    fwd_comm_dtype: str = "fp32"
    """Wire format of pooled embeddings in the output dist."""
    bwd_comm_dtype: str = "fp32"
    """Wire format of their gradients in the backward."""
    id_bytes: int = 8
    length_bytes: int = 4
    ssd: bool = False
    """Cached tables' backing store is the SSD tier (misses at ``ssd_bandwidth``, shared by a
    node's devices) rather than host memory (at ``host_link_bandwidth`` per device)."""

    @property
    def miss_bandwidth(self) -> float:
        """Bytes/s one device's cache misses move between its cache and the backing store."""
        c = self.cluster
        return c.ssd_bandwidth / c.devices_per_node if self.ssd else c.host_link_bandwidth

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.table_dtype not in TABLE_DTYPES:
            raise ValueError(f"table_dtype must be one of {sorted(TABLE_DTYPES)}, got {self.table_dtype!r}")
        if self.optimizer not in SPARSE_OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {SPARSE_OPTIMIZERS}, got {self.optimizer!r}")
        for k in ("fwd_comm_dtype", "bwd_comm_dtype"):
            if getattr(self, k) not in COMM_DTYPES:
                raise ValueError(f"{k} must be one of {sorted(COMM_DTYPES)}, got {getattr(self, k)!r}")

    @property
    def elem_bytes(self) -> int:
        return TABLE_DTYPES[self.table_dtype]

    @property
    def fwd_bytes(self) -> int:
        return COMM_DTYPES[self.fwd_comm_dtype]

    @property
    def bwd_bytes(self) -> int:
        return COMM_DTYPES[self.bwd_comm_dtype]


# ---- per-shard formulas (scalars or numpy arrays alike) ------------------------------------------

def state_bytes_per_row(cols: Any, optimizer: str) -> Any:
    """Optimizer state of one row of a shard with ``cols`` columns, fp32:

        sgd 0;  rowwise_adagrad 4 (one float per row, per column shard);
        adagrad 4*D_s;  adam 8*D_s (two moments)
    """
    if optimizer == "sgd":
        return 0 * cols
    if optimizer == "rowwise_adagrad":
        return 4 + 0 * cols
    if optimizer == "adagrad":
        return 4 * cols
    if optimizer == "adam":
        return 8 * cols
    raise ValueError(f"unknown sparse optimizer {optimizer!r}")


def shard_memory_bytes(rows: Any, cols: Any, elem_bytes: int, optimizer: str) -> Any:
    """Resident bytes of a shard: weights + optimizer state = R_s*D_s*e + R_s*state_bytes_per_row."""
    return rows * cols * elem_bytes + rows * state_bytes_per_row(cols, optimizer)


def cache_hit_rate(fraction: Any, rows: Any, alpha: Any) -> Any:
    """Expected share of a table's lookups that hit a cache of ``fraction`` x ``rows`` rows
    holding the hottest rows, when ids follow the synthetic power law P(rank k) ~ k^-alpha
    (data/synthetic.py draws ranks by inverting its continuous CDF): the CDF at K = fraction*R,

        alpha = 1:  ln K / ln R          else:  (K^(1-alpha) - 1) / (R^(1-alpha) - 1)

    It is the ideal frequency-ordered cache, so an upper bound: measured per-id steady-state hit
    rates of kernels/cache.py on the synthetic law (20k rows, 2k ids a step, alpha 0.8 / 1.05 /
    1.2, cache 10-50 %) are 0.02-0.06 below it for LFU and 0.03-0.13 below for LRU
    (tests/test_cache_model.py holds LFU within 0.06)."""
    f = np.clip(np.asarray(fraction, dtype=np.float64), 0.0, 1.0)
    R = np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
    a = np.asarray(alpha, dtype=np.float64)
    K = np.maximum(f * R, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.log(K) / np.log(np.maximum(R, 2.0))
        e = 1.0 - a
        other = (K ** e - 1.0) / (R ** e - 1.0)
    h = np.where(np.abs(a - 1.0) < 1e-9, one, np.where(a == 0, K / R, other))
    return np.where(f >= 1.0, 1.0, np.clip(np.nan_to_num(h, nan=1.0), 0.0, 1.0))


def cache_miss_bytes(ids: Any, fraction: Any, rows: Any, alpha: Any, cols: Any, elem_bytes: int, optimizer: str) -> Any:
    """Host-link bytes per step of a cached shard looking up ``ids`` ids: every miss fetches a
    row (weights + optimizer state) and, the cache being write-back and every trained row dirty,
    writes one back: ids * (1 - hit) * 2 * row bytes (an upper bound: repeated ids miss once)."""
    miss = 1.0 - cache_hit_rate(fraction, rows, alpha)
    return ids * miss * 2.0 * (cols * elem_bytes + state_bytes_per_row(cols, optimizer))


def lookup_bytes(bags: Any, ids: Any, cols: Any, elem_bytes: int, id_bytes: int = 8, weighted: Any = False) -> Any:
    """HBM bytes of one shard's forward lookup over ``bags`` bags holding ``ids`` ids:

        ids*id_bytes            read the ids
      + (bags+1)*8              read the offsets
      + ids*D_s*e               gather one row per id
      + bags*D_s*4              write the pooled fp32 output
      + ids*4 [weighted]        read per-id weights (row-wise mean pooling)
    """
    return ids * id_bytes + (bags + 1) * 8 + ids * cols * elem_bytes + bags * cols * 4 + np.where(weighted, ids * 4, 0)


def update_bytes(bags: Any, ids: Any, rows: Any, cols: Any, elem_bytes: int, optimizer: str, id_bytes: int = 8) -> Any:
    """HBM bytes of one shard's fused backward + optimizer (no gradient tensor is materialised):

        bags*D_s*4              read the pooled gradient
      + ids*(id_bytes + D_s*4)  read the ids again, gather each id's bag gradient
      + U*2*D_s*e               read + write the touched rows' weights
      + U*2*state             read + write their optimizer state
    with U = min(ids, R_s) touched rows (an upper bound; repeated ids touch fewer).
    """
    touched = np.minimum(ids, rows)
    return bags * cols * 4 + ids * (id_bytes + cols * 4) + touched * (2 * cols * elem_bytes + 2 * state_bytes_per_row(cols, optimizer))


def dp_update_bytes(rows: Any, cols: Any, local_ids: Any, global_ids: Any, local_bags: Any, elem_bytes: int, optimizer: str) -> Any:
    """HBM bytes of a data-parallel table's backward on every rank (data_parallel.py):

        R*(D+1)*4                 zero the (R, D) gradient buffer and (R,) marks
      + bags*D*4 + ids*D*4*2      read the local pooled gradient, index_add each id's row (read+write)
      + U*D*4                     read the summed gradient of the touched rows (replay)
      + U*2*(D*e + state)         fused update of the globally touched rows, U = min(W*b*L*F, R)
    """
    touched = np.minimum(global_ids, rows)
    state = state_bytes_per_row(cols, optimizer)
    return rows * (cols + 1) * 4 + local_bags * cols * 4 + local_ids * cols * 8 + touched * cols * 4 + touched * 2 * (cols * elem_bytes + state)


def input_bytes_per_peer(b: int, features: Any, pooling: Any, id_fraction: Any = 1.0, weighted: Any = False,
                         id_bytes: int = 8, length_bytes: int = 4) -> Any:
    """Bytes one source sends one owner unit in the input dist:

        F*(b*length_bytes + b*L*f*(id_bytes [+4 weighted]))
    f is the fraction of the table's ids that land on this unit (1 for TW/CW; R_s/R for row shards,
    which still get every bag's length).
    """
    per_id = id_bytes + np.where(weighted, 4, 0)
    return features * (b * length_bytes + b * pooling * id_fraction * per_id)


def a2a_time(own: Any, node_sum: Any, total: Any, cluster: ClusterSpec, rounds: int = 1) -> Any:
    """Seconds of one all-to-all on each rank, given per-peer bytes.

    ``own``: bytes this rank exchanges with *each* other rank for the units it owns (it sends
    them to, or receives them from, all W-1 peers); ``node_sum``: the sum of ``own`` over this
    rank's node; ``total``: the sum over all ranks. Then, with G devices per node,

        sent_intra  = (G-1)*own              recv_intra  = node_sum - own
        sent_inter  = (W-G)*own              recv_inter  = total - node_sum
        t = max(max(sent_intra, recv_intra)/B_intra, max(sent_inter, recv_inter)/B_inter)
            + rounds*alpha

    (sent and received swap roles for the input dist, where owners receive: max() is symmetric).
    Links are full duplex and the two link classes run in parallel; B_inter is the NIC's share per
    device; alpha the latency of the slowest link class used.
    """
    c = cluster
    G, W = c.devices_per_node, c.world_size
    t_intra = np.maximum((G - 1) * own, node_sum - own) / c.intra_node_bandwidth
    t_inter = np.maximum((W - G) * own, total - node_sum) / c.inter_node_bandwidth_per_device
    return np.maximum(t_intra, t_inter) + (rounds * c.slowest_latency if W > 1 else 0.0)


def ring_allreduce_time(nbytes: float, world: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``world`` ranks: 2(W-1)/W * n / B + 2(W-1)*alpha."""
    if world <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (world - 1) / world * nbytes / bandwidth + 2 * (world - 1) * latency


# ---- the dense part ------------------------------------------------------------------------------

def _mlp_layers(model: ModelConfig) -> list[tuple[int, int]]:
    """(in, out) of every Linear: bottom MLP, top MLP and the logit layer."""
    dims = [t.dim for t in model.tables for _ in t.feature_names]
    d_dense = model.bottom_mlp[-1]
    if model.interaction == "dot":
        n = len(dims) + 1
        inter_out = d_dense + n * (n - 1) // 2
    else:
        inter_out = d_dense + sum(dims)
    layers, d = [], model.num_dense_features
    for w in model.bottom_mlp:
        layers.append((d, w))
        d = w
    d = inter_out
    for w in model.top_mlp:
        layers.append((d, w))
        d = w
    layers.append((d, 1))
    return layers


def _interaction_width(model: ModelConfig) -> int:
    return model.bottom_mlp[-1] + sum(t.dim * len(t.feature_names) for t in model.tables)


def dense_params(model: ModelConfig) -> int:
    """Dense parameters: sum over Linears of in*out + out, plus the DCN cross weights
    (layers * (n*n or 2*n*r) + layers*n, n the interaction width)."""
    p = sum(i * o + o for i, o in _mlp_layers(model))
    if model.interaction == "dcn":
        n, r, k = _interaction_width(model), model.dcn_low_rank, model.dcn_num_layers
        p += k * ((2 * n * r) if r > 0 else n * n) + k * n
    return p


def dense_flops_per_sample(model: ModelConfig) -> float:
    """Forward + backward FLOPs of one sample's dense part: 3 * forward (backward ~ 2 * forward),

        forward = sum over Linears 2*in*out
                + dot: 2*(F+1)^2*D (the batched x x^T);  cat: 0;
                  dcn: layers*(2*n*n or 4*n*r + 3*n)
    """
    fwd = sum(2 * i * o for i, o in _mlp_layers(model))
    if model.interaction == "dot":
        n = sum(len(t.feature_names) for t in model.tables) + 1
        fwd += 2 * n * n * model.bottom_mlp[-1]
    elif model.interaction == "dcn":
        n, r, k = _interaction_width(model), model.dcn_low_rank, model.dcn_num_layers
        fwd += k * ((4 * n * r) if r > 0 else 2 * n * n) + k * 3 * n
    return 3.0 * fwd


_DENSE_STATE_COPIES = {"sgd": 0, "adagrad": 1, "adam": 2}


def dense_memory_bytes(model: ModelConfig, b: int, dense_optimizer: str = "adagrad") -> float:
    """Replicated dense memory on every rank, fp32:

        P*4*(1 weights + 1 gradient + 1 DDP bucket copy + state copies (adagrad 1, adam 2))
      + b*(sum of layer widths + interaction width)*4*2   activations and their gradients
    """
    P = dense_params(model)
    copies = 3 + _DENSE_STATE_COPIES[dense_optimizer]
    widths = sum(o for _, o in _mlp_layers(model)) + _interaction_width(model)
    return P * 4 * copies + b * widths * 4 * 2


# ---- the estimate of a whole plan ----------------------------------------------------------------

@dataclass
class CostEstimate:
    """Per-rank times by phase (seconds, arrays of W) and memory (bytes, array of W)."""

    phases: dict[str, np.ndarray]
    memory: np.ndarray
    capacity: float
    """Usable bytes per rank."""
    dense_memory: float
    """Of ``memory``, the replicated dense part (same on every rank)."""
    extras: dict[str, float] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return int(self.memory.shape[0])

    @property
    def total(self) -> np.ndarray:
        """(W,) seconds per rank: the sum of its phases."""
        return sum(self.phases[p] for p in PHASES)  # type: ignore[return-value]

    @property
    def embedding_time(self) -> np.ndarray:
        """(W,) seconds of the phases a plan changes (lookup, exchanges, update)."""
        return sum(self.phases[p] for p in EMBEDDING_PHASES)  # type: ignore[return-value]

    @property
    def critical_path(self) -> float:
        """The step time: the slowest rank's total (max over ranks)."""
        return float(self.total.max())

    @property
    def critical_rank(self) -> int:
        return int(self.total.argmax())

    @property
    def synchronous_time(self) -> float:
        """Sum over phases of the slowest rank in that phase (each collective waits for the slowest)."""
        return float(sum(self.phases[p].max() for p in PHASES))

    @property
    def imbalance(self) -> float:
        """max/mean over ranks of the embedding time (1.0 = perfectly balanced)."""
        e = self.embedding_time
        return float(e.max() / e.mean()) if e.mean() > 0 else 1.0

    @property
    def memory_imbalance(self) -> float:
        m = self.memory - self.dense_memory
        return float(m.max() / m.mean()) if m.mean() > 0 else 1.0

    @property
    def fits(self) -> bool:
        return bool((self.memory <= self.capacity).all())

    def breakdown(self) -> dict[str, float]:
        """The critical rank's seconds by summary bucket: all-to-all, all-reduce, lookup (+update), dense compute."""
        r = self.critical_rank
        ph = {p: float(self.phases[p][r]) for p in PHASES}
        return {
            "all_to_all": ph["input_a2a"] + ph["output_a2a"] + ph["backward_exchange"],
            "all_reduce": ph["dp_allreduce"] + ph["dense_allreduce"],
            "lookup": ph["lookup"] + ph["fused_update"],
            "dense_compute": ph["dense_compute"],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "critical_path_s": self.critical_path,
            "critical_rank": self.critical_rank,
            "synchronous_time_s": self.synchronous_time,
            "imbalance": self.imbalance,
            "memory_imbalance": self.memory_imbalance,
            "fits": self.fits,
            "capacity_bytes": self.capacity,
            "dense_memory_bytes": self.dense_memory,
            "breakdown_s": self.breakdown(),
            "per_rank": {
                "total_s": self.total.tolist(),
                "memory_bytes": self.memory.tolist(),
                **{f"{p}_s": self.phases[p].tolist() for p in PHASES},
            },
            **self.extras,
        }
