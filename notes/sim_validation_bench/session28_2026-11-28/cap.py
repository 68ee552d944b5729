"""Per case directory: the free core time (CORES minus the ranks computing, integrated) between DDP's
bucket's last issue and its mean completion; if a bucket needed a fixed amount of it, this would be
constant (session 28: it is not, 1.2 - 9.5 core-ms at W = 4).

    python cap.py RUN_DIR/w4_tw_plain"""
import os
import statistics
import sys

import numpy as np

from wall import buckets, rank_blocks

d = sys.argv[1]; C = float(os.environ.get("CORES", "2"))
W, tr = rank_blocks(d)
# idle intervals per rank: blocked in a wait, or in a blocking call (excluding async launches)
idle = {r: [(x[2], x[3]) for x in tr[r] if x[5] == "wait" or not x[4].get("async")] for r in range(W)}
res = []
for per in buckets(W, tr):
    L, dones = [p[1] for p in per], [p[2] for p in per]
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
