"""Offline (session 27): where the calibration had a core per rank, a rank waiting for one
asynchronous collective frees its core for the others it has in flight too, as a rank blocked in a
call does (trace_sim.BLOCKED_IDLE); WEIGHT: the share of that time counted (default BLOCKED_IDLE).

    [WEIGHT=0.5] python waitidle.py RUN_DIR   (RUN_DIR: a --keep directory)"""
import os, runpy, sys
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import neo_train.topology.trace_sim as ts
W8 = os.environ.get("WEIGHT")
_orig = ts.idle_shares


def idle_shares(tl, res, blocked=0.0):
    """The built shares, plus (where ``blocked`` > 0) a rank's waits for one collective counted
    toward the others it has in flight, with the weight WEIGHT (default ``blocked``)."""
    out = _orig(tl, res, blocked)
    w = float(W8) if W8 is not None else blocked
    if blocked <= 0 or w <= 0:
        return out
    end = {p.name: p.end for p in res.phases}
    start = {p.name: p.start for p in res.phases}
    extra = {}
    for rank, blocks in tl.blocks.items():
        joined = {k for b in blocks if b.kind == "wait" for k in b.colls}
        in_flight = {}
        for b in blocks:
            a, z = tl.nodes[(rank, b.order)]
            if b.kind == "wait":
                for k in b.colls:
                    in_flight.pop(k, None)
                for k in in_flight:
                    extra.setdefault(k, []).append((end[a], end[z]))
            elif not b.sync and b.colls[0] in joined:
                in_flight[b.colls[0]] = None
    for key, spans in extra.items():
        if key in tl.local:
            continue
        t0, t1 = start[tl.comm_start[key]], end[tl.comm_end[key]]
        if t1 > t0:
            spent = sum(max(0.0, min(z, t1) - max(a, t0)) for a, z in spans)
            out[key] = min(1.0, out.get(key, 0.0) + w * spent / (len(tl.colls[key]) * (t1 - t0)))
    return out


ts.idle_shares = idle_shares
sys.argv = [ROOT + "/notes/sim_validation_bench/idle_2026-11-24/offline.py"] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
