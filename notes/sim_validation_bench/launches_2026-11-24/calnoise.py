import sys, json, statistics, glob
from pathlib import Path
sys.path.insert(0, "benchmarks")
import sim_validation as sv
from neo_train.topology.calibrate import DEFAULT_SIZES, fit_calibration
from neo_train.testing import run_ranks

def body(comm, sizes, iters, busy_s, overlap_s, tiled):
    from neo_train.topology.calibrate import measure_collectives
    return measure_collectives(comm, sizes=sizes, iters=iters, busy_s=busy_s, overlap_s=overlap_s, tiled=tiled)

if __name__ == "__main__":
    W = int(sys.argv[1]); wd = Path(sys.argv[2]); plan = sys.argv[3].split(",")
    traces = sorted(glob.glob(f"{wd}/rep0/w{W}_*"))
    duties = [sv.duty(t, 4) for t in traces]
    gap = statistics.median(d[0] for d in duties)
    by_kind = {k: statistics.median(d[2][k] for d in duties if k in d[2]) for k in sorted({k for d in duties for k in d[2]})}
    preds = {t: [] for t in traces}; meas = {}
    for label in plan:
        iters, tiled = int(label.rstrip("t")), label.endswith("t")
        samples = run_ranks(body, W, list(DEFAULT_SIZES), iters, gap, by_kind, tiled, timeout_s=900)[0]
        cal = fit_calibration(samples, world_size=W, transport="gloo", device="cpu", meta={})
        for t in traces:
            p = sv.predict({"trace": t, "W": W}, cal, 4)
            preds[t].append(p["step_error"]); meas[t] = p["measured_step_ms"]
        print(label, "done", flush=True)
    print("case".ljust(22), " ".join(l.rjust(7) for l in plan))
    for t in traces:
        print(t.split("/")[-1].ljust(22), " ".join("%+7.1f" % (100 * e) for e in preds[t]))
