"""Offline: an asynchronous collective charged SCALE x its calibration's slope (overlap_slopes.py)
x the compute its ranks do between its launch and its join beyond the calibration's mean draw (ONE_SIDED=1: nothing taken off
below it), on a run's kept traces, with idle_2026-11-24/offline.py's scoring.

    SCALE=1 python overlap_offline.py RUN_DIR"""
import dataclasses
import os
import sys

sys.path[:0] = ["/work/main/notes/sim_validation_bench/idle_2026-11-24", "/work/main/notes/sim_validation_bench/issue_2026-11-24",
                "/work/main", "/work/main/benchmarks"]
import offline  # noqa: E402
from overlap_slopes import slopes  # noqa: E402
from neo_train.topology import trace_sim  # noqa: E402
from neo_train.topology.trace_input import rank_timelines  # noqa: E402

SCALE = float(os.environ.get("SCALE", "1"))
ONE_SIDED = os.environ.get("ONE_SIDED", "1") == "1"
_over: dict = {}


def compute_over(traces) -> dict:
    """{key: seconds}: an asynchronous collective's ranks' compute from its launch to the wait that
    joined it (the compute before each block in between and before that wait), mean over its ranks."""
    blocks, colls = rank_timelines(traces)
    got: dict = {}
    for mine in blocks.values():
        for i, b in enumerate(mine):
            if b.kind != "call" or b.sync:
                continue
            key, total = b.colls[0], 0.0
            for nxt in mine[i + 1:]:
                total += nxt.compute
                if nxt.kind == "wait" and key in nxt.colls:
                    got.setdefault(key, []).append(total)
                    break
    return {k: sum(v) / len(v) for k, v in got.items()}


orig_sim, orig_factory = trace_sim.simulate_calibrated, trace_sim.calibrated_collectives


def simulate_calibrated(traces, cal, **kw):
    _over.clear()
    _over.update(compute_over(traces))
    return orig_sim(traces, cal, **kw)


def calibrated_collectives(cal):
    make, sl = orig_factory(cal), slopes(cal)

    def wrapped(kind, group, by_rank, name, after):
        made = make(kind, group, by_rank, name, after)
        e0 = by_rank[min(by_rank)]
        if made is None or not e0.get("async"):
            return made
        key = ((e0.get("pg_id", 0), tuple(e0.get("global_ranks") or ())), int(name.rsplit(":", 1)[1]))
        s, _, _, mean = sl.get((trace_sim._calibrated_kind(kind), len(group)), (0.0, 0.0, 0, 0.0))
        extra = SCALE * max(0.0, s) * (_over.get(key, mean) - mean) * (1.0 - float(e0.get("_idle", 0.0)))
        if ONE_SIDED:
            extra = max(0.0, extra)
        (lat, comm), end = made
        return [dataclasses.replace(lat, seconds=max(0.0, lat.seconds + extra)), comm], end

    return wrapped


trace_sim.simulate_calibrated = simulate_calibrated
trace_sim.calibrated_collectives = calibrated_collectives
offline.main()
