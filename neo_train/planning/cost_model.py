"""The planner's cost model: per-rank time of one training step, phase by phase, and memory.

    est = estimate(model, plan, cluster, batch_size=512, table_dtype="fp16")
    est.critical_path, est.imbalance, est.fits, est.phases["output_a2a"]   # (W,) seconds

It prices exactly the data movements of neo_train's sharding types (their module docstrings):

    TW/CW/TWCW  input:  every source sends each feature's b lengths + b*L ids to the unit's rank
                output: the owner sends b*D_s pooled values back to each of the W-1 sources;
                        backward: the mirror all-to-all
    RW          input:  b lengths to every owner, each id to the one owner of its row
                output: reduce-scatter of partial sums (W*b, sum D_RW) over *all* W ranks, done
                        as an all-to-all: (W-1)*b*D per rank each way, owner or not;
                        backward: its mirror all-gather, the same bytes
    TWRW        input:  as RW; output: intra-node reduce-scatter of (W*b, D_node) over the G
                ranks of the node, then an inter-node all-to-all among same-local-index ranks
    DP          no forward communication; backward all-reduce of a (R, D) gradient + (R,)
                touched marks per table: 2(W-1)/W * R*(D+1)*4 bytes per rank

Shape letters: b local batch, W world size, N nodes, G devices per node, D dim (D_s a shard's
columns), R rows (R_s a shard's rows), L pooling factor (mean ids per bag), F features of a table.

Assumptions, each priced where it is used: ids are int64 and lengths int32 on the wire; ids are
spread over a table's rows in proportion to row count (the synthetic data scrambles hot rows, so a
row shard of a fraction f of the rows sees a fraction f of the ids); a shard's touched rows are
min(ids, R_s) (an upper bound: repeated ids under a power law touch fewer); an all-to-all posts
every message at once, so it pays one latency per round and a device's time is its larger of
bytes sent and received over each link class (intra- and inter-node links run in parallel);
phases do not overlap (the step time is their sum: an upper bound when the pipeline hides some).
The formulas live in ``cost_formulas`` (re-exported here), the per-rank arithmetic in
``loads.RankLoads``; this module prices a whole plan with them: ``estimate``.
"""
from __future__ import annotations

from ..config import ModelConfig
from ..topology.spec import ClusterSpec
from .cost_formulas import (
    COMM_DTYPES,
    EMBEDDING_PHASES,
    PHASES,
    TABLE_DTYPES,
    CostContext,
    CostEstimate,
    a2a_time,
    cache_hit_rate,
    cache_miss_bytes,
    dense_flops_per_sample,
    dense_memory_bytes,
    dense_params,
    dp_update_bytes,
    input_bytes_per_peer,
    lookup_bytes,
    ring_allreduce_time,
    shard_memory_bytes,
    state_bytes_per_row,
    update_bytes,
)
from .loads import RankLoads, TableArrays
from .plan import ShardingPlan

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
    "estimate",
]


def estimate(
    model: ModelConfig,
    plan: ShardingPlan,
    cluster: ClusterSpec,
    batch_size: int,
    table_dtype: str = "fp32",
    optimizer: str = "rowwise_adagrad",
    *,
    dense_optimizer: str = "adagrad",
    fwd_comm_dtype: str = "fp32",
    bwd_comm_dtype: str = "fp32",
    memory_fraction: float = 1.0,
    zipf_alpha: float = 1.1,
    ssd: bool = False,
) -> CostEstimate:
    """Price ``plan`` for ``model`` on ``cluster`` at local batch ``batch_size``.

    The plan's world size and ranks per node must match the cluster's. ``memory_fraction`` of each
    device's memory is usable (the rest is left to the runtime: CUDA context, allocator slack).
    Cached tables (the plan's or the model's cache load factors) are priced as ``RankLoads.deltas``
    says, their hit rate from ``zipf_alpha``.
    """
    if plan.world_size != cluster.world_size or plan.local_world_size != cluster.devices_per_node:
        raise ValueError(
            f"plan is for {plan.world_size} ranks ({plan.local_world_size} per node) but cluster "
            f"'{cluster.name}' has {cluster.world_size} ({cluster.devices_per_node} per node)"
        )
    plan.validate(model)
    ctx = CostContext(cluster, batch_size, table_dtype, optimizer, dense_optimizer, fwd_comm_dtype, bwd_comm_dtype,
                      ssd=ssd)
    tables = TableArrays.from_model(model, zipf_alpha)
    for i, t in enumerate(model.tables):  # the plan's cache load factors override the tables'
        f = plan[t.name].cache_load_factor
        if f is not None:
            tables.cache[i] = f
    loads = RankLoads(ctx, tables, model)
    loads.set_group_weighting(model, plan)
    with loads.bulk():
        for i, t in enumerate(model.tables):
            loads.add_table_plan(i, plan[t.name])
    return loads.estimate(memory_fraction)
