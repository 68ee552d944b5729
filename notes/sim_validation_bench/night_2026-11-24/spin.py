import os, sys, json, subprocess, statistics, numpy as np
sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
import sim_validation as sv

def waits(trace):
    out = []
    for r in (0, 1):
        d = json.load(open(f"{trace}/trace_rank{r}.json"))
        out += [e["wait_ns"] / 1e6 for e in d if "comms" in e and e.get("markers") == ["input_dist"] and (e.get("step") or 0) >= 4]
    return np.array(out)

if __name__ == "__main__":
    from neo_train.config import preset
    cfg = preset("small")
    cfg = cfg.replace(train=cfg.train.replace(eval_every=0, eval_batches=1))
    wd = Path("/tmp/s18/spin"); wd.mkdir(exist_ok=True)
    for rep in range(2):
        for spin in (False, True):
            procs = []
            if spin:
                for cpu in (0, 1):
                    procs.append(subprocess.Popen(["taskset", "-c", str(cpu), "nice", "-n", "19", sys.executable, "-c", "while True: pass"]))
            try:
                c = sv.record(cfg, "tw", 2, "plain", 24, wd / f"spin{int(spin)}", rep)
            finally:
                for p in procs: p.kill()
            w = waits(c["trace"])
            print(f"spin={spin} rep{rep}: trainer {c['trainer_step_ms']:.2f} ms/step; input_dist wait mean {w.mean():.2f} median {np.median(w):.2f} p90 {np.percentile(w, 90):.2f} share>2ms {(w > 2).mean():.2f}", flush=True)
