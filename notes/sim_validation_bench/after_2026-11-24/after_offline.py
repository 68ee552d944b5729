"""A constant K: each lagging rank's lag lengthened by K x (the mean over the collective's ranks of
their compute after it - the calibration's busy_s), nothing when negative (MODE=sym: the spread
scaled by it both ways). For runs whose calibrations lack the third pass (before BB), the code at
commit 61982f3 or later (without after_lag in the fits this adds to nothing else):

    K=0.2 python after_offline.py RUN_DIR
    K=0.2 MODE=sym python after_offline.py RUN_DIR"""
import os, sys
sys.path[:0] = ["/work/main/notes/sim_validation_bench/idle_2026-11-24", "/work/main", "/work/main/benchmarks"]
import offline
from neo_train.topology import trace_input as ti, trace_sim as ts
K = float(os.environ.get("K", "0"))
MODE = os.environ.get("MODE", "all")
AFTER = {}
orig_rt = ti.rank_timelines
def rt(traces):
    blocks, colls = orig_rt(traces)
    AFTER.clear()
    for r, bl in blocks.items():
        for a, b in zip(bl, bl[1:]):
            AFTER[(r, a.pos, a.kind)] = b.compute
    return blocks, colls
ti.rank_timelines = rt
_fit = offline.fit_calibration
def _fit_first(samples, **kw):  # run BA's files carry blocking second-pass cells (the dropped variant): left out
    return _fit([x for x in samples if x.get("async") or not x.get("pass")], **kw)
offline.fit_calibration = _fit_first
orig_lags = ts.calibrated_return_lags
def lags_factory(cal, seed=0):
    base = orig_lags(cal, seed)
    busy = float(cal.meta.get("busy_s") or 0.0)
    def lags(kind, group, by_rank):
        out = base(kind, group, by_rank)
        if not out or K <= 0:
            return out
        e0 = by_rank[min(by_rank)]
        asy = bool(e0.get("async"))
        if MODE == "sync" and asy:
            return out
        A = [AFTER.get((r, by_rank[r]["_pos"], "wait" if asy else "call")) for r in group if r in by_rank]
        A = [a for a in A if a is not None]
        if not A:
            return out
        if MODE == "sym":  # the mean lag scaled: spread + K (A - busy), at least 0
            g = len(group)
            m = cal.spread(kind if kind != "all_to_all" else "all_to_allv", g, asy, float(e0.get("_idle", 0.0)))
            if m <= 0:
                return out
            f = max(0.0, m + K * (sum(A) / len(A) - busy)) / m
            return {r: v * f for r, v in out.items()}
        extra = K * max(0.0, sum(A) / len(A) - busy)
        return {r: (v + extra if v > 0 else v) for r, v in out.items()}
    return lags
ts.calibrated_return_lags = lags_factory
offline.main()
