"""Offline (session 27): where the calibration had a core per rank (W = 2 here), an asynchronous
collective's transport progresses only while a core is free of compute (starve.txt): it ends once
its group's ranks, together, have left it the blocking fit's latency (less its launch) of free core
time after its start, or as the model has it if that is sooner (the asynchronous fit was measured
with the ranks computing throughout). Free: a rank waiting for it (rate 1), for another
asynchronous collective (OTHER_RATE, default 0.5) or blocked in another's call (BLOCK_RATE, default
0.5: the freed core serves two transports); at each instant the fastest of its ranks'. From the
previous pass's schedule, like the idle shares. HINGE_KINDS: the kinds (default all_reduce).
FREE_MODE=hinge: instead, it ends TAIL_MS (default 0.5) after the first of its ranks stops computing
(a wait or any blocking call), or after the blocking latency if that is later.

    OTHER_RATE=1 BLOCK_RATE=0.5 python freetime.py RUN_DIR     (the lead in notes/sim_validation.md)
    FREE_MODE=hinge python freetime.py RUN_DIR                 (offline_hinge_FA.txt)"""
import dataclasses, os, runpy, sys
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import neo_train.topology.trace_sim as ts
from neo_train.topology.simulator import Compute, simulate
from neo_train.topology.trace_input import timeline_phases

KINDS = os.environ.get("HINGE_KINDS", "all_reduce").split(",")
OTHER = float(os.environ.get("OTHER_RATE", "0.5"))  # a wait for another asynchronous collective
BLOCK = float(os.environ.get("BLOCK_RATE", "0.5"))  # a blocking call
HINGE = os.environ.get("FREE_MODE") == "hinge"
TAIL = float(os.environ.get("TAIL_MS", "0.5")) / 1e3
FREE = {}  # collective name -> [(from, to, rate)] of free core time, seconds from its start


def free_delays(tl, res):
    end = {p.name: p.end for p in res.phases}
    start = {p.name: p.start for p in res.phases}
    free = {}
    stops = {}
    for rank, blocks in tl.blocks.items():
        stops[rank] = [(end[tl.nodes[(rank, b.order)][0]], end[tl.nodes[(rank, b.order)][1]], b.colls, b.sync)
                       for b in blocks if (b.kind == "wait" or b.sync) and not (b.sync and b.colls[0] in tl.local)]
    for key, by_rank in tl.colls.items():
        if key in tl.local or not by_rank[min(by_rank)].get("async"):
            continue
        t0 = start[tl.comm_start[key]]
        spans = [(max(a, t0) - t0, z - t0, 1.0 if key in colls else BLOCK if sync else OTHER) for r in by_rank
                 for a, z, colls, sync in stops.get(r, []) if z > t0]
        free[tl.comm_end[key]] = ts._fastest(spans)  # the fastest rate of any rank's stop over each piece
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
        need, t = lb, float("inf")
        if HINGE:
            t = FREE[cname][0][0] + TAIL if FREE[cname] else t
            lat = Compute(lat.name, max(lb, t), lat.after) if FREE[cname] else lat
            return [lat, comm], cname
        for a, z, rate in FREE[cname]:
            if (z - a) * rate >= need:
                t = a + need / rate
                break
            need -= (z - a) * rate
        lat = Compute(lat.name, min(lat.seconds, max(lb, t)), lat.after)
        return [lat, comm], cname
    return make


def simulate_calibrated(traces, cal, *, seed=0, passes=ts.IDLE_PASSES, free_core=False, **kw):  # the built option: not this
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
        moved = fr != FREE
        if not moved and all(abs(new.get(k, 0.0) - idle.get(k, 0.0)) <= ts.IDLE_TOLERANCE for k in set(new) | set(idle)):
            break
        idle = new
        FREE.clear(); FREE.update(fr)
    return tl, dataclasses.replace(res, wall_seconds=wall), n


ts.simulate_calibrated = simulate_calibrated
sys.argv = [ROOT + "/notes/sim_validation_bench/idle_2026-11-24/offline.py"] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
