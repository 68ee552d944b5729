import sys, json, statistics, time
from pathlib import Path
sys.path.insert(0, "benchmarks")
import sim_validation as sv
from neo_train.config import preset
from neo_train.topology.calibrate import DEFAULT_SIZES, fit_calibration
from neo_train.testing import run_ranks

def body(comm, sizes, iters, busy_s, overlap_s, tiled):
    from neo_train.topology.calibrate import measure_collectives
    return measure_collectives(comm, sizes=sizes, iters=iters, busy_s=busy_s, overlap_s=overlap_s, tiled=tiled)

if __name__ == "__main__":
    W = int(sys.argv[1]); wd = Path(sys.argv[2]); wd.mkdir(parents=True, exist_ok=True); R = int(sys.argv[3])
    cfg = preset("small")
    cfg = cfg.replace(train=cfg.train.replace(kernel_backend="auto", eval_every=0, eval_batches=1))
    cases = []
    for r in range(R):
        for m in sv.MODES:
            for p in sv.PLANS:
                d = wd / f"rep{r}"; d.mkdir(exist_ok=True)
                c = sv.record(cfg, p, W, m, 24, d); c["rep"] = r; cases.append(c)
    duties = [sv.duty(c["trace"], 4) for c in cases]
    gap = statistics.median(d[0] for d in duties)
    by_kind = {k: statistics.median(d[2][k] for d in duties if k in d[2]) for k in sorted({k for d in duties for k in d[2]})}
    cals = {}
    for name, tiled in (("plain", False), ("tiled", True)):
        samples = run_ranks(body, W, list(DEFAULT_SIZES), 7, gap, by_kind, tiled, timeout_s=900)[0]
        cal = fit_calibration(samples, world_size=W, transport="gloo", device="cpu", meta={})
        cal.save(wd / f"cal_{name}.json"); cals[name] = cal
        print(name, cal.table(), flush=True)
    for c in cases:
        out = []
        for name, cal in cals.items():
            p = sv.predict(c, cal, 4)
            out.append("%s %.2f %+.1f%%" % (name, p["predicted_step_ms"], 100 * p["step_error"]))
        print(W, c["plan"], c["mode"], c["rep"], "meas %.2f" % p["measured_step_ms"], " | ".join(out), flush=True)
