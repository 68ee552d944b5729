import sys, os, time
sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
import sim_validation as sv
if __name__ == "__main__":
    from neo_train.config import preset
    cfg = preset("small")
    cfg = cfg.replace(train=cfg.train.replace(eval_every=0, eval_batches=1))
    W, plan, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    for pol in sys.argv[4].split(","):
        c = cfg.replace(dist=cfg.dist.replace(comm_threads=pol))
        t0 = time.time()
        r = sv.record(c, plan, W, mode, int(sys.argv[5]) if len(sys.argv) > 5 else 24, Path("/tmp/s19/rt"), 0)
        print(f"W={W} {plan} {mode} {pol:<8}: trainer {r['trainer_step_ms']:.2f} ms/step, wall {time.time()-t0:.1f}s, load {os.getloadavg()[0]:.2f}; {r['comm_threads']}", flush=True)
