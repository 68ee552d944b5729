"""Run benchmarks/sim_validation.py (its arguments) with every rank pinned to one core (rank % cpus),
calibrations and recordings alike (each rank pins itself when its body starts, after the world group's
threads exist). Run EA of session 26:  python pindrv.py --keep DIR --json F --png F"""
import os, sys
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import sim_validation as sv
import neo_train.cli as cli

_train, _cal = sv._train_body, cli._calibrate_rank

def _pin(comm):
    cpus = sorted(os.sched_getaffinity(0))
    mode = os.environ.get("PIN", "rank")
    if mode == "rank":
        os.sched_setaffinity(0, {cpus[comm.rank % len(cpus)]})

def pinned_train(comm, *a, **k):
    _pin(comm); return _train(comm, *a, **k)

def pinned_cal(comm, *a, **k):
    _pin(comm); return _cal(comm, *a, **k)

if __name__ == "__main__":
    sv._train_body, cli._calibrate_rank = pinned_train, pinned_cal
    sys.exit(sv.main(sys.argv[1:]))
