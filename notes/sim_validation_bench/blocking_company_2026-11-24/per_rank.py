"""per-rank arrival skew and return after the last arrival, measured vs predicted, for one marker."""
import sys, re, statistics as st
from pathlib import Path
from collections import defaultdict
from neo_train.topology.calibrate import Calibration, fit_calibration
from neo_train.topology.trace_input import load_trace
from neo_train.topology.trace_sim import simulate_calibrated
case = Path(sys.argv[1]); marker = sys.argv[2]
W = int(case.name[1]); mode = "pipelined" if "pipelined" in case.name else "plain"
calf = next(case.parent.glob(f"calibration_w{W}_busy*_{mode}.json"))
c = Calibration.load(calf)
cal = fit_calibration(c.samples, world_size=c.world_size, transport=c.transport, device=c.device, meta=c.meta)
traces = load_trace(case)
tl, res, n = simulate_calibrated(traces, cal)
end = {p.name: p.end for p in res.phases}
start_pred = {k: end[a] for k, (a, _) in tl.nodes.items()}
end_pred = {k: end[b] for k, (_, b) in tl.nodes.items()}
call_of, wait_of = {}, {}
for rank, blocks in tl.blocks.items():
    for b in blocks:
        for k in b.colls:
            (call_of if b.kind == "call" else wait_of)[(rank, k)] = b
# measured per-rank clock: rebuild like validate_timeline (rank-local) but use wall clock startTime_ns
acc = defaultdict(lambda: defaultdict(list))
for key, by_rank in tl.colls.items():
    e0 = by_rank[min(by_rank)]
    if (e0.get("markers") or ["?"])[-1] != marker: continue
    c0 = call_of[(min(by_rank), key)]
    if c0.step is None or c0.step < 4: continue
    arr_m, ret_m, arr_p, ret_p = {}, {}, {}, {}
    for r, e in by_rank.items():
        c = call_of[(r, key)]
        if c.sync:
            arr_m[r] = e["startTime_ns"] / 1e6; ret_m[r] = (e["startTime_ns"] + e["call_ns"]) / 1e6
            arr_p[r] = start_pred[(r, c.order)] * 1e3; ret_p[r] = end_pred[(r, c.order)] * 1e3
        else:
            w = wait_of.get((r, key))
            arr_m[r] = (e["startTime_ns"] + e["call_ns"]) / 1e6; ret_m[r] = (e["startTime_ns"] + e["duration_ns"]) / 1e6
            arr_p[r] = end_pred[(r, c.order)] * 1e3
            ret_p[r] = (end_pred[(r, w.order)] if w is not None else end[tl.comm_end[key]]) * 1e3
            acc[r]["wstart_m"].append((e["startTime_ns"] + e["duration_ns"] - e.get("wait_ns", 0)) / 1e6 - max(arr_m.values()) if False else 0)
    lm, lp = max(arr_m.values()), max(arr_p.values())
    for r in by_rank:
        acc[r]["arr_m"].append(arr_m[r] - lm); acc[r]["arr_p"].append(arr_p[r] - lp)
        acc[r]["ret_m"].append(ret_m[r] - lm); acc[r]["ret_p"].append(ret_p[r] - lp)
        acc[r]["last_m"].append(arr_m[r] == lm); acc[r]["last_p"].append(arr_p[r] == lp)
print(f"{case.name} {marker} passes {n}; ms relative to the last arrival (mean over steady instances)")
print(" rank  arrive meas/pred   return meas/pred   last meas/pred")
for r in sorted(acc):
    a = acc[r]
    print(f" {r:4d}  {st.fmean(a['arr_m']):6.2f} {st.fmean(a['arr_p']):6.2f}   {st.fmean(a['ret_m']):6.2f} {st.fmean(a['ret_p']):6.2f}"
          f"   {st.fmean(a['last_m']):.2f} {st.fmean(a['last_p']):.2f}")
