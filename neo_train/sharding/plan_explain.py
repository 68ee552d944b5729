"""When a plan cannot be had or must be checked: why a model does not fit and the smallest change
that would (verified by planning again), the coverage check, and the naive baseline plan.

    check_coverage(model, plan)          # raises ValueError naming the table
    checked_explanation(str(e), e.suggestions, model, cluster, opts)   # a PlanningError's report, its fix checked
    round_robin_plan(model, W, G)        # table i whole on rank i % W
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from ..config import ModelConfig
from ..topology.spec import ClusterSpec
from .cost_model import TABLE_DTYPES, shard_memory_bytes
from .plan import ShardingPlan, ShardingType

if TYPE_CHECKING:
    from .planner import PlannerOptions, TableConstraint, _Planner

__all__ = ["check_coverage", "round_robin_plan", "Fix", "explain_infeasible", "verify_fix", "check_fix",
           "checked_explanation"]


def _fmt_bytes(x: float) -> str:
    for unit, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if x >= s:
            return f"{x / s:.2f} {unit}"
    return f"{x:.0f} B"


@dataclass(frozen=True)
class Fix:
    """A change that may make a model fit: text for people, fields for verification."""

    text: str
    table_dtype: str | None = None
    nodes: int | None = None
    unconstrain: str | None = None


def explain_infeasible(p: "_Planner", i: int) -> tuple[str, str, list[Fix]]:
    """(message, table, fixes, smallest first) for table i that no allowed option could place."""
    t, o = p.t, p.o
    name, R, D = t.names[i], int(t.rows[i]), int(t.dims[i])
    need = float(shard_memory_bytes(R, D, p.ctx.elem_bytes, o.optimizer))
    free = float((p.cap - p.L.mem).max())
    total = {dt: float(sum(shard_memory_bytes(t.rows, t.dims, e, o.optimizer))) for dt, e in TABLE_DTYPES.items()}
    have = p.cap * p.W
    if p.cap <= 0:  # no placement of the tables can help: more ranks replicate the MLPs too
        fix = Fix("a smaller MLP, devices with more memory (--topology), or fewer ranks per device")
        return (
            f"the dense replica ({_fmt_bytes(p.L.dense_memory)}: MLP parameters, gradients, {o.dense_optimizer} "
            f"state and activations) does not fit one device's {_fmt_bytes(p.cap + p.L.dense_memory)} usable "
            f"memory, before any table ('{name}' was the first to find no room); more nodes replicate it too\n"
            f"smallest change that would fit: {fix.text}",
            name, [fix],
        )
    lines = [
        f"table '{name}' ({R:,} rows x {D} dims, {_fmt_bytes(need)} as {o.table_dtype} weights + "
        f"{o.optimizer} state) cannot be placed: the emptiest rank has {_fmt_bytes(max(free, 0))} free of "
        f"{_fmt_bytes(p.cap)} usable per rank (after {_fmt_bytes(p.L.dense_memory)} of dense replica); "
        f"allowed types: {', '.join(st.value for st in p.allowed(i))}",
        f"all tables need {_fmt_bytes(total[o.table_dtype])} ({o.table_dtype} + {o.optimizer} state, before "
        f"buffers); the {p.W} devices have {_fmt_bytes(have)} usable",
    ]
    fixes: list[tuple[float, Fix]] = []  # (score, fix): constraint < dtype < hardware
    row_types = {ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE}
    if need > p.cap and not row_types & set(p.allowed(i)):
        k = math.ceil(need / max(p.cap, 1))
        fixes.append((0.0, Fix(f"allow row_wise or table_row_wise for '{name}' (it needs >= {k} ranks of "
                                f"{_fmt_bytes(p.cap)})", unconstrain=name)))
    per_node = p.cap * p.G
    slack = 1.1  # over the bare sum: buffers and imperfect packing
    if o.table_dtype == "fp32":
        n16 = max(p.N, math.ceil(slack * total["fp16"] / max(per_node, 1)))
        if n16 == p.N:
            fixes.append((1.0, Fix(f"--table-dtype fp16 (tables then need {_fmt_bytes(total['fp16'])})", "fp16")))
        else:
            fixes.append((1.0 + n16 / p.N, Fix(f"--table-dtype fp16 and --nodes {n16} ({n16 * p.G} devices; tables "
                                                f"then need {_fmt_bytes(total['fp16'])})", "fp16", n16)))
    nodes = max(p.N + 1, math.ceil(slack * total[o.table_dtype] / max(per_node, 1)))
    fixes.append((2.0 + nodes / p.N, Fix(f"--nodes {nodes} ({nodes * p.G} devices)", nodes=nodes)))
    host = p.c.host_memory_bytes * p.N
    if total[o.table_dtype] > have and total["fp16"] <= host:
        lines.append(f"(the nodes' host DRAM, {_fmt_bytes(host)}, could hold the fp16 tables behind a UVM cache "
                     "tier as Neo does for Model-F; this planner places tables in device memory only)")
    ordered = [f for _, f in sorted(fixes, key=lambda x: x[0])]
    lines.append("smallest change that would fit: " + ordered[0].text)
    if len(ordered) > 1:
        lines.append("other options: " + "; ".join(f.text for f in ordered[1:]))
    return "\n".join(lines), name, ordered


def check_fix(model: ModelConfig, cluster: ClusterSpec, opts: "PlannerOptions",
              constraints: Mapping[str, "TableConstraint"], fix: Fix, tries: int = 5, refine: int = 6) -> Fix | None:
    """Plan again with ``fix`` applied: the fix as planning confirms it, or None when none of the
    tries fits. Its node count starts at ``fix.nodes`` (the memory-sum estimate) and grows by 25%
    after each miss, ``tries`` times; a fit above a miss (or above the cluster's own count) is then
    bisected down, ``refine`` plans at most, so the count reported is the smallest one found that
    planning again fits (the greedy planner is close to, not exactly, monotone in nodes)."""
    from .planner import PlanningError, _plan_once

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


def verify_fix(model: ModelConfig, cluster: ClusterSpec, opts: "PlannerOptions",
               constraints: Mapping[str, "TableConstraint"], fix: Fix, tries: int = 5) -> str:
    """Plan again with ``fix`` applied (see ``check_fix``): the verified change in words, or ''
    when none of the tries fits."""
    ok = check_fix(model, cluster, opts, constraints, fix, tries)
    return ok.text if ok else ""


_FIRST = "smallest change that would fit: "
_OTHERS = "other options: "


def checked_explanation(message: str, fixes: Sequence[Fix], model: ModelConfig, cluster: ClusterSpec,
                        opts: "PlannerOptions", constraints: Mapping[str, "TableConstraint"] | None = None) -> str:
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
