"""What the session's trace scripts (stops.py, cap.py, twrw2.py) share: a kept case's per-rank
blocks on the wall clock, rebuilt from the trace's entries (each call anchored at its startTime_ns,
a wait after the compute before it)."""
import glob
import json


def blocks_of(entries):
    """[(order, compute from, block start, block end, entry, 'call' | 'wait')] of one rank, ns."""
    bl = []
    for e in entries:
        bl.append((e["order"], e.get("compute_ns") or 0, e.get("call_ns") or 0, e, "call"))
        if e.get("wait_order") is not None:
            bl.append((e["wait_order"], e.get("wait_compute_ns") or 0, e.get("wait_ns") or 0, e, "wait"))
    bl.sort(key=lambda x: x[0])
    t, res = None, []
    for o, c, b, e, k in bl:
        t0 = e["startTime_ns"] if k == "call" else t + c
        res.append((o, t0 - c, t0, t0 + b, e, k))
        t = t0 + b
    return res


def rank_blocks(d):
    """(W, {rank: blocks_of(its trace)}) of a kept case directory."""
    W = len(glob.glob(d + "/trace_rank*.json"))
    return W, {r: blocks_of(json.load(open(f"{d}/trace_rank{r}.json"))) for r in range(W)}


def is_bucket(block):
    """A steady step's launch of DDP's bucket."""
    e = block[4]
    return (block[5] == "call" and e["comms"] == "all_reduce" and e.get("async")
            and "dense_allreduce" in e["markers"] and (e.get("step") or 0) >= 5)


def buckets(W, tr):
    """Per steady step's bucket: [(index of its launch in tr[r], issue ns, completion ns)] per rank."""
    for x in tr[0]:
        if not is_bucket(x):
            continue
        seq = (x[4]["pg_id"], x[4]["seqnum"])
        per = []
        for r in range(W):
            i = next(i for i, y in enumerate(tr[r]) if y[5] == "call" and (y[4]["pg_id"], y[4]["seqnum"]) == seq)
            e = tr[r][i][4]
            per.append((i, tr[r][i][2] + (e.get("issue_ns") or 0), e["startTime_ns"] + e["duration_ns"]))
        yield per
