import sys
from pathlib import Path
import numpy as np
from neo_train.topology.trace_input import load_trace, rank_timelines
case = Path(sys.argv[1]); marker = sys.argv[2]
blocks, colls = rank_timelines(load_trace(case))
calls, lastcall, startlead = [], [], []
for key, by_rank in colls.items():
    e0 = by_rank[min(by_rank)]
    if (e0.get("markers") or ["?"])[-1] != marker or (e0.get("step") or 0) < 4: continue
    s = np.array([e["startTime_ns"] for e in by_rank.values()]) / 1e6
    c = np.array([e["call_ns"] for e in by_rank.values()]) / 1e6
    arr = s + c
    calls.append(c); lastcall.append(c[arr.argmax()]); startlead.append(arr.max() - s.max())
calls = np.array(calls)
print(f"{case.name} {marker}: launch ms mean {calls.mean():.3f} median {np.median(calls):.3f} p90 {np.quantile(calls,.9):.3f}; "
      f"the last arriver's launch {np.mean(lastcall):.3f}; last launch return - last start {np.mean(startlead):.3f}")
