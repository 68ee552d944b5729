"""GIL switch interval A/B (session 26): record one benchmark case (sim_validation.record, the benchmark's
own path) alternately with the default switch interval and others, and print each launch's trainer step and
its collectives' net times (net.py). Needs sc/ on PYTHONPATH (sitecustomize sets the interval from SWI).

    PYTHONPATH=sc python rec.py 4 tw plain ",0.0002" 2
"""
import os, sys, subprocess
from pathlib import Path
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import sim_validation as sv
from neo_train.config import preset

def main():
    W = int(sys.argv[1]); plan = sys.argv[2]; mode = sys.argv[3]; swis = sys.argv[4].split(",")
    reps = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    cfg = preset("small")
    cfg = cfg.replace(train=cfg.train.replace(batch_size=1024))
    for rep in range(reps):
        for swi in swis:
            os.environ["SWI"] = swi
            wd = Path(os.environ.get("WORK", "/tmp")) / f"rec_{swi or 'def'}"; wd.mkdir(exist_ok=True)
            r = sv.record(cfg, plan, W, mode, 24, wd, rep)
            net = subprocess.run([sys.executable, str(Path(__file__).with_name("net.py")), r["trace"]], capture_output=True, text=True).stdout.strip()
            print(f"swi={swi or 'def':7s} rep={rep} trainer {r['trainer_step_ms']:.2f} ms/step | {net}", flush=True)

if __name__ == "__main__":
    main()
