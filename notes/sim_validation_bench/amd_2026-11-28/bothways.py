"""Offline (session 27): charge KindFit.overlap_slope both ways, below the calibration's mean draw
too (the built model charges only above it). BOTH_W: 'core' (only where the calibration had a core
per rank, i.e. W = 2 here) or 'all'; BOTH_KINDS: the kinds charged (default all three).

    BOTH_W=core [BOTH_KINDS=all_reduce] python bothways.py RUN_DIR   (RUN_DIR: a --keep directory)"""
import os, runpy, sys
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
from neo_train.topology import calibrate as cb
WHERE = os.environ.get("BOTH_W", "core")
_orig = cb.Calibration.latency
def latency(self, kind, group_size, async_op=False, concurrent=False, idle=0.0, launch_s=0.0, over_s=0.0):
    base = _orig(self, kind, group_size, async_op, concurrent, idle, launch_s, over_s)
    if not async_op or group_size < 2 or (WHERE == "core" and not self.core_per_rank):
        return base
    k = "all_reduce" if kind == "barrier" else kind
    fit = self.async_kinds.get(k)
    if fit is None or kind not in os.environ.get("BOTH_KINDS", "all_reduce,all_to_allv,all_gather"):
        return base
    under = max(0.0, fit.overlap_mean_s.get(group_size, 0.0) - over_s)
    return max(0.0, base - (1.0 - idle) * fit.overlap_slope.get(group_size, 0.0) * under)
cb.Calibration.latency = latency
sys.argv = [ROOT + "/notes/sim_validation_bench/idle_2026-11-24/offline.py"] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
