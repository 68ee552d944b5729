"""Offline variant (session 28): where the host had fewer cores than ranks (``idle_shares``' ``blocked``
is 0 there), an asynchronous collective's idle share is the share of its time during which *every* rank
of its group waits for it, not the mean over the ranks: one rank idle while the others compute frees
nothing their compute does not take, so the collective runs at the blocking fit's speed only once all
its ranks wait. MIN_IDLE (default: the group's size) ranks waiting at once count instead, if given.
Scored as ``benchmarks/sim_validation.py --rescore`` (run with it here). Built afterwards as
``trace_sim.IDLE_TOGETHER`` (the same counts on FA - FD).

    python allidle.py RUN_DIR [--worlds 3,4] [--json out.json]"""
import os
import sys
from pathlib import Path

ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import neo_train.topology.trace_sim as ts  # noqa: E402
import sim_validation as sv  # noqa: E402

_orig = ts.idle_shares
MIN_IDLE = int(os.environ["MIN_IDLE"]) if os.environ.get("MIN_IDLE") else None


def idle_shares(tl, res, blocked=0.0, together=False):
    if blocked > 0:  # a core per rank: the built rule
        return _orig(tl, res, blocked)
    end = {p.name: p.end for p in res.phases}
    start = {p.name: p.start for p in res.phases}
    waits = {}  # key -> rank -> [(from, to)]
    for rank, blocks in tl.blocks.items():
        for b in blocks:
            if b.kind == "wait":
                a, z = tl.nodes[(rank, b.order)]
                for k in b.colls:
                    waits.setdefault(k, {}).setdefault(rank, []).append((end[a], end[z]))
    out = {}
    for key, by_rank in tl.colls.items():
        if key in tl.local or key not in waits or not by_rank[min(by_rank)].get("async"):
            continue
        t0, t1 = start[tl.comm_start[key]], end[tl.comm_end[key]]
        if t1 <= t0:
            continue
        need = MIN_IDLE or len(by_rank)
        ev = []
        for spans in waits[key].values():
            for a, z in spans:
                a, z = max(a, t0), min(z, t1)
                if z > a:
                    ev += [(a, 1), (z, -1)]
        ev.sort()
        n, last, spent = 0, t0, 0.0
        for t, d in ev:
            if n >= need:
                spent += t - last
            n += d
            last = t
        share = min(1.0, spent / (t1 - t0))
        if share > 0:
            out[key] = share
    return out


ts.idle_shares = idle_shares
sys.exit(sv.main(["--rescore"] + sys.argv[1:]))
