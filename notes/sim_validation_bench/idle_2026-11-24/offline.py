"""Refit a benchmark run's calibrations from their samples with the code under ROOT (default
/work/main), predict the run's kept traces (``--keep``), and print per case the step error and each
collective row's error, pooled over the launches; the last line counts the rows within +-25 %.

    python offline.py RUN_DIR                      # the working tree's model
    FREE_CORE=1 python offline.py RUN_DIR          # with simulate --free-core (2026-11-28 on)
    ROOT=/tmp/old python offline.py RUN_DIR        # a checkout of an earlier commit (git worktree add)

Since session 28 ``python benchmarks/sim_validation.py --rescore RUN_DIR`` does this with the full report
(every tier); this script stays for the variant scripts that wrap it.

The variants in notes/sim_validation.md ("2026-11-24, idle ranks") were monkeypatches of
``Calibration._mix`` / ``trace_sim.calibrated_collectives`` applied before ``main()``."""
import os
import re
import sys
from pathlib import Path

ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import sim_validation as sv  # noqa: E402
from neo_train.topology.calibrate import Calibration, fit_calibration  # noqa: E402

FREE_CORE = {"free_core": True} if os.environ.get("FREE_CORE") else {}  # the code before it has no such option


def main() -> None:
    run = Path(sys.argv[1])
    cals = {}
    for f in run.glob("calibration_w*_busy*.json"):
        m = re.match(r"calibration_w(\d+)_busy[\d.]+ms_(\w+)\.json", f.name)
        c = Calibration.load(f)
        cals[(int(m.group(1)), m.group(2))] = fit_calibration(c.samples, world_size=c.world_size,
                                                              transport=c.transport, device=c.device, meta=c.meta)
    cases: dict[str, list[Path]] = {}
    for d in sorted(run.iterdir()):
        if d.is_dir():
            cases.setdefault(re.sub(r"_r\d+$", "", d.name), []).append(d)
    tot = ok = sok = 0
    for name, dirs in sorted(cases.items()):
        W, mode = int(name[1]), ("pipelined" if "pipelined" in name else "plain")
        rows = [sv.predict({"trace": str(d), "W": W}, cals[(W, mode)], 4, **FREE_CORE)
                | {"repeat": i, "trace": str(d), "trainer_step_ms": 0, "load_before": 0, "load_after": 0,
                   "run_wall_s": 0} for i, d in enumerate(dirs)]
        m = sv.merge_repeats(rows)
        colls = sv.steady_collectives(m["collectives"], m["steady_steps"])
        bad = [c for c in colls if abs(c["error"]) > 0.25]
        tot, ok, sok = tot + len(colls), ok + len(colls) - len(bad), sok + (abs(m["step_mean_error"]) <= 0.15)
        errs = " ".join(f"{c['marker'][:14]}{c['error']:+.0%}" for c in colls)
        print(f"{name:20s} step {m['step_mean_error']:+6.1%} {len(colls) - len(bad)}/{len(colls)} | {errs}", flush=True)
    print(f"steps {sok}/{len(cases)}, collectives {ok}/{tot}")


if __name__ == "__main__":
    main()
