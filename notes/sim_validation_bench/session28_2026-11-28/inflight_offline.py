"""Offline variant (session 28): a blocking call made while an asynchronous collective is in flight on
one of its ranks (launched before it by the recorded order, joined after it) is charged that
collective's company figure: the in-flight kind's asynchronous ``KindFit.concurrent_s`` at the in-flight
group's size (the largest over the ones in flight). Session 23 charged the blocking call's own kind's
figure (about 0 for a g = 2 all-gather) and found no change; W = 4 TWRW's node-local all-gather in the
backward runs beside DDP's W-wide bucket and is short in every run (-24 to -33 %). Scored like
``idle_2026-11-24/offline.py`` (which it runs).

    python inflight_offline.py RUN_DIR                  # every W
    INFLIGHT_MIN_W=4 INFLIGHT_KINDS=all_reduce python inflight_offline.py RUN_DIR"""
import os
import runpy
import sys
from pathlib import Path

ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
from neo_train.topology import trace_input as ti  # noqa: E402
from neo_train.topology import trace_sim as ts  # noqa: E402

MIN_W = int(os.environ.get("INFLIGHT_MIN_W", "2"))
KINDS = set(os.environ.get("INFLIGHT_KINDS", "all_reduce,all_to_allv,all_gather,reduce_scatter").split(","))
_orig_tp, _orig_cc = ti.timeline_phases, ts.calibrated_collectives
_inflight: dict[tuple, tuple[str, int]] = {}  # (pg_id, k) of a blocking call -> (kind, group size) in flight


def _scan(traces) -> None:
    _inflight.clear()
    if ti.trace_world_size(traces) < MIN_W:
        return
    blocks, colls = ti.rank_timelines(traces)
    for rank, mine in blocks.items():
        joined_at = {}
        for b in mine:
            if b.kind == "wait":
                for k in b.colls:
                    joined_at.setdefault(k, b.order)
        open_ = {}
        for b in mine:
            if b.kind != "call":
                continue
            k = b.colls[0]
            open_ = {j: v for j, v in open_.items() if joined_at.get(j, 1 << 60) > b.order}
            if not b.sync:
                e0 = colls[k][min(colls[k])]
                kind = ts._calibrated_kind(ti._comm_name(e0))
                if kind in KINDS:
                    open_[k] = (kind, len(colls[k]))
            elif open_:
                best = max(open_.values(), key=lambda v: v[1])
                _inflight[(k[0][0], k[1])] = best


def timeline_phases(traces, factory, return_lags=None, idle=None):
    _scan(traces)
    return _orig_tp(traces, factory, return_lags, idle)


def calibrated_collectives(cal, free=None):
    make = _orig_cc(cal, free)

    def wrapped(kind, group, by_rank, name, after):
        out = make(kind, group, by_rank, name, after)
        if out is None:
            return out
        e0 = by_rank[min(by_rank)]
        pg, k = name.split(":")[-2:]
        hit = _inflight.get((int(pg), int(k))) if not e0.get("async") else None
        if hit and hit[0] in cal.async_kinds:
            extra = cal.async_kinds[hit[0]].concurrent_s.get(hit[1], 0.0)
            lat = out[0][0]
            out[0][0] = ti.Compute(lat.name, lat.seconds + extra, lat.after)
        return out

    return wrapped


ti.timeline_phases = timeline_phases
ts.timeline_phases = timeline_phases
ts.calibrated_collectives = calibrated_collectives

sys.argv = [str(Path(__file__).parent.parent / "idle_2026-11-24/offline.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
