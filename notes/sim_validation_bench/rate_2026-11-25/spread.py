"""DDP's buckets (joined by the backward) in one trace directory: how far apart the ranks saw
them complete (their futures' callbacks), the first completion after the last issue, and how far
apart the ranks issued them (ms, p10 to p90).

    python spread.py RUN_DIR/w4_rw_plain"""
import sys, statistics
from neo_train.topology.trace_input import load_trace
tr = load_trace(sys.argv[1])
by = {}
for r, es in tr.items():
    for e in es:
        if isinstance(e, dict) and e.get("joined_by") == "backward" and e.get("duration_ns"):
            by.setdefault((e.get("pg_id"), e.get("seqnum")), {})[r] = e
sp, tk, iss = [], [], []
for k, d in by.items():
    if len(d) < 2: continue
    ends = [e["startTime_ns"] + e["duration_ns"] for e in d.values()]
    starts = [e["startTime_ns"] + e.get("issue_ns", 0) for e in d.values()]
    sp.append((max(ends) - min(ends)) / 1e6); tk.append((min(ends) - max(starts)) / 1e6); iss.append((max(starts)-min(starts))/1e6)
q = lambda v: [round(x, 2) for x in statistics.quantiles(v, n=10)[::2]]
print(sys.argv[1].split('/')[-1], "n", len(sp), "completion spread over ranks ms p10..p90", q(sp), "| first completion - last issue", q(tk), "| issue spread", q(iss))
