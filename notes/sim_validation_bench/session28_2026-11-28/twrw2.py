"""W = 2 TWRW: DDP's bucket against the blocking calls after its launch (ms after the last issue; medians)."""
import json, sys, glob, statistics, os
sys.path.insert(0, "/tmp/d")
d = sys.argv[1]
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
rows = []
for x in tr[0]:
    e = x[4]
    if not (x[5] == "call" and e["comms"] == "all_reduce" and e.get("async") and "dense_allreduce" in e["markers"] and (e.get("step") or 0) >= 5):
        continue
    seq = (e["pg_id"], e["seqnum"])
    per = []
    for r in range(W):
        blk = tr[r]
        i = next(i for i, y in enumerate(blk) if y[5] == "call" and (y[4]["pg_id"], y[4]["seqnum"]) == seq)
        ee = blk[i][4]
        L = blk[i][2] + (ee.get("issue_ns") or 0)
        nxt = [y for y in blk[i+1:] if (y[5] == "wait" or not y[4].get("async"))][:2]
        per.append((L, ee["startTime_ns"] + ee["duration_ns"], [(y[2], y[3], y[4]["markers"][0], y[5]) for y in nxt]))
    L = max(p[0] for p in per); done = statistics.fmean(p[1] for p in per)
    rows.append(((done - L) / 1e6, [[((a - L) / 1e6, (z - L) / 1e6, m, k) for a, z, m, k in p[2]] for p in per]))
print(os.path.basename(d), "bucket net median", round(statistics.median(r[0] for r in rows), 2))
for r in rows[:6]:
    print(f"  net {r[0]:5.2f} | " + " || ".join("; ".join(f"{m}:{k} {a:5.2f}-{z:5.2f}" for a, z, m, k in p) for p in r[1]))
