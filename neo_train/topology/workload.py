"""One DLRM training iteration as a simulator schedule: compute phases from a roofline, the
embedding all-to-alls from a sharding plan, the dense all-reduce from the replicated MLPs.

    it = build_iteration(IterationSpec(opera_model_a(), preset_cluster("opera_study", nodes=128)))
    res = simulate(it.phases, OperaNetwork.from_nodes(128, bulk_threshold=0))

Hosts are nodes (G GPUs behind one NIC); a GPU's local batch is b = global_batch / (N * G).

Compute (the roofline, per GPU, the slowest GPU of each phase; ``planning.cost_model`` does the
arithmetic from ``ClusterSpec.device_flops`` and ``hbm_bandwidth``):
    dense       FLOPs / device_flops, FLOPs per sample = 3 * sum over Linear layers of 2*in*out
                (forward + a backward of twice the forward); split into bottom/top MLP forward
                (1/3 of each MLP's share) and backward (2/3)
    lookup      HBM bytes / hbm_bandwidth: for each table a GPU owns, every id of the global
                batch reads its row: B_global * L * (8 id bytes + D * 4) + pooled writes
    emb_update  HBM bytes / hbm_bandwidth of the fused backward + row-wise Adagrad: re-read ids
                and pooled gradients, read + write each touched row and its optimizer state
    dense_update  P * 20 bytes / hbm_bandwidth: Adagrad reads weight, gradient and state and
                writes weight and state (4 bytes each) for all P dense parameters
With the opera_study cluster (A100: 156 TFLOP/s TF32 peak, 1,555 GB/s HBM) Model-A's dense part is
4.22 GFLOP per sample: 111 ms per iteration at 16 nodes, 1.7 ms at 1024.

Communication (bytes on the wire, fp32 = 4 bytes per element unless ``wire_bytes`` says otherwise):
    fwd_a2a     pooled embeddings: the owner of a (column shard of a) table sends b * D_s * 4 to
                every other GPU: per host pair G * b * sum(D_s of the source host's shards),
                (G-1) * b * ... inside the owner's host. Row-wise tables: a reduce-scatter done
                as a uniform all-to-all (G^2 * b * D * 4 per host pair); table-row-wise: as
                table-wise on its node (the intra-node reduce-scatter is not priced);
                data-parallel tables: no all-to-all, their R * (D + 1) * 4 gradient joins ar_top.
    bwd_a2a     their gradients back: the transpose
    input_a2a   (``input_dist``) ids and lengths to the owners: G * b * (4 + L * 8) per feature.
                Off by default: the ISI study's FlexFlow model reads each table's ids on the
                table's own device, so ids never cross the network.
    ar_top, ar_bottom  the dense gradients (top MLP first, as DDP's buckets finish in reverse
                layer order), S = 4 * parameters each, by ring / DPS / hierarchical all-reduce
                among the hosts (the study folds a node's 8 GPUs into one: no intra-node step,
                unless ``hier_*``)
DAG: lookup -> bottom_fwd; lookup -> fwd_a2a; (bottom_fwd, fwd_a2a) -> top_fwd -> top_bwd;
top_bwd -> {bwd_a2a, bottom_bwd, ar_top}; (bottom_bwd, ar_top) -> ar_bottom;
(bwd_a2a, bottom_bwd) -> emb_update; (ar_bottom, emb_update) -> dense_update. So the embedding
gradient exchange and the top MLP's all-reduce overlap the bottom MLP's backward.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import ModelConfig, TableConfig
from ..planning.cost_model import CostEstimate, dense_params, estimate
from ..planning.plan import Shard, ShardingPlan, ShardingType, TablePlan
from ..topology.spec import ClusterSpec
from .collectives import ALL_REDUCE_ALGORITHMS, all_reduce, all_to_all
from .simulator import Comm, Compute, Phase

__all__ = ["IterationSpec", "Iteration", "build_iteration", "opera_model_a", "opera_model_i", "node_round_robin_plan",
           "PLACEMENTS"]

PLACEMENTS = ("planner", "round_robin")


def opera_model_a(tables: int = 1000, rows: int = 10**7, dim: int = 80, bag: float = 100.0, layers: int = 20,
                  width: int = 3375) -> ModelConfig:
    """Model-A as the ISI Opera/DLRM study's job scripts give it (FlexFlow's DLRM): ``tables``
    tables of ``rows`` x ``dim`` (sparse feature size 80), bags of 100 ids, bottom MLP of
    layers-1 Linears of ``width`` over a ``width``-wide dense input, concatenation interaction,
    top MLP of layers-1 Linears (the first ``width`` + tables*dim wide) and a logit: ~703M dense
    parameters, 800B embedding parameters at 1000 tables."""
    if tables < 1:
        raise ValueError(f"opera_model_a: tables must be >= 1, got {tables}")
    ts = tuple(TableConfig(f"t{i}", rows, dim, pooling_factor=float(bag)) for i in range(tables))
    return ModelConfig(ts, num_dense_features=width, bottom_mlp=(width,) * (layers - 1),
                       top_mlp=(width,) * (layers - 1), interaction="cat")


def opera_model_i(tables: int = 361, rows: int = 10**7, dim: int = 92, bag: float = 100.0, layers: int = 43,
                  width: int = 682) -> ModelConfig:
    """Model-I of the ISI study's job scripts: 361 tables of 10^7 x 92, bags of 100, bottom MLP of
    42 Linears of 682 over a 682-wide dense input, top MLP of 42 Linears of 682 and a logit (the
    first one 682 + 361*92 wide): ~62M dense parameters."""
    return opera_model_a(tables, rows, dim, bag, layers, width)


@dataclass(frozen=True)
class IterationSpec:
    model: ModelConfig
    cluster: ClusterSpec
    """Nodes, GPUs per node, and the roofline (device_flops, hbm_bandwidth)."""
    global_batch: int = 524_288
    """Samples per iteration, fixed under strong scaling."""
    allreduce: str = "ring"
    """ring | dps | hier_ring | hier_dps."""
    a2a_algorithm: str = "direct"
    """direct (every flow at once) | pairwise (N-1 rounds)."""
    input_dist: bool = False
    placement: str = "planner"
    """planner: ``plan_sharding`` (balanced by the cost model); round_robin: table i whole on node
    i mod N (``node_round_robin_plan``)."""
    table_wise_only: bool = True
    """The planner may only place whole tables (the study's table-wise parallelism); False lets it
    use every sharding type (row-, column-wise, data-parallel ...) for models whose tables do not
    fit one GPU."""
    wire_bytes: int = 4
    plan: ShardingPlan | None = None
    """A plan handed from above (``neo-train study --plan FILE``, or the caller's own planner's):
    simulated as given, ``placement`` and ``table_wise_only`` then unused. None: ``placement``
    decides (the planner, or round robin)."""

    def __post_init__(self) -> None:
        W = self.cluster.world_size
        if self.global_batch < W or self.global_batch % W:
            raise ValueError(f"global batch {self.global_batch} must be a positive multiple of the world size {W}")
        if self.allreduce not in ALL_REDUCE_ALGORITHMS:
            raise ValueError(f"allreduce must be one of {ALL_REDUCE_ALGORITHMS}, got {self.allreduce!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.plan is not None:
            self.plan.validate(self.model, W, self.cluster.devices_per_node)


@dataclass
class Iteration:
    phases: list[Phase]
    compute: dict[str, float]
    """Seconds of every compute phase."""
    network_bytes: dict[str, float]
    """Bytes that cross a NIC per iteration, by collective (all_to_all, all_reduce)."""
    dense_params: int
    plan: ShardingPlan
    estimate: CostEstimate
    notes: list[str] = field(default_factory=list)


def node_round_robin_plan(model: ModelConfig, nodes: int, gpus: int) -> ShardingPlan:
    """Table i whole on node i mod N, GPU (i div N) mod G of it."""
    tps = tuple(TablePlan(t.name, ShardingType.TABLE_WISE,
                          (Shard((i % nodes) * gpus + (i // nodes) % gpus, 0, t.num_rows, 0, t.dim),))
                for i, t in enumerate(model.tables))
    return ShardingPlan(nodes * gpus, gpus, tps)


def _plan(spec: IterationSpec, b: int) -> tuple[ShardingPlan, CostEstimate, list[str]]:
    if spec.plan is not None:
        return _make_plan(spec, b)
    key = (id(spec.model), spec.cluster, b, spec.placement, spec.table_wise_only)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is spec.model:
        return hit[1]
    out = _make_plan(spec, b)
    _PLANS[key] = (spec.model, out)
    while len(_PLANS) > 8:
        _PLANS.pop(next(iter(_PLANS)))
    return out


_PLANS: dict = {}
"""The last few plans, by model object and cluster: sweeps over networks and all-reduce
algorithms reuse them (planning 1000 tables takes about a second)."""


def _make_plan(spec: IterationSpec, b: int) -> tuple[ShardingPlan, CostEstimate, list[str]]:
    c, notes = spec.cluster, []
    if spec.plan is not None:
        plan = spec.plan
        est = estimate(spec.model, plan, c, b)
    elif spec.placement == "round_robin":
        plan = node_round_robin_plan(spec.model, c.nodes, c.devices_per_node)
        est = estimate(spec.model, plan, c, b)
    else:
        from ..planning.planner import PlannerOptions, plan_sharding

        opts = PlannerOptions(batch_size=b, allowed=(ShardingType.TABLE_WISE,)) if spec.table_wise_only \
            else PlannerOptions(batch_size=b)
        res = plan_sharding(spec.model, c, opts, strict=False, check_fix=False)
        plan, est = res.plan, res.estimate
    if not est.fits:
        notes.append(f"the plan does not fit in {c.device_memory_bytes / 2**30:.0f} GiB per GPU "
                     f"(max {est.memory.max() / 2**30:.1f} GiB at {b} samples per GPU); simulated anyway, as the study did")
    return plan, est, notes


def _embedding_matrices(spec: IterationSpec, plan: ShardingPlan, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(pooled, ids) host-level byte matrices: pooled[h, j] from owner host h to host j in the
    forward output all-to-all; ids[j, h] from host j to owner h in the input all-to-all."""
    N, G, e = spec.cluster.nodes, spec.cluster.devices_per_node, spec.wire_bytes
    cols = np.zeros(N)  # pooled columns owned per host (TW/CW/TWCW, times features)
    ids = np.zeros(N)  # id + length bytes per sample owed to each host
    uniform = 0.0  # row-wise reduce-scatter width, per sample, every GPU pair
    by_name = {t.name: t for t in spec.model.tables}
    for tp in plan.tables:
        t = by_name[tp.table]
        F = len(t.feature_names)
        if tp.sharding in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE,
                           ShardingType.TABLE_ROW_WISE):
            for s in tp.shards if tp.sharding != ShardingType.TABLE_ROW_WISE else tp.shards[:1]:
                h = s.rank // G
                cols[h] += (t.dim if tp.sharding == ShardingType.TABLE_ROW_WISE else s.cols) * F
                ids[h] += F * (4 + t.pooling_factor * 8)
        elif tp.sharding == ShardingType.ROW_WISE:
            uniform += t.dim * F
            for s in tp.shards:
                ids[s.rank // G] += F * (4 + t.pooling_factor * 8 * s.rows / t.num_rows)
    off = ~np.eye(N, dtype=bool)
    pooled = np.where(off, G * b * e * cols[:, None], (G - 1) * b * e * cols[:, None])
    pooled = pooled + np.where(off, G * G * b * e * uniform, G * (G - 1) * b * e * uniform)
    idm = np.where(off, G * b * ids[None, :], (G - 1) * b * ids[None, :])
    return pooled, idm


def _mlp_param_split(model: ModelConfig) -> tuple[float, float, float, float]:
    """(bottom params, top params, bottom fwd FLOPs/sample, top fwd FLOPs/sample)."""
    d, pb, fb = model.num_dense_features, 0, 0
    for w in model.bottom_mlp:
        pb, fb, d = pb + d * w + w, fb + 2 * d * w, w
    if model.interaction == "cat":
        d = model.bottom_mlp[-1] + sum(t.dim * len(t.feature_names) for t in model.tables)
    elif model.interaction == "dot":
        n = len(model.feature_names) + 1
        d = model.bottom_mlp[-1] + n * (n - 1) // 2
    else:  # dcn: the cross layers count with the top MLP
        d = model.bottom_mlp[-1] + sum(t.dim * len(t.feature_names) for t in model.tables)
    pt, ft = 0, 0
    for w in (*model.top_mlp, 1):
        pt, ft, d = pt + d * w + w, ft + 2 * d * w, w
    return float(pb), float(pt), float(fb), float(ft)


def build_iteration(spec: IterationSpec) -> Iteration:
    c = spec.cluster
    N, G = c.nodes, c.devices_per_node
    b = spec.global_batch // (N * G)
    plan, est, notes = _plan(spec, b)
    mx = {k: float(v.max()) for k, v in est.phases.items()}
    pb, pt, fb, ft = _mlp_param_split(spec.model)
    P = dense_params(spec.model)
    dense = mx["dense_compute"]  # 3 * forward FLOPs * b / device_flops (cost model)
    share_b = fb / (fb + ft) if fb + ft > 0 else 0.5
    compute = {
        "lookup": mx["lookup"],
        "bottom_fwd": dense * share_b / 3,
        "top_fwd": dense * (1 - share_b) / 3,
        "top_bwd": dense * (1 - share_b) * 2 / 3,
        "bottom_bwd": dense * share_b * 2 / 3,
        "emb_update": mx["fused_update"],
        "dense_update": P * 20 / c.hbm_bandwidth,
    }
    pooled, idm = _embedding_matrices(spec, plan, b)
    dp_bytes = sum(t.num_rows * (t.dim + 1) * 4.0 for t in spec.model.tables
                   if plan[t.name].sharding == ShardingType.DATA_PARALLEL)
    S_top, S_bottom = 4.0 * pt + dp_bytes, 4.0 * (P - pt)
    phases: list[Phase] = []
    first = ()
    if spec.input_dist:
        phases.append(all_to_all(idm, name="input_a2a", algorithm=spec.a2a_algorithm))
        first = ("input_a2a",)
    ar = spec.allreduce
    phases += [
        Compute("lookup", compute["lookup"], first),
        Compute("bottom_fwd", compute["bottom_fwd"], ("lookup",)),
        all_to_all(pooled, name="fwd_a2a", algorithm=spec.a2a_algorithm, after=("lookup",)),
        Compute("top_fwd", compute["top_fwd"], ("bottom_fwd", "fwd_a2a")),
        Compute("top_bwd", compute["top_bwd"], ("top_fwd",)),
        all_to_all(pooled.T, name="bwd_a2a", algorithm=spec.a2a_algorithm, after=("top_bwd",)),
        Compute("bottom_bwd", compute["bottom_bwd"], ("top_bwd",)),
        all_reduce(ar, N, S_top, name="ar_top", after=("top_bwd",), devices_per_host=G),
        all_reduce(ar, N, S_bottom, name="ar_bottom", after=("bottom_bwd", "ar_top"), devices_per_host=G),
        Compute("emb_update", compute["emb_update"], ("bwd_a2a", "bottom_bwd")),
        Compute("dense_update", compute["dense_update"], ("ar_bottom", "emb_update")),
    ]
    net_bytes: dict[str, float] = {}
    for p in phases:
        if isinstance(p, Comm):
            net_bytes[p.collective] = net_bytes.get(p.collective, 0.0) + p.network_bytes
    return Iteration(phases, compute, net_bytes, P, plan, est, notes)
