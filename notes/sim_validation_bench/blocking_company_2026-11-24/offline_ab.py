"""A run's traces predicted offline with and without one field of the blocking fits.

    git apply blocking_company.patch                  # run BA: the variant (it was reverted)
    VARIANT=old python offline_ab.py RUN_DIR          # the blocking fits without concurrent_s: the model before
    python offline_ab.py RUN_DIR                      # with it
    VARIANT=old FIELD=after_lag python offline_ab.py RUN_DIR   # runs BB, BC: without the lag after compute"""
import os, sys, dataclasses
sys.path[:0] = ["/work/main/notes/sim_validation_bench/idle_2026-11-24", "/work/main", "/work/main/benchmarks"]
import offline
from neo_train.topology import calibrate as C
V = os.environ.get("VARIANT", "")
FIELD = os.environ.get("FIELD", "concurrent_s")
orig = C.fit_calibration
def fit(*a, **k):
    cal = orig(*a, **k)
    if V == "old":
        cal.kinds = {n: dataclasses.replace(f, **{FIELD: {}}) for n, f in cal.kinds.items()}
    return cal
offline.fit_calibration = fit
offline.main()
