import sys, statistics as st
from pathlib import Path
import numpy as np
from neo_train.topology.calibrate import Calibration
from neo_train.topology.trace_input import load_trace, rank_timelines, compute_after
case = Path(sys.argv[1]); marker = sys.argv[2]
traces = load_trace(case)
blocks, colls = rank_timelines(traces)
after = compute_after(blocks)
rows = []
for key, by_rank in colls.items():
    e0 = by_rank[min(by_rank)]
    if (e0.get("markers") or ["?"])[-1] != marker or (e0.get("step") or 0) < 4: continue
    asy = e0.get("async")
    arr = np.array([(e["startTime_ns"] + (e["call_ns"] if asy else 0)) for e in by_rank.values()]) / 1e6
    ret = np.array([(e["startTime_ns"] + e["duration_ns"]) for e in by_rank.values()]) / 1e6
    last = arr.max()
    rows.append(((last - arr).mean(), ret.min() - last, (ret - ret.min()).mean(), ret.mean() - last, after.get(key, float('nan')) * 1e3))
a = np.array(rows)
print(f"{case.name} {marker} n={len(a)}: lead {a[:,0].mean():.2f}  first {a[:,1].mean():.2f}  spread {a[:,2].mean():.2f}  mean-return {a[:,3].mean():.2f}  after {a[:,4].mean():.2f} ms")
