"""Per asynchronous collective instance of a run's kept traces: the compute its ranks did after the
last rank's issue until their join (mean over ranks: c_mean; the most: c_max; ranks computing at
the issue: busy), and its completion after the last issue (net, mean over ranks, from
duration_ns): is the net time a function of the compute over it, as in the calibration?

    python windows.py RUN_DIR [marker]"""
import statistics
import sys
from pathlib import Path

import numpy as np

from neo_train.topology.trace_input import load_trace, rank_timelines


def windows(traces, marker=None):
    blocks, colls = rank_timelines(traces)
    pos = {}  # (rank, key) -> (launch index in the rank's blocks)
    for r, mine in blocks.items():
        for i, b in enumerate(mine):
            if b.kind == "call" and not b.sync:
                pos[(r, b.colls[0])] = i
    out = []
    for key, by_rank in colls.items():
        e0 = by_rank[min(by_rank)]
        if not e0.get("async") or (marker and marker not in (e0.get("markers") or [])) or e0.get("step") is None or e0["step"] < 4:
            continue
        if any((r, key) not in pos or e.get("duration_ns") is None for r, e in by_rank.items()):
            continue
        iss = {r: e["startTime_ns"] + e.get("issue_ns", e["call_ns"]) for r, e in by_rank.items()}
        last = max(iss.values())
        net = statistics.fmean((e["startTime_ns"] + e["duration_ns"] - last) / 1e6 for e in by_rank.values())
        cs = []
        for r in by_rank:
            mine, i = blocks[r], pos[(r, key)]
            t, skip, c = 0.0, (last - iss[r]) / 1e9, 0.0
            segs = [(False, mine[i].blocked - mine[i].starts_at)]
            for b in mine[i + 1:]:
                segs.append((True, b.compute))
                if b.kind == "wait" and key in b.colls:
                    break
                segs.append((False, b.blocked))
            for comp, s in segs:
                a, z = max(t, skip), t + s
                if comp and z > a:
                    c += z - a
                t = z
            cs.append(c * 1e3)
        out.append((net, float(np.mean(cs)), float(np.max(cs)), tuple(e0.get("markers") or ()), len(by_rank)))
    return out


if __name__ == "__main__":
    run = Path(sys.argv[1])
    mk = sys.argv[2] if len(sys.argv) > 2 else None
    for d in sorted(run.iterdir()):
        if not d.is_dir() or "_r" in d.name[-3:]:
            continue
        w = windows(load_trace(d), mk)
        if not w:
            continue
        net, cm = np.array([x[0] for x in w]), np.array([x[1] for x in w])
        order = np.argsort(cm)
        parts = np.array_split(order, 3)
        print(f"{d.name:20s} n {len(w):4d} " + " | ".join(f"c {cm[p].mean():5.1f}: net {net[p].mean():5.2f} (p50 {np.median(net[p]):5.2f})" for p in parts))
