import sys, glob, json, collections
import numpy as np
from neo_train.topology.trace_input import load_trace, rank_timelines
from neo_train.topology.calibrate import Calibration
cal = Calibration.load(sys.argv[1])
for d in sys.argv[2:]:
    traces = load_trace(d)
    blocks, colls = rank_timelines(traces)
    L = collections.defaultdict(list); nb = collections.Counter(); n = collections.Counter()
    for key, by_rank in colls.items():
        es = list(by_rank.values())
        if any(e.get("step") is None or e["step"] < 4 for e in es): continue
        kind = es[0]["comms"]; asy = bool(es[0].get("async"))
        if not asy:
            rets = np.array([e["startTime_ns"] + e["call_ns"] for e in es]) / 1e6
            L[(kind, "sync")].extend(sorted(rets - rets.min())[1:]); continue
        n[kind] += 1
        ws = [(e["startTime_ns"] + e["duration_ns"] - (e.get("wait_ns") or 0), e["startTime_ns"] + e["duration_ns"]) for e in es]
        if any(w[0] is None for w in ws): continue
        blk = [(a / 1e6, b / 1e6) for a, b in ws if b - a > 20000]
        if len(blk) >= 1: nb[kind] += 1
        if len(blk) == 2:
            r = sorted(b for a, b in blk); L[(kind, "async")].append(r[1] - r[0])
    print(d.split("/")[-1], {k: "%d/%d" % (nb[k], n[k]) for k in n})
    for k, v in sorted(L.items()):
        v = np.array(v)
        if len(v): print("   %-12s %-5s n=%3d mean lag %.3f p50 %.3f p90 %.3f max %.2f" % (k[0], k[1], len(v), v.mean(), np.median(v), np.percentile(v, 90), v.max()))
for k in ("all_to_allv", "all_gather", "all_reduce"):
    print("calibration later-rank lag (2 x spread) g=2:", k, "sync %.3f async %.3f" % (2 * cal.spread(k, 2, False) * 1e3, 2 * cal.spread(k, 2, True) * 1e3))
