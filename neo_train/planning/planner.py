"""The sharding planner: choose a sharding type and placement for every table so that the slowest
rank's step time (cost model: communication + lookups, i.e. Neo's "communication overhead and
load imbalance") is smallest, subject to each rank's memory.

    opts = PlannerOptions(batch_size=512)
    result = plan_sharding(preset("model_a").model, preset_cluster("zionex"), opts)
    result.fits, result.estimate.critical_path, result.plan.to_json("plan.json")
    print(result.report())

``plan_sharding`` runs the placement search (``plan_search``: the options per table and the
greedy + refinement search) on the tables resident; when they do not fit, with the large ones
cached (``auto_cache``); when still nothing fits, it raises PlanningError, or (``strict=False``)
returns the plan for devices just large enough with the explanation (``plan_explain``) whose
first fix planning again has confirmed (``check_fix``).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..config import ModelConfig
from ..topology.spec import ClusterSpec
from .cost_model import CostEstimate, estimate, shard_memory_bytes
from .plan import ShardingPlan
from .plan_explain import Fix
from .plan_report import fmt_bytes, format_result
from .plan_search import PlannerOptions, PlanningError, TableConstraint, _plan_once, _Planner
from .plan_tools import check_coverage, round_robin_plan

__all__ = [
    "TableConstraint",
    "PlannerOptions",
    "PlanResult",
    "PlanningError",
    "plan_sharding",
    "check_coverage",
    "round_robin_plan",
    "check_fix",
    "verify_fix",
    "checked_explanation",
]


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
        return format_result(self, max_ranks)


def plan_sharding(
    model: ModelConfig,
    cluster: ClusterSpec,
    options: PlannerOptions | None = None,
    constraints: Mapping[str, TableConstraint] | None = None,
    *,
    strict: bool = True,
    check_fix: bool = True,
) -> PlanResult:
    """Plan ``model`` for ``cluster``. ``strict``: raise PlanningError when memory does not
    suffice; otherwise return the plan for devices just large enough (1.25x, 1.5x, 2x, ... the
    memory: a balanced plan whose overflow the report shows), with ``fits=False`` and the
    explanation (its first fix checked by planning again when ``check_fix``)."""
    start = time.perf_counter()
    opts = options or PlannerOptions()
    cons = dict(constraints or {})
    explanation = ""
    try:
        try:
            p = _plan_once(model, cluster, opts, cons)
        except PlanningError as resident_error:
            p = _plan_cached(model, cluster, opts, cons, resident_error) if opts.auto_cache else None
            if p is None:
                raise
    except PlanningError as e:
        if strict:
            raise
        # one figure per change: the first fix as planning again confirms it
        explanation = checked_explanation(str(e), e.suggestions, model, cluster, opts, cons) if check_fix else str(e)
        p = None
        for scale in (1.25, 1.5, 2, 3, 4, 8, 16, 64, 256, 1024, math.inf):
            try:
                p = _plan_once(model, cluster, opts, cons, scale)
                break
            except PlanningError:
                continue
        if p is None:
            raise
    plan = p.build()
    check_coverage(model, plan)
    plan.validate(model, cluster.world_size, cluster.devices_per_node)
    est = estimate(model, plan, cluster, opts.batch_size, opts.table_dtype, opts.optimizer,
                   dense_optimizer=opts.dense_optimizer, fwd_comm_dtype=opts.fwd_comm_dtype,
                   bwd_comm_dtype=opts.bwd_comm_dtype, memory_fraction=opts.memory_fraction,
                   zipf_alpha=opts.zipf_alpha, ssd=opts.ssd)
    counts: dict[str, int] = {}
    for tp in plan.tables:
        counts[tp.sharding.value] = counts.get(tp.sharding.value, 0) + 1
    fits = est.fits and not explanation
    if not est.fits and not explanation:
        explanation = "the plan overflows device memory on some ranks (buffers the planner under-counted)"
    return PlanResult(plan, est, cluster, opts, fits, explanation, time.perf_counter() - start, counts)


def _cacheable(model: ModelConfig, cluster: ClusterSpec, opts: PlannerOptions, factor: float) -> list[int]:
    """Tables worth caching at ``factor``: larger than 1% of a device's usable memory, and with a
    cache that holds twice the ids one step sends a shard (W*b*L*F of them, spread over its rows),
    so a batch always fits (kernels/cache.py refuses a batch larger than its cache)."""
    e = opts.context(cluster).elem_bytes
    usable = cluster.device_memory_bytes * opts.memory_fraction
    out = []
    for i, t in enumerate(model.tables):
        ids = cluster.world_size * opts.batch_size * t.pooling_factor * len(t.feature_names)
        size = float(shard_memory_bytes(t.num_rows, t.dim, e, opts.optimizer))
        if size > 0.01 * usable and factor * t.num_rows >= 2 * ids:
            out.append(i)
    return out


def _plan_cached(model: ModelConfig, cluster: ClusterSpec, opts: PlannerOptions,
                 constraints: Mapping[str, TableConstraint], resident_error: PlanningError) -> "_Planner | None":
    """The model with its large tables cached at the largest of ``opts.cache_factors`` that fits
    (best hit rate first), or None. Their full rows and state must fit the nodes' host memory
    unless the backing store is the SSD tier; the misses are priced on the host link."""
    e = opts.context(cluster).elem_bytes
    for f in opts.cache_factors:
        chosen = _cacheable(model, cluster, opts, f)
        if not chosen:
            continue
        store = sum(float(shard_memory_bytes(model.tables[i].num_rows, model.tables[i].dim, e, opts.optimizer))
                    for i in chosen)
        host = cluster.host_memory_bytes * cluster.nodes * 0.9
        if not opts.ssd and store > host:
            # the same for every factor: the store holds every row
            raise PlanningError(
                f"{resident_error}\ncaching would not help in host memory: the cached tables' rows and state "
                f"({fmt_bytes(store)}) exceed 90% of the nodes' host memory ({fmt_bytes(host)}); "
                "give a storage dir (the SSD tier) or more nodes",
                resident_error.table, resident_error.suggestions,
            ) from None
        tables = tuple(t.replace(cache_load_factor=f) if i in chosen else t for i, t in enumerate(model.tables))
        try:
            return _plan_once(model.replace(tables=tables), cluster, opts, constraints)
        except PlanningError:
            continue
    return None


# ---- checking a fix by planning again -------------------------------------------------------------

def check_fix(model: ModelConfig, cluster: ClusterSpec, opts: PlannerOptions,
              constraints: Mapping[str, TableConstraint], fix: Fix, tries: int = 5, refine: int = 6) -> Fix | None:
    """Plan again with ``fix`` applied: the fix as planning confirms it, or None when none of the
    tries fits. Its node count starts at ``fix.nodes`` (the memory-sum estimate) and grows by 25%
    after each miss, ``tries`` times; a fit above a miss (or above the cluster's own count) is then
    bisected down, ``refine`` plans at most, so the count reported is the smallest one found that
    planning again fits (the greedy planner is close to, not exactly, monotone in nodes)."""
    cons = dict(constraints)
    if fix.unconstrain:
        cons.pop(fix.unconstrain, None)
    if fix.unconstrain is None and fix.table_dtype is None and fix.nodes is None:
        return None
    o = dataclasses.replace(opts, table_dtype=fix.table_dtype or opts.table_dtype)

    def fits(n: int) -> bool:
        try:
            _plan_once(model, cluster.replace(nodes=n), o, cons)
        except PlanningError:
            return False
        return True

    nodes = fix.nodes or cluster.nodes
    miss = cluster.nodes if fix.nodes and fix.nodes > cluster.nodes else None  # the count that did not fit
    for _ in range(tries):
        if fits(nodes):
            break
        miss = nodes
        nodes = max(nodes + 1, math.ceil(nodes * 1.25))
    else:
        return None
    for _ in range(refine):  # the smallest count in (miss, nodes] that fits
        if miss is None or nodes - miss <= 1:
            break
        mid = (miss + nodes) // 2
        if fits(mid):
            nodes = mid
        else:
            miss = mid
    parts = [f"--table-dtype {o.table_dtype}" if fix.table_dtype else "",
             f"--nodes {nodes} ({nodes * cluster.devices_per_node} devices)" if nodes != cluster.nodes else "",
             f"allowing row-wise for '{fix.unconstrain}'" if fix.unconstrain else ""]
    return Fix(" and ".join(x for x in parts if x), fix.table_dtype, nodes if nodes != cluster.nodes else None,
               fix.unconstrain)


def verify_fix(model: ModelConfig, cluster: ClusterSpec, opts: PlannerOptions,
               constraints: Mapping[str, TableConstraint], fix: Fix, tries: int = 5) -> str:
    """Plan again with ``fix`` applied (see ``check_fix``): the verified change in words, or ''
    when none of the tries fits."""
    ok = check_fix(model, cluster, opts, constraints, fix, tries)
    return ok.text if ok else ""


_FIRST = "smallest change that would fit: "
_OTHERS = "other options: "


def checked_explanation(message: str, fixes: Sequence[Fix], model: ModelConfig, cluster: ClusterSpec,
                        opts: PlannerOptions, constraints: Mapping[str, TableConstraint] | None = None) -> str:
    """``explain_infeasible``'s message with its first fix replaced by the one planning again
    confirms (``check_fix``): the report then names one node count for that change, not the
    memory-sum estimate beside the checked figure. The other options stay estimates, said so."""
    if not fixes:
        return message
    body = [line for line in message.split("\n") if not line.startswith((_FIRST, _OTHERS))]
    ok = check_fix(model, cluster, opts, constraints or {}, fixes[0])
    if ok is not None:
        body.append(f"smallest change that would fit (checked by planning again): {ok.text}")
    else:
        body += [_FIRST + fixes[0].text + " (estimated from the memory sum)",
                 "(planning again with that change, and with up to 2.4x its nodes, still overflows)"]
    if len(fixes) > 1:
        body.append("other options (estimated from the memory sum, not checked): "
                    + "; ".join(f.text for f in fixes[1:]))
    return "\n".join(body)
