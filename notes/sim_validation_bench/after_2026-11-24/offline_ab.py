"""A run's traces predicted offline with its calibrations' after_lag (as committed) and without it:

    python offline_ab.py RUN_DIR
    VARIANT=old python offline_ab.py RUN_DIR"""
import os, sys, dataclasses
sys.path[:0] = ["/work/main/notes/sim_validation_bench/idle_2026-11-24", "/work/main", "/work/main/benchmarks"]
import offline
from neo_train.topology import calibrate as C
V = os.environ.get("VARIANT", "")
orig = C.fit_calibration
def fit(*a, **k):
    cal = orig(*a, **k)
    if V == "old":
        cal.kinds = {n: dataclasses.replace(f, after_lag={}) for n, f in cal.kinds.items()}
    return cal
offline.fit_calibration = fit
offline.main()
