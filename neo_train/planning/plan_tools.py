"""Plan helpers that need no cost model: the coverage check every plan must pass, and the naive
baseline plan.

    check_coverage(model, plan)          # raises ValueError naming the table
    round_robin_plan(model, W, G)        # table i whole on rank i % W
"""
from __future__ import annotations

import numpy as np

from ..config import ModelConfig
from .plan import ShardingPlan, ShardingType

__all__ = ["check_coverage", "round_robin_plan"]


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
