"""Per case directory: the free core time (CORES minus the ranks computing, integrated) between DDP's
bucket's last issue and its mean completion; if a bucket needed a fixed amount of it, this would be
constant (session 28: it is not, 1.2 - 9.5 core-ms at W = 4).

    python cap.py RUN_DIR/w4_tw_plain"""
import json, sys, glob, statistics, os
import numpy as np
sys.path.insert(0, "/tmp/d")
d = sys.argv[1]; C = float(os.environ.get("CORES", "2"))
W = len(glob.glob(d + "/trace_rank*.json"))
def blocks_of(es):
    bl = []
    for e in es:
        bl.append((e["order"], e.get("compute_ns") or 0, e.get("call_ns") or 0, e, "call"))
        if e.get("wait_order") is not None:
            bl.append((e["wait_order"], e.get("wait_compute_ns") or 0, e.get("wait_ns") or 0, e, "wait"))
    bl.sort(key=lambda x: x[0])
    t = None; res = []
    for o, c, b, e, k in bl:
        t0 = e["startTime_ns"] if k == "call" else t + c
        res.append((o, t0 - c, t0, t0 + b, e, k))
        t = t0 + b
    return res
tr = {r: blocks_of(json.load(open(f"{d}/trace_rank{r}.json"))) for r in range(W)}
# idle intervals per rank: blocked in a wait, or in a blocking call (excluding async launches)
idle = {r: [(x[2], x[3]) for x in tr[r] if x[5] == "wait" or not x[4].get("async")] for r in range(W)}
res = []
for x in tr[0]:
    o, cs, bs, be, e, k = x
    if not (k == "call" and e["comms"] == "all_reduce" and e.get("async") and "dense_allreduce" in e["markers"] and (e.get("step") or 0) >= 5):
        continue
    seq = (e["pg_id"], e["seqnum"])
    L, dones = [], []
    for r in range(W):
        y = next(y for y in tr[r] if y[5] == "call" and (y[4]["pg_id"], y[4]["seqnum"]) == seq)
        L.append(y[2] + (y[4].get("issue_ns") or 0)); dones.append(y[4]["startTime_ns"] + y[4]["duration_ns"])
    t0 = max(L); t1 = statistics.fmean(dones)
    grid = np.linspace(t0, t1, 400); dt = (t1 - t0) / 400 / 1e6
    busy = np.zeros_like(grid)
    for r in range(W):
        isidle = np.zeros_like(grid, dtype=bool)
        for a, z in idle[r]:
            isidle |= (grid >= a) & (grid < z)
        busy += ~isidle
    free = np.clip(C - busy, 0, None)
    res.append(((t1 - t0) / 1e6, float(free.sum() * dt), float((busy < C).sum() * dt), float((busy == 0).sum() * dt)))
a = np.array(res)
print(f"{os.path.basename(d):22s} n={len(a)} net {np.median(a[:,0]):5.2f} | free core-ms med {np.median(a[:,1]):5.2f} mean {a[:,1].mean():5.2f} | time with a free core {np.median(a[:,2]):5.2f} | all idle {np.median(a[:,3]):5.2f}")
