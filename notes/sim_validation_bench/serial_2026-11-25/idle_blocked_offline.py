"""Offline variant (session 26): a rank blocked in a blocking call while one of its asynchronous
collectives is in flight leaves its core to the transport, so that time counts toward the
asynchronous collective's idle share (``trace_sim.idle_shares`` counts only the rank's own waits
for it); IDLE_WEIGHT: the share of that time counted (default 1). Applied to traces of at most IDLE_MAX_W ranks (default 2: ranks <= cores here).

    IDLE_BLOCKED=1 [IDLE_MAX_W=2] [IDLE_WEIGHT=1] python idle_blocked_offline.py RUN_DIR"""
import os
import runpy
import sys
from pathlib import Path

ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import neo_train.topology.trace_sim as ts  # noqa: E402

MAX_W = int(os.environ.get("IDLE_MAX_W", "2"))
WEIGHT = float(os.environ.get("IDLE_WEIGHT", "1"))  # the share of the blocked time counted idle
_orig = ts.idle_shares


def idle_shares(tl, res):
    out = _orig(tl, res)
    if len(tl.blocks) > MAX_W:
        return out
    end = {p.name: p.end for p in res.phases}
    start = {p.name: p.start for p in res.phases}
    extra = {}
    for rank, blocks in tl.blocks.items():
        join_at, launch_at = {}, {}
        for b in blocks:
            if b.kind == "wait":
                for k in b.colls:
                    join_at.setdefault(k, b.order)
            elif not b.sync:
                launch_at[b.colls[0]] = b.order
        for b in blocks:
            if b.kind == "call" and b.sync and b.colls[0] not in tl.local:
                a, z = tl.nodes[(rank, b.order)]
                for k, lo in launch_at.items():
                    if lo < b.order < join_at.get(k, -1):
                        extra.setdefault(k, []).append((end[a], end[z]))
    for key, spans in extra.items():
        if key in tl.local or key not in tl.comm_start:
            continue
        t0, t1 = start[tl.comm_start[key]], end[tl.comm_end[key]]
        if t1 <= t0:
            continue
        n = len(tl.colls[key])
        spent = sum(max(0.0, min(z, t1) - max(a, t0)) for a, z in spans)
        out[key] = min(1.0, out.get(key, 0.0) + WEIGHT * spent / (n * (t1 - t0)))
    return out


if os.environ.get("IDLE_BLOCKED"):
    ts.idle_shares = idle_shares

sys.argv = [str(Path(__file__).parent.parent / "idle_2026-11-24/offline.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
