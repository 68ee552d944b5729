"""Offline (session 27): where the calibration had a core per rank (W = 2 here), an asynchronous
collective's transport is starved while its ranks compute (starve.txt): it ends TAIL after the
first of its group's ranks stops computing (waits or blocks), or after the blocking fit's latency
if that is later. From the previous pass's schedule, like the idle shares. HINGE_KINDS: the kinds
(default all_reduce); TAIL_MS (default 0.5)."""
import dataclasses, os, runpy, sys
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import neo_train.topology.trace_sim as ts
from neo_train.topology.simulator import Compute, simulate
from neo_train.topology.trace_input import timeline_phases

KINDS = os.environ.get("HINGE_KINDS", "all_reduce").split(",")
TAIL = float(os.environ.get("TAIL_MS", "0.5")) / 1e3
FREE = {}  # collective name -> seconds from its start to the first rank's stop


def free_delays(tl, res):
    end = {p.name: p.end for p in res.phases}
    start = {p.name: p.start for p in res.phases}
    free = {}
    stops = {}
    for rank, blocks in tl.blocks.items():
        stops[rank] = [(end[tl.nodes[(rank, b.order)][0]], end[tl.nodes[(rank, b.order)][1]])
                       for b in blocks if b.kind == "wait" or b.sync]
    for key, by_rank in tl.colls.items():
        if key in tl.local or not by_rank[min(by_rank)].get("async"):
            continue
        t0 = start[tl.comm_start[key]]
        cand = [max(a, t0) for r in by_rank for a, z in stops.get(r, []) if z > t0]
        if cand:
            free[tl.comm_end[key]] = min(cand) - t0
    return free


def factory_for(cal):
    base = ts.calibrated_collectives(cal)

    def make(kind, group, by_rank, name, after):
        made = base(kind, group, by_rank, name, after)
        if made is None or not cal.core_per_rank:
            return made
        e0 = by_rank[min(by_rank)]
        k = ts._calibrated_kind(kind)
        (lat, comm), cname = made
        if not e0.get("async") or k not in KINDS or cname not in FREE or k not in cal.kinds:
            return made
        launch = sum(float(e.get("issue_ns", e.get("call_ns")) or 0) for e in by_rank.values()) / len(by_rank) / 1e9
        lb = max(0.0, cal.kinds[k].latency_s[len(group)] - launch)
        lat = Compute(lat.name, max(lb, FREE[cname] + TAIL), lat.after)
        return [lat, comm], cname
    return make


def simulate_calibrated(traces, cal, *, seed=0, passes=ts.IDLE_PASSES, **kw):
    FREE.clear()
    idle, wall = {}, 0.0
    for n in range(1, max(1, passes) + 1):
        tl = timeline_phases(traces, factory_for(cal), ts.calibrated_return_lags(cal, seed), idle)
        res = simulate(tl.phases, cal.network(), **kw)
        wall += res.wall_seconds
        if n == passes:
            break
        new = ts.idle_shares(tl, res, ts.BLOCKED_IDLE if cal.core_per_rank else 0.0)
        fr = free_delays(tl, res) if cal.core_per_rank else {}
        moved = any(abs(fr.get(k, 0) - FREE.get(k, 0)) > 1e-4 for k in set(fr) | set(FREE))
        if not moved and all(abs(new.get(k, 0.0) - idle.get(k, 0.0)) <= ts.IDLE_TOLERANCE for k in set(new) | set(idle)):
            break
        idle = new
        FREE.clear(); FREE.update(fr)
    return tl, dataclasses.replace(res, wall_seconds=wall), n


ts.simulate_calibrated = simulate_calibrated
sys.argv = [ROOT + "/notes/sim_validation_bench/idle_2026-11-24/offline.py"] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
