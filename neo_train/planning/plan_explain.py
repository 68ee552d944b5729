"""Why a table cannot be placed, and the changes that might make the model fit: estimates from
the memory sums, smallest first. The placement search raises them in its PlanningError;
``planner.check_fix`` confirms the first by planning again.

    message, table, fixes = explain_infeasible(planner, i)    # table i found no room
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .cost_model import TABLE_DTYPES, shard_memory_bytes
from .plan import ShardingType
from .plan_report import fmt_bytes

if TYPE_CHECKING:
    from .plan_search import _Planner

__all__ = ["Fix", "explain_infeasible"]


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
            f"the dense replica ({fmt_bytes(p.L.dense_memory)}: MLP parameters, gradients, {o.dense_optimizer} "
            f"state and activations) does not fit one device's {fmt_bytes(p.cap + p.L.dense_memory)} usable "
            f"memory, before any table ('{name}' was the first to find no room); more nodes replicate it too\n"
            f"smallest change that would fit: {fix.text}",
            name, [fix],
        )
    lines = [
        f"table '{name}' ({R:,} rows x {D} dims, {fmt_bytes(need)} as {o.table_dtype} weights + "
        f"{o.optimizer} state) cannot be placed: the emptiest rank has {fmt_bytes(max(free, 0))} free of "
        f"{fmt_bytes(p.cap)} usable per rank (after {fmt_bytes(p.L.dense_memory)} of dense replica); "
        f"allowed types: {', '.join(st.value for st in p.allowed(i))}",
        f"all tables need {fmt_bytes(total[o.table_dtype])} ({o.table_dtype} + {o.optimizer} state, before "
        f"buffers); the {p.W} devices have {fmt_bytes(have)} usable",
    ]
    fixes: list[tuple[float, Fix]] = []  # (score, fix): constraint < dtype < hardware
    row_types = {ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE}
    if need > p.cap and not row_types & set(p.allowed(i)):
        k = math.ceil(need / max(p.cap, 1))
        fixes.append((0.0, Fix(f"allow row_wise or table_row_wise for '{name}' (it needs >= {k} ranks of "
                                f"{fmt_bytes(p.cap)})", unconstrain=name)))
    per_node = p.cap * p.G
    slack = 1.1  # over the bare sum: buffers and imperfect packing
    if o.table_dtype == "fp32":
        n16 = max(p.N, math.ceil(slack * total["fp16"] / max(per_node, 1)))
        if n16 == p.N:
            fixes.append((1.0, Fix(f"--table-dtype fp16 (tables then need {fmt_bytes(total['fp16'])})", "fp16")))
        else:
            fixes.append((1.0 + n16 / p.N, Fix(f"--table-dtype fp16 and --nodes {n16} ({n16 * p.G} devices; tables "
                                                f"then need {fmt_bytes(total['fp16'])})", "fp16", n16)))
    nodes = max(p.N + 1, math.ceil(slack * total[o.table_dtype] / max(per_node, 1)))
    fixes.append((2.0 + nodes / p.N, Fix(f"--nodes {nodes} ({nodes * p.G} devices)", nodes=nodes)))
    host = p.c.host_memory_bytes * p.N
    if total[o.table_dtype] > have and total["fp16"] <= host:
        lines.append(f"(the nodes' host DRAM, {fmt_bytes(host)}, could hold the fp16 tables behind a UVM cache "
                     "tier as Neo does for Model-F; this planner places tables in device memory only)")
    ordered = [f for _, f in sorted(fixes, key=lambda x: x[0])]
    lines.append("smallest change that would fit: " + ordered[0].text)
    if len(ordered) > 1:
        lines.append("other options: " + "; ".join(f.text for f in ordered[1:]))
    return "\n".join(lines), name, ordered
