"""Offline (session 27): where the calibration had a core per rank, a rank waiting for one
asynchronous collective frees its core for the others it has in flight too, as a rank blocked in a
call does (trace_sim.BLOCKED_IDLE); WEIGHT: the share of that time counted (default BLOCKED_IDLE).

    [WEIGHT=0.5] python waitidle.py RUN_DIR   (RUN_DIR: a --keep directory)"""
import os, runpy, sys
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import neo_train.topology.trace_sim as ts
W8 = os.environ.get("WEIGHT")
def idle_shares(tl, res, blocked=0.0):
    end = {p.name: p.end for p in res.phases}
    start = {p.name: p.start for p in res.phases}
    waits = {}
    wb = float(W8) if (W8 is not None and blocked > 0) else blocked
    for rank, blocks in tl.blocks.items():
        joined = {k for b in blocks if b.kind == "wait" for k in b.colls}
        in_flight = {}
        for b in blocks:
            a, z = tl.nodes[(rank, b.order)]
            if b.kind == "wait":
                for k in b.colls:
                    waits.setdefault(k, []).append((end[a], end[z], 1.0))
                    in_flight.pop(k, None)
                if wb > 0:
                    for k in in_flight:
                        waits.setdefault(k, []).append((end[a], end[z], wb))
            elif not b.sync:
                if b.colls[0] in joined:
                    in_flight[b.colls[0]] = None
            elif blocked > 0 and b.colls[0] not in tl.local:
                for k in in_flight:
                    waits.setdefault(k, []).append((end[a], end[z], blocked))
    out = {}
    for key, by_rank in tl.colls.items():
        if key in tl.local or key not in waits or not by_rank[min(by_rank)].get("async"):
            continue
        t0, t1 = start[tl.comm_start[key]], end[tl.comm_end[key]]
        if t1 <= t0:
            continue
        spent = sum(w * max(0.0, min(z, t1) - max(a, t0)) for a, z, w in waits[key])
        share = min(1.0, spent / (len(by_rank) * (t1 - t0)))
        if share > 0:
            out[key] = share
    return out
ts.idle_shares = idle_shares
sys.argv = [ROOT + "/notes/sim_validation_bench/idle_2026-11-24/offline.py"] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
