"""The planner's results in words: the per-rank table and the summary ``neo-train plan`` prints
(``PlanResult.report()``), and the byte sizes its messages quote.

    print(format_result(result))          # per-rank table, then cluster, step, imbalance, memory, fit
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .cost_model import EMBEDDING_PHASES, PHASES

if TYPE_CHECKING:
    from .planner import PlanResult

__all__ = ["format_result", "format_rank_table", "fmt_bytes"]


def fmt_bytes(x: float) -> str:
    """``x`` bytes in TB, GB or MB (decimal units, two decimals), else whole bytes."""
    for unit, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if x >= s:
            return f"{x / s:.2f} {unit}"
    return f"{x:.0f} B"


_SHORT = {
    "lookup": "lookup", "input_a2a": "in a2a", "output_a2a": "out a2a", "backward_exchange": "bwd xchg",
    "fused_update": "update", "dp_allreduce": "DP AR", "dense_compute": "dense", "dense_allreduce": "dense AR",
}  # fmt: skip


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def format_rank_table(result: "PlanResult", max_ranks: int = 10) -> str:
    """Per rank: tables and shards held, memory used/usable, estimated ms by phase. With more than
    ``max_ranks`` ranks: the ``max_ranks`` slowest, then mean and max over all ranks."""
    est, plan = result.estimate, result.plan
    W = plan.world_size
    tables = np.zeros(W, dtype=np.int64)
    shards = np.zeros(W, dtype=np.int64)
    for tp in plan.tables:
        ranks = [s.rank for s in tp.shards]
        np.add.at(shards, ranks, 1)
        tables[sorted(set(ranks))] += 1
    total = est.total
    ranks = list(range(W)) if W <= max_ranks else np.argsort(-total, kind="stable")[:max_ranks].tolist()
    head = ["rank", "node", "tables", "shards", "mem GB", "of GB"] + [_SHORT[p] for p in PHASES] + ["total ms"]
    rows = []
    for r in ranks:
        rows.append([str(r), str(r // plan.local_world_size), str(tables[r]), str(shards[r]), _gb(est.memory[r]),
                     _gb(est.capacity)] + [f"{1e3 * est.phases[p][r]:.2f}" for p in PHASES] + [f"{1e3 * total[r]:.2f}"])
    for label, f in (("mean", np.mean), ("max", np.max)):
        rows.append([label, "", f"{f(tables):.1f}" if label == "mean" else str(tables.max()),
                     f"{f(shards):.1f}" if label == "mean" else str(shards.max()), _gb(f(est.memory)), _gb(est.capacity)]
                    + [f"{1e3 * f(est.phases[p]):.2f}" for p in PHASES] + [f"{1e3 * f(total):.2f}"])
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    title = f"per rank ({'all' if W <= max_ranks else f'the {len(ranks)} slowest of {W}'}; times in ms per step)"
    out = [title, line(head), line(["-" * w for w in widths])]
    out += [line(r) for r in rows[: len(ranks)]]
    out += [line(["-" * w for w in widths])] + [line(r) for r in rows[len(ranks):]]
    return "\n".join(out)


def format_result(result: "PlanResult", max_ranks: int = 10) -> str:
    est, c, o = result.estimate, result.cluster, result.options
    step = est.critical_path
    bd = est.breakdown()
    counts = ", ".join(f"{n} {k}" for k, n in sorted(result.counts.items(), key=lambda kv: -kv[1]))
    emb = {p: 1e3 * float(est.phases[p][est.critical_rank]) for p in EMBEDDING_PHASES}
    lines = [
        format_rank_table(result, max_ranks),
        "",
        f"cluster     {c.describe()}",
        f"setup       b={o.batch_size} per rank, {o.table_dtype} tables, {o.optimizer}; planned in {result.seconds:.2f} s",
        f"sharding    {counts}",
        f"step        {1e3 * step:.2f} ms on rank {est.critical_rank} = all-to-all {1e3 * bd['all_to_all']:.2f} + "
        f"all-reduce {1e3 * bd['all_reduce']:.2f} + lookup/update {1e3 * bd['lookup']:.2f} + dense compute "
        f"{1e3 * bd['dense_compute']:.2f} (no overlap; {c.world_size * o.batch_size / step:,.0f} samples/s)",
        "            embedding phases there: " + ", ".join(f"{_SHORT[p]} {v:.2f}" for p, v in emb.items()),
        f"            phase-synchronous bound (each phase at its slowest rank): {1e3 * est.synchronous_time:.2f} ms",
        f"imbalance   {est.imbalance:.3f} (embedding time max/mean over ranks); memory {est.memory_imbalance:.3f}",
        f"memory      max {_gb(est.memory.max())} GB, mean {_gb(est.memory.mean())} GB per rank of "
        f"{_gb(est.capacity)} GB usable ({o.memory_fraction:.0%} of {_gb(c.device_memory_bytes)} GB); "
        f"dense replica {_gb(est.dense_memory)} GB",
        f"fits        {'yes' if result.fits else 'NO'}",
    ]
    if result.explanation:
        lines.append("            " + result.explanation.replace("\n", "\n            "))
    return "\n".join(lines)
