import sys, json, dataclasses, statistics
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology.calibrate import Calibration
for run in sys.argv[1:]:
    d = json.load(open(run + ".json"))
    cals = {k: Calibration.from_dict(v) for k, v in d["calibrations"].items()}
    res = {"with": [], "without": []}
    for row in d["rows"]:
        cal = cals[f"{row['W']}:busy:{row['mode']}"]
        bare = dataclasses.replace(cal, async_kinds={k: dataclasses.replace(f, concurrent_s={}) for k, f in cal.async_kinds.items()})
        for label, c in (("with", cal), ("without", bare)):
            rows = [row | {k: rep[k] for k in ("repeat", "trace")} | sv.predict({"W": row["W"], "trace": rep["trace"]}, c, 4) for rep in row["repeats"]]
            m = sv.merge_repeats(rows)
            res[label].append((row["W"], m["step_mean_error"], m["collectives_within_goal"][0]))
    for label, v in res.items():
        by = {W: [e for w, e, _ in v if w == W] for W in (2, 3, 4)}
        print(f"{run.split('/')[-1]} {label:<8} steps {sum(abs(e) <= .15 for _, e, _ in v)}/24 collectives {sum(c for *_, c in v)}  median err " +
              " ".join(f"W={W} {statistics.median(es):+.1%}" for W, es in by.items()) + f"  all {statistics.median(e for _, e, _ in v):+.1%}")
