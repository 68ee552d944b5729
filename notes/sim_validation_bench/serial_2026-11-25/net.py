"""Per collective marker of one trace directory (steps >= 4): the median net time (the last rank's issue to
the ranks' median completion) and the mean time issue to done, ms.

    python net.py TRACE_DIR
"""
import json, sys, glob, statistics as st
d = sys.argv[1]
ranks = [json.load(open(f)) for f in sorted(glob.glob(d + "/trace_rank*.json"))]
out = {}
for marker in ("dense_allreduce", "output_dist_bwd", "input_dist", "output_dist"):
    per = [[e for e in r if e["markers"] == [marker] and (e.get("step") or 0) >= 4] for r in ranks]
    n = min(len(p) for p in per)
    if not n: continue
    nets, took = [], []
    for i in range(n):
        es = [p[i] for p in per]
        last = max(e["startTime_ns"] for e in es)
        end = st.median(e["startTime_ns"] + e["duration_ns"] for e in es)
        nets.append((end - last) / 1e6); took.append(st.mean(e["duration_ns"] for e in es) / 1e6)
    out[marker] = (st.median(nets), st.mean(took))
steps = []
r0 = ranks[0]
print(" ".join(f"{m}: net {a:.2f} took {b:.2f}" for m, (a, b) in out.items()))
