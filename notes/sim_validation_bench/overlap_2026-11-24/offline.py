"""Refit a benchmark run's calibrations from their samples with the current code, predict the
traces of one or more runs, and count the collective rows within +-25 % (pooled over repeats)."""
import sys, re, json
sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
import sim_validation as sv
from neo_train.topology.calibrate import Calibration, fit_calibration

import os
import neo_train.topology.trace_sim as ts
mode = os.environ.get("MODE", "walk")
if mode == "total":
    ts.compute_in_flight = lambda flight, lat: sum(x for x, _ in flight)
elif mode == "none":
    ts.compute_in_flight = lambda flight, lat: None
elif mode == "first":  # compute until the first block after the launch
    ts.compute_in_flight = lambda flight, lat: flight[0][0] if flight else 0.0
calbase = Path(sys.argv[1])
runs = [Path(a) for a in sys.argv[2:]]
cals = {}
for f in calbase.glob("calibration_w*_busy*.json"):
    m = re.match(r"calibration_w(\d+)_busy[\d.]+ms_(\w+)\.json", f.name)
    c = Calibration.load(f)
    smp = [x for x in c.samples if x.get("pass") != "overlap"] if mode == "old" else c.samples
    cals[(int(m.group(1)), m.group(2))] = fit_calibration(smp, world_size=c.world_size, transport=c.transport,
                                                          device=c.device, meta=c.meta)
tot = ok = sok = stot = 0
for run in runs:
    cases = {}
    for d in sorted(run.iterdir()):
        if not d.is_dir(): continue
        name = re.sub(r"_r\d+$", "", d.name)
        cases.setdefault(name, []).append(d)
    for name, dirs in sorted(cases.items()):
        W = int(name[1]); mode = "pipelined" if "pipelined" in name else "plain"
        rows = []
        for i, d in enumerate(dirs):
            r = sv.predict({"trace": str(d), "W": W}, cals[(W, mode)], 4)
            rows.append(r | {"repeat": i, "trace": str(d), "trainer_step_ms": 0, "load_before": 0, "load_after": 0, "run_wall_s": 0})
        m = sv.merge_repeats(rows)
        colls = sv.steady_collectives(m["collectives"], m["steady_steps"])
        bad = [f"{c['marker']}{c['error']:+.0%}" for c in colls if abs(c["error"]) > 0.25]
        tot += len(colls); ok += len(colls) - len(bad); stot += 1; sok += abs(m["step_mean_error"]) <= 0.15
        print(f"{run.name:6s} {name:20s} step {m['step_mean_error']:+6.1%}  {len(colls)-len(bad)}/{len(colls)} {' '.join(bad)}", flush=True)
print(f"steps {sok}/{stot}, collectives {ok}/{tot}")
