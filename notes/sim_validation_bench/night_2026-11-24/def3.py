import sys, json
from collections import defaultdict
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology.calibrate import Calibration
W = int(sys.argv[1])
agg = defaultdict(lambda: [0.0, 0.0, 0])
for run in sys.argv[2:]:
    d = json.load(open(run + ".json"))
    cals = {k: Calibration.from_dict(v) for k, v in d["calibrations"].items()}
    for row in d["rows"]:
        if row["W"] != W: continue
        cal = cals[f"{W}:busy:{row['mode']}"]
        for rep in row["repeats"]:
            p = sv.predict({"W": W, "trace": rep["trace"]}, cal, 4)
            steps = p["steady_steps"]
            for c in p["collectives"]:
                a = agg[(row["plan"], row["mode"], c["marker"], c["mode"])]
                a[0] += c["measured_blocked_mean_s"] * c["n"] / steps / W; a[1] += c["predicted_blocked_mean_s"] * c["n"] / steps / W; a[2] += 1
            a = agg[(row["plan"], row["mode"], "STEP", "")]; a[0] += p["measured_step_mean_ms"] / 1e3; a[1] += p["predicted_step_mean_ms"] / 1e3; a[2] += 1
for k, (m, pr, n) in sorted(agg.items()):
    print(f"{k[0]:<5} {k[1]:<9} {k[2]:<22} {k[3]:<5} meas {m/n*1e3:6.3f} pred {pr/n*1e3:6.3f} diff {(pr-m)/n*1e3:+6.3f} ms")
