"""Offline: an asynchronous collective charged by rate_fit.py's progress-rate model: from its issue,
each rank's compute (as the trace laid it out, up to the wait that joined it) slows it to
1 / (1 + k), its other blocks and its wait do not; the charge is that completion less the
calibration's own (its cell's draws), mean over the ranks (MAX=1: the slowest rank), with
idle_2026-11-24/offline.py's scoring (via issue_2026-11-24/overlap_offline.py's ``install``).
SCALE scales the charge. Run on the code before 5d81f38 (ROOT=a checkout of 4d8fd1f), as for the
figure in notes/sim_validation.md; on later code the built charge comes on top.

    ROOT=/tmp/old python rate_offline.py RUN_DIR"""
import math
import os
import sys

sys.path[:0] = ["/work/main/notes/sim_validation_bench/issue_2026-11-24", "/work/main/notes/sim_validation_bench/rate_2026-11-25"]
import numpy as np  # noqa: E402

from overlap_offline import install, offline, trace_sim  # noqa: E402
from rate_fit import model, rates  # noqa: E402
from neo_train.topology.trace_input import rank_timelines  # noqa: E402

SCALE = float(os.environ.get("SCALE", "1"))
MAX = os.environ.get("MAX", "0") == "1"


def segments(traces) -> dict:
    """{key: [per rank [(computing, seconds), ...]]}: from an asynchronous launch's issue to the
    wait that joined it, the rank's compute and its other blocks in order."""
    got: dict = {}
    for mine in rank_timelines(traces)[0].values():
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


def rate_charge(cal):
    fits = rates(cal)
    draws = {(s["kind"], int(s["group"]), s["bytes"]): np.array(s["iters_overlap_s"]) for s in cal.samples
             if s.get("async") and not s.get("pass") and "iters_done_s" in s}

    def extra(kind, group, e0, key, segs):
        ck = (trace_sim._calibrated_kind(kind), len(group))
        if ck not in fits or segs is None:
            return 0.0
        k, _, _, _, ds = fits[ck]
        nbytes = max(1, int(e0.get("in_msg_size") or 1) * trace_sim._dtype_bytes(e0))
        b = min(ds, key=lambda x: abs(math.log(x) - math.log(nbytes)))
        d = ds[b]
        each = [walk(d, k, seg) for seg in segs]
        return SCALE * ((max(each) if MAX else sum(each) / len(each)) - float(model(d, draws[ck + (b,)], k).mean()))

    return extra


if __name__ == "__main__":
    install(segments, rate_charge)
    offline.main()
