import sys, json, os, statistics
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology.calibrate import Calibration
for run in sys.argv[1:]:
    d = json.load(open(run + ".json"))
    cals = {k: Calibration.from_dict(v) for k, v in d["calibrations"].items()}
    for row in d["rows"]:
        cal = cals[f"{row['W']}:busy:{row['mode']}"]
        rows = [row | {k: rep[k] for k in ("repeat", "trace")} | sv.predict({"W": row["W"], "trace": rep["trace"]}, cal, 4) for rep in row["repeats"]]
        m = sv.merge_repeats(rows)
        print(f"W={row['W']} {row['plan']:<5} {row['mode']:<9} mean {m['step_mean_error']:+6.1%} (was {row['step_mean_error']:+6.1%}) coll {m['collectives_within_goal']}")
