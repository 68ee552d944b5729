"""Per case directory of a kept run: DDP's bucket's net time and when each rank's compute over it
ended (its join began), k-th rank, after the last issue; medians over steady steps (session 28).

    python stops.py RUN_DIR/w4_tw_plain"""
import json, sys, glob, statistics, os
d = sys.argv[1]
W = len(glob.glob(d + "/trace_rank*.json"))
out = {}
def blocks_of(es):
    # (order, compute_before, blocked, entry, kind)
    bl = []
    for e in es:
        bl.append((e["order"], e.get("compute_ns") or 0, e.get("call_ns") or 0, e, "call"))
        if e.get("wait_order") is not None:
            bl.append((e["wait_order"], e.get("wait_compute_ns") or 0, e.get("wait_ns") or 0, e, "wait"))
    bl.sort(key=lambda x: x[0])
    # wall clock: anchor each call at its startTime_ns
    t = None; res = []
    for o, c, b, e, k in bl:
        if k == "call":
            t0 = e["startTime_ns"]
        else:
            t0 = t + c
        res.append((o, t0 - c, t0, t0 + b, e, k))  # compute from, block start, block end
        t = t0 + b
    return res
tr = {r: blocks_of(json.load(open(f"{d}/trace_rank{r}.json"))) for r in range(W)}
rows = []
for r0blk in tr[0]:
    o, cs, bs, be, e, k = r0blk
    if not (k == "call" and e["comms"] == "all_reduce" and e.get("async") and "dense_allreduce" in e["markers"] and (e.get("step") or 0) >= 5):
        continue
    seq = (e["pg_id"], e["seqnum"])
    stops, launches, dones = [], [], []
    for r in range(W):
        blk = tr[r]
        i = next(i for i, x in enumerate(blk) if x[5] == "call" and (x[4]["pg_id"], x[4]["seqnum"]) == seq)
        ee = blk[i][4]
        launches.append(blk[i][2] + (ee.get("issue_ns") or 0))
        dones.append(ee["startTime_ns"] + ee["duration_ns"])
        j = next(j for j, x in enumerate(blk) if x[0] == ee["wait_order"])
        stops.append(blk[j][2])  # the rank's join starts: its compute over the bucket ends
    L = max(launches); D = statistics.fmean(dones)
    st = sorted(s - L for s in stops)
    rows.append(((D - L) / 1e6, [x / 1e6 for x in st]))
print(f"{os.path.basename(d):22s} n={len(rows)} net {statistics.median(r[0] for r in rows):5.2f} | join starts after last issue (k-th rank): " +
      " ".join(f"{statistics.median(r[1][k] for r in rows):5.2f}" for k in range(W)) +
      " | done - k-th join: " + " ".join(f"{statistics.median(r[0]-r[1][k] for r in rows):+5.2f}" for k in range(W)))
