import sys, json, time, os, statistics
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology.calibrate import DEFAULT_SIZES, fit_calibration, Calibration
from neo_train.testing import run_ranks

def body(comm, busy_s, overlap, iters, yscale):
    import neo_train.topology.calibrate as cb
    acc = [0.0]
    orig = cb._busy
    def busy(work, s):
        t = time.perf_counter(); orig(work, s); acc[0] += time.perf_counter() - t
    cb._busy = busy
    t0 = time.perf_counter()
    ov = {k: v * yscale for k, v in overlap.items()}
    samples = cb.measure_collectives(comm, sizes=list(DEFAULT_SIZES), iters=iters, busy_s=busy_s, overlap_s=ov)
    return samples, acc[0] / (time.perf_counter() - t0)

if __name__ == "__main__":
    scales = [float(x) for x in sys.argv[1].split(",")]
    yscale = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    W = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    iters = {2: 84, 3: 37, 4: 21}[W]
    S = json.load(open("/tmp/s18/runS.json"))
    meta = {m: S["calibrations"][f"{W}:busy:{m}"]["meta"] for m in ("plain", "pipelined")}
    for k in scales:
        cals, duties = {}, {}
        for m in ("plain", "pipelined"):
            samples, duty = run_ranks(body, W, meta[m]["busy_s"] * k, meta[m]["overlap_s"], iters, yscale, timeout_s=900)[0]
            cals[m] = fit_calibration(samples, world_size=W, transport="gloo", device="cpu", meta={})
            cals[m].save(f"/tmp/s19/xs_w{W}_{k}_{yscale}_{m}.json")
            duties[m] = duty
        for r in "STU":
            d = json.load(open(f"/tmp/s18/run{r}.json"))
            errs = []
            for row in d["rows"]:
                if row["W"] != W: continue
                rows = [row | {kk: rep[kk] for kk in ("repeat", "trace")} | sv.predict({"W": W, "trace": rep["trace"]}, cals[row["mode"]], 4) for rep in row["repeats"]]
                mm = sv.merge_repeats(rows)
                errs.append((row["plan"], row["mode"], mm["step_mean_error"]))
            print(f"X x{k} Y x{yscale} duty plain {duties['plain']:.2f} pipelined {duties['pipelined']:.2f} run {r}: W={W} within {sum(abs(e) <= .15 for *_, e in errs)}/8 median {statistics.median(e for *_, e in errs):+.1%}  " + " ".join(f"{p}/{m[:2]} {e:+.0%}" for p, m, e in errs), flush=True)
