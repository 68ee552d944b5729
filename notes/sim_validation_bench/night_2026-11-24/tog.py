import sys, json, os, statistics, time, pickle
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology.calibrate import DEFAULT_SIZES, fit_calibration
from neo_train.testing import run_ranks

def body(comm, sizes, iters, busy, ov, together=None):
    from neo_train.topology.calibrate import measure_collectives
    return measure_collectives(comm, sizes=sizes, iters=iters, busy_s=busy, overlap_s=ov, together=together)

if __name__ == "__main__":
    run = sys.argv[1]; W = int(sys.argv[2]); iters = int(sys.argv[3]); modes = sys.argv[4].split(",")
    d = json.load(open(run + ".json"))
    for mode in modes:
        rows = [r for r in d["rows"] if r["calibration"] == "busy" and r["W"] == W and r["mode"] == mode]
        cases = [{"W": W, "trace": rep["trace"], "plan": r["plan"]} for r in rows for rep in r["repeats"]]
        gap, overlap, by_kind = sv.run_duties(cases, 4)
        t0 = time.perf_counter()
        samples = run_ranks(body, W, list(DEFAULT_SIZES), iters, gap, by_kind, timeout_s=900)[0]
        tcal = time.perf_counter() - t0
        pickle.dump(samples, open(f"/tmp/s18/tog_w{W}_{mode}_{os.path.basename(run)}_{int(time.time())}.pkl", "wb"))
        cal1 = fit_calibration(samples, world_size=W, transport="gloo", device="cpu", meta={})
        cal0 = fit_calibration([s for s in samples if not s.get("pass")], world_size=W, transport="gloo", device="cpu", meta={})
        cal1.save(f"/tmp/s18/cal_tog_w{W}_{mode}.json")
        print(f"calibration {tcal:.0f} s; together (us):", {k: {g: round(v * 1e6) for g, v in f.together_s.items()} for k, f in cal1.async_kinds.items()})
        todo = [("alone", cal0), ("together", cal1)]
        if os.environ.get("OLD") == "1":
            old = run_ranks(body, W, list(DEFAULT_SIZES), iters, gap, by_kind, False, timeout_s=900)[0]
            todo.insert(0, ("old", fit_calibration(old, world_size=W, transport="gloo", device="cpu", meta={})))
        for label, cal in todo:
            errs = {}
            for c in cases:
                p = sv.predict(c, cal, 4)
                errs.setdefault(c["plan"], []).append((p["measured_step_mean_ms"], p["predicted_step_mean_ms"]))
            line = " ".join(f"{k} {100*(sum(x[1] for x in v)/sum(x[0] for x in v)-1):+5.1f}" for k, v in errs.items())
            print(f"W={W} {mode:<9} x{iters} {label:<8}: mean-step errors {line}", flush=True)
