"""Offline: an asynchronous collective charged SCALE x its calibration's slope (overlap_slopes.py)
x the compute its ranks do between its launch and its join beyond the calibration's mean draw (ONE_SIDED=1: nothing taken off
below it), on a run's kept traces, with idle_2026-11-24/offline.py's scoring. The prototype of what 5d81f38 built
(KindFit.overlap_slope, trace_input.compute_over: the same rows as SCALE=1 ONE_SIDED=1), so run it on the code before
(ROOT=a checkout of 4d8fd1f), or the charge is counted twice; ``install`` also serves rate_2026-11-25/rate_offline.py.

    ROOT=/tmp/old SCALE=1 python overlap_offline.py RUN_DIR"""
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


def compute_over(traces) -> dict:
    """{key: seconds}: an asynchronous collective's ranks' compute from its launch to the wait that
    joined it (the compute before each block in between and before that wait), mean over its ranks."""
    got: dict = {}
    for mine in rank_timelines(traces)[0].values():
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


def key_of(e0: dict, name: str) -> tuple:
    """The trace_input collective key of a factory call's entry and phase name."""
    return (e0.get("pg_id", 0), tuple(e0.get("global_ranks") or ())), int(name.rsplit(":", 1)[1])


def install(per_trace, charge) -> None:
    """Patch trace_sim: per_trace(traces) -> {key: anything} runs before each calibrated
    simulation; charge(cal) -> f(kind, group, e0, key, seen) gives the seconds added to an
    asynchronous collective's latency (seen: per_trace's value for it, None where it has none)."""
    orig_sim, orig_factory = trace_sim.simulate_calibrated, trace_sim.calibrated_collectives
    state: dict = {}

    def simulate_calibrated(traces, cal, **kw):
        state.clear()
        state.update(per_trace(traces))
        return orig_sim(traces, cal, **kw)

    def calibrated_collectives(cal):
        make, extra_of = orig_factory(cal), charge(cal)

        def wrapped(kind, group, by_rank, name, after):
            made = make(kind, group, by_rank, name, after)
            e0 = by_rank[min(by_rank)]
            if made is None or not e0.get("async"):
                return made
            key = key_of(e0, name)
            extra = extra_of(kind, group, e0, key, state.get(key))
            (lat, comm), end = made
            return [dataclasses.replace(lat, seconds=max(0.0, lat.seconds + extra)), comm], end

        return wrapped

    trace_sim.simulate_calibrated = simulate_calibrated
    trace_sim.calibrated_collectives = calibrated_collectives


def slope_charge(cal):
    sl = slopes(cal)

    def extra(kind, group, e0, key, over):
        s, _, _, mean = sl.get((trace_sim._calibrated_kind(kind), len(group)), (0.0, 0.0, 0, 0.0))
        x = SCALE * max(0.0, s) * ((mean if over is None else over) - mean) * (1.0 - float(e0.get("_idle", 0.0)))
        return max(0.0, x) if ONE_SIDED else x

    return extra


if __name__ == "__main__":
    install(compute_over, slope_charge)
    offline.main()
