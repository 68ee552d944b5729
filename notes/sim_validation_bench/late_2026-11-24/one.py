import sys, os, time
sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
import sim_validation as sv
if __name__ == "__main__":
    from neo_train.config import preset
    cfg = preset("small")
    cfg = cfg.replace(train=cfg.train.replace(eval_every=0, eval_batches=1))
    plan, steps = sys.argv[1], int(sys.argv[2])
    c = sv.record(cfg, plan, 2, "plain", steps, Path(sys.argv[3]), 0)
    print(f"{plan}: trainer {c['trainer_step_ms']:.2f} ms/step", flush=True)
