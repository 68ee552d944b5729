"""Core pinning A/B (session 26): record one case alternately unpinned and with every rank pinned to core
rank % cpus (pindrv.pinned_train), and print the trainer's step time per launch and the medians.

    PYTHONPATH=. python rec2.py 2 tw plain 3
"""
import os, sys
from pathlib import Path
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), ROOT, ROOT + "/benchmarks"]
import sim_validation as sv
import pindrv
from neo_train.config import preset

def main():
    W = int(sys.argv[1]); plan = sys.argv[2]; mode = sys.argv[3]; reps = int(sys.argv[4])
    cfg = preset("small")
    cfg = cfg.replace(train=cfg.train.replace(batch_size=1024, eval_every=0, eval_batches=1))
    orig = sv._train_body
    res = {"off": [], "rank": []}
    for rep in range(reps):
        for pin in ("off", "rank"):
            sv._train_body = orig if pin == "off" else pindrv.pinned_train
            wd = Path(os.environ.get("WORK", "/tmp")) / f"rec2_{pin}"; wd.mkdir(exist_ok=True)
            r = sv.record(cfg, plan, W, mode, 24, wd, rep)
            res[pin].append(r["trainer_step_ms"])
            print(f"W={W} {plan} {mode} pin={pin:4s} rep={rep} trainer {r['trainer_step_ms']:.2f} ms/step", flush=True)
    import statistics as st
    print(f"W={W} {plan} {mode}: unpinned median {st.median(res['off']):.2f}, pinned {st.median(res['rank']):.2f} ms/step")

if __name__ == "__main__":
    main()
