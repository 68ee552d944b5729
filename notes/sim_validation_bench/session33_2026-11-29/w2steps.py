"""One W = 2 case's steps 5-13 from its two ranks' traces: the backward output dist's launch and wait end, DDP's
bucket's issue, completion, join wait and the compute before the join, and the bucket's net time (its last issue to
the mean completion). usage: w2steps.py TRACE_DIR (session 33, FJ's w2_tw_pipelined)."""
import json, sys
d = sys.argv[1]
tr = {r: json.load(open(f"{d}/trace_rank{r}.json")) for r in (0, 1)}
def by_step(es):
    out = {}
    for e in es:
        if "startTime_ns" in e and e.get("step") is not None: out.setdefault(e["step"], []).append(e)
    return out
S = {r: by_step(tr[r]) for r in tr}
for step in sorted(S[0])[5:14]:
    rows = {}
    for r in (0, 1):
        for e in S[r][step]:
            m = e["markers"][0]
            if m in ("output_dist_bwd", "dense_allreduce"):
                rows[(r, m)] = e
    t0 = min(e["startTime_ns"] for e in rows.values())
    f = lambda x: (x - t0) / 1e6
    line = []
    for r in (0, 1):
        a = rows[(r, "output_dist_bwd")]; b = rows[(r, "dense_allreduce")]
        line.append(f"r{r}: a2a@{f(a['startTime_ns']):5.2f} waitend {f(a['startTime_ns']+a['duration_ns']):5.2f}(wait {a['wait_ns']/1e6:4.2f}) | bkt issue {f(b['startTime_ns']+b['issue_ns']):5.2f} done {f(b['startTime_ns']+b['duration_ns']):5.2f} join-wait {b['wait_ns']/1e6:4.2f} wc {b['wait_compute_ns']/1e6:4.2f}")
    i0 = rows[(0,'dense_allreduce')]; i1 = rows[(1,'dense_allreduce')]
    last = max(i0['startTime_ns']+i0['issue_ns'], i1['startTime_ns']+i1['issue_ns'])
    net = ((i0['startTime_ns']+i0['duration_ns'])+(i1['startTime_ns']+i1['duration_ns']))/2 - last
    print(step, " || ".join(line), f" net {net/1e6:.2f}")
