import sys, glob, os, re, statistics
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology.calibrate import Calibration, fit_calibration
root = sys.argv[1]; refit = len(sys.argv) > 2 and sys.argv[2] == "refit"
cals = {}
for f in glob.glob(f"{root}/calibration_w*_busy*.json"):
    W = int(re.search(r"_w(\d)_", f).group(1))
    c = Calibration.load(f)
    if refit:
        c = fit_calibration(c.samples, world_size=c.world_size, transport=c.transport, device=c.device, meta=c.meta)
    cals[W] = c
errs = []; coll = 0; colln = 0
for d in sorted(glob.glob(f"{root}/w*_*_*")):
    name = os.path.basename(d); W = int(name[1])
    if W not in cals: continue
    r = sv.predict({"trace": d, "W": W}, cals[W], 4)
    errs.append(r["step_error"])
    cw = r["collectives_within_goal"]
    coll += sum(1 for x in cw if x); colln += len(cw)
print(root, "refit" if refit else "kept", "within 15%:", sum(abs(e) <= 0.15 for e in errs), "of", len(errs), "median", round(100*statistics.median(errs), 1), "coll", coll, "/", colln, "under", sum(e < 0 for e in errs))
