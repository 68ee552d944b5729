"""W = 2 TWRW: DDP's bucket against the blocking calls after its launch (ms after the last issue; medians)."""
import os
import statistics
import sys

from wall import buckets, rank_blocks

d = sys.argv[1]
W, tr = rank_blocks(d)
rows = []
for bucket in buckets(W, tr):
    per = []
    for r, (i, issue, done) in enumerate(bucket):
        nxt = [y for y in tr[r][i + 1:] if (y[5] == "wait" or not y[4].get("async"))][:2]
        per.append((issue, done, [(y[2], y[3], y[4]["markers"][0], y[5]) for y in nxt]))
    L = max(p[0] for p in per); done = statistics.fmean(p[1] for p in per)
    rows.append(((done - L) / 1e6, [[((a - L) / 1e6, (z - L) / 1e6, m, k) for a, z, m, k in p[2]] for p in per]))
print(os.path.basename(d), "bucket net median", round(statistics.median(r[0] for r in rows), 2))
for r in rows[:6]:
    print(f"  net {r[0]:5.2f} | " + " || ".join("; ".join(f"{m}:{k} {a:5.2f}-{z:5.2f}" for a, z, m, k in p) for p in r[1]))
