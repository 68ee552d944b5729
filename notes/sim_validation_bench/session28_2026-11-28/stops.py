"""Per case directory of a kept run: DDP's bucket's net time and when each rank's compute over it
ended (its join began), k-th rank, after the last issue; medians over steady steps (session 28).

    python stops.py RUN_DIR/w4_tw_plain"""
import os
import statistics
import sys

from wall import buckets, rank_blocks

d = sys.argv[1]
W, tr = rank_blocks(d)
rows = []
for per in buckets(W, tr):
    launches, dones = [p[1] for p in per], [p[2] for p in per]
    # the rank's join starts: its compute over the bucket ends
    stops = [next(x for x in tr[r] if x[0] == tr[r][i][4]["wait_order"])[2] for r, (i, _, _) in enumerate(per)]
    L = max(launches); D = statistics.fmean(dones)
    st = sorted(s - L for s in stops)
    rows.append(((D - L) / 1e6, [x / 1e6 for x in st]))
print(f"{os.path.basename(d):22s} n={len(rows)} net {statistics.median(r[0] for r in rows):5.2f} | join starts after last issue (k-th rank): " +
      " ".join(f"{statistics.median(r[1][k] for r in rows):5.2f}" for k in range(W)) +
      " | done - k-th join: " + " ".join(f"{statistics.median(r[0]-r[1][k] for r in rows):+5.2f}" for k in range(W)))
