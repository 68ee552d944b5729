import os, sys, json, time, statistics
sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
import sim_validation as sv
from neo_train.testing import run_ranks

def body(comm, cfg, plan_json, trace_dir, iters):
    from neo_train.cli import wrap_communicator
    from neo_train.sharding import ShardingPlan
    from neo_train.train import Trainer
    from neo_train.topology.trace_input import load_trace, trace_duties
    from neo_train.topology.calibrate import measure_collectives, DEFAULT_SIZES
    raw = comm
    L = int(os.environ.get("LOCAL_WORLD_SIZE", comm.world_size))
    comm = wrap_communicator(comm, cfg, L)
    t = Trainer(cfg, comm=comm, plan=ShardingPlan.from_json(plan_json), progress=False, log_dir=None)
    res = t.run()
    comm.dump(trace_dir)
    raw.barrier()
    gap, overlap, by_kind = trace_duties(load_trace(trace_dir), 4)
    t0 = time.perf_counter()
    samples = measure_collectives(raw, sizes=list(DEFAULT_SIZES), iters=iters, busy_s=gap, overlap_s=by_kind or overlap)
    return {"steps": res.steps, "train_seconds": res.train_seconds, "samples": samples, "gap": gap,
            "by_kind": by_kind, "cal_s": time.perf_counter() - t0}

if __name__ == "__main__":
    from neo_train.config import preset
    from neo_train.topology.calibrate import fit_calibration, DEFAULT_SIZES
    W, iters, nrep = 2, 84, int(sys.argv[1]) if len(sys.argv) > 1 else 3
    plans = sys.argv[2].split(",") if len(sys.argv) > 2 else ["tw", "mixed"]
    cfg = sv.preset_cfg() if hasattr(sv, "preset_cfg") else preset("small")
    cfg = cfg.replace(train=cfg.train.replace(eval_every=0, eval_batches=1))
    wd = Path("/tmp/s19/inl"); wd.mkdir(parents=True, exist_ok=True)
    out = []
    for rep in range(nrep):
        for plan in plans:
            mode = "plain"
            trace_dir = wd / f"w{W}_{plan}_{mode}_r{rep}"
            run_cfg = cfg.replace(train=cfg.train.replace(steps=24, pipeline=False), dist=cfg.dist.replace(trace_dir=str(trace_dir)))
            plan_obj = sv.make_plan(plan, cfg.model, W)
            r = run_ranks(body, W, run_cfg, plan_obj.to_json(), str(trace_dir), iters, timeout_s=900)
            cal = fit_calibration(r[0]["samples"], world_size=W, transport="gloo", device="cpu", meta={})
            cal.save(wd / f"cal_{plan}_r{rep}.json")
            case = {"W": W, "plan": plan, "mode": mode, "trace": str(trace_dir)}
            p = sv.predict(case, cal, 4)
            trainer_ms = max(x["train_seconds"] for x in r) / r[0]["steps"] * 1e3
            row = dict(case, rep=rep, trainer_ms=trainer_ms, gap=r[0]["gap"], by_kind=r[0]["by_kind"], cal_s=r[0]["cal_s"],
                       meas=p["measured_step_mean_ms"], pred=p["predicted_step_mean_ms"], err=p["step_mean_error"])
            out.append(row)
            print(f"{plan} rep{rep}: trainer {trainer_ms:.2f}; meas {row['meas']:.2f} pred(in-launch cal) {row['pred']:.2f} err {row['err']:+.1%}; cal {row['cal_s']:.1f}s gap {row['gap']*1e3:.2f}", flush=True)
    json.dump(out, open(wd / "rows.json", "w"), indent=1)
