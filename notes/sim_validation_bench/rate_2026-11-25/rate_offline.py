"""Offline: an asynchronous collective charged by rate_fit.py's progress-rate model: from its issue,
each rank's compute (as the trace laid it out, up to the wait that joined it) slows it to
1 / (1 + k), its other blocks and its wait do not; the charge is that completion less the
calibration's own (its cell's draws), mean over the ranks (MAX=1: the slowest rank), with
idle_2026-11-24/offline.py's scoring. SCALE scales the charge.

    python rate_offline.py RUN_DIR"""
import dataclasses
import math
import os
import sys

sys.path[:0] = ["/work/main/notes/sim_validation_bench/idle_2026-11-24", "/work/main/notes/sim_validation_bench/rate_2026-11-25",
                "/work/main", "/work/main/benchmarks"]
import numpy as np  # noqa: E402

import offline  # noqa: E402
from rate_fit import model, rates  # noqa: E402
from neo_train.topology import trace_sim  # noqa: E402
from neo_train.topology.trace_input import rank_timelines  # noqa: E402

SCALE = float(os.environ.get("SCALE", "1"))
MAX = os.environ.get("MAX", "0") == "1"
_segs: dict = {}


def segments(traces) -> dict:
    """{key: [per rank [(computing, seconds), ...]]}: from an asynchronous launch's issue to the
    wait that joined it, the rank's compute and its other blocks in order."""
    blocks, _ = rank_timelines(traces)
    got: dict = {}
    for mine in blocks.values():
        for i, b in enumerate(mine):
            if b.kind != "call" or b.sync:
                continue
            key, seg = b.colls[0], [(False, b.blocked - b.starts_at)]
            for nxt in mine[i + 1:]:
                seg.append((True, nxt.compute))
                if nxt.kind == "wait" and key in nxt.colls:
                    break
                seg.append((False, nxt.blocked))
            got.setdefault(key, []).append(seg)
    return got


def walk(d: float, k: float, seg) -> float:
    """The completion of work d from the issue: compute at 1 / (1 + k), the rest at 1."""
    t = p = 0.0
    for computing, s in seg:
        rate = 1.0 / (1.0 + k) if computing else 1.0
        if p + s * rate >= d:
            return t + (d - p) / rate
        t, p = t + s, p + s * rate
    return t + (d - p)


orig_sim, orig_factory = trace_sim.simulate_calibrated, trace_sim.calibrated_collectives


def simulate_calibrated(traces, cal, **kw):
    _segs.clear()
    _segs.update(segments(traces))
    return orig_sim(traces, cal, **kw)


def calibrated_collectives(cal):
    make, fits = orig_factory(cal), rates(cal)
    cal_means = {}
    for s in cal.samples:
        if s.get("async") and not s.get("pass") and "iters_done_s" in s:
            cal_means[(s["kind"], int(s["group"]), s["bytes"])] = np.array(s["iters_overlap_s"])

    def wrapped(kind, group, by_rank, name, after):
        made = make(kind, group, by_rank, name, after)
        e0 = by_rank[min(by_rank)]
        if made is None or not e0.get("async"):
            return made
        key = ((e0.get("pg_id", 0), tuple(e0.get("global_ranks") or ())), int(name.rsplit(":", 1)[1]))
        ck = (trace_sim._calibrated_kind(kind), len(group))
        if ck not in fits or key not in _segs:
            return made
        k, _, _, _, ds = fits[ck]
        nbytes = max(1, int(e0.get("in_msg_size") or 1) * trace_sim._dtype_bytes(e0))
        b = min(ds, key=lambda x: abs(math.log(x) - math.log(nbytes)))
        d, ov = ds[b], cal_means[ck + (b,)]
        base = float(model(d, ov, k).mean())
        each = [walk(d, k, seg) for seg in _segs[key]]
        extra = SCALE * ((max(each) if MAX else sum(each) / len(each)) - base)
        (lat, comm), end = made
        return [dataclasses.replace(lat, seconds=max(0.0, lat.seconds + extra)), comm], end

    return wrapped


trace_sim.simulate_calibrated = simulate_calibrated
trace_sim.calibrated_collectives = calibrated_collectives
offline.main()
