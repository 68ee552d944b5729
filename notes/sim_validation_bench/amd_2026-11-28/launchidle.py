"""Offline (session 27): a rank still inside its launch of an asynchronous collective after handing
it to the transport (the trace's issue_ns) is the transport's thread holding its core: that time
counts toward the collective's idle share. LAUNCH_W: 'core' (a core per rank only) or 'all'."""
import os, runpy, sys
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
import neo_train.topology.trace_sim as ts
WHERE = os.environ.get("LAUNCH_W", "core")
WEIGHT = float(os.environ.get("LAUNCH_WEIGHT", "1"))
_orig = ts.idle_shares


def idle_shares(tl, res, blocked=0.0):
    out = _orig(tl, res, blocked)
    if WHERE == "core" and blocked <= 0:
        return out
    end = {p.name: p.end for p in res.phases}
    start = {p.name: p.start for p in res.phases}
    extra = {}
    for rank, blocks in tl.blocks.items():
        for b in blocks:
            if b.kind == "call" and not b.sync and b.issue is not None and b.colls[0] not in tl.local:
                a, z = tl.nodes[(rank, b.order)]
                extra.setdefault(b.colls[0], []).append((end[z + "i"], end[z]))
    for key, spans in extra.items():
        if key not in tl.comm_start:
            continue
        t0, t1 = start[tl.comm_start[key]], end[tl.comm_end[key]]
        if t1 > t0:
            spent = sum(max(0.0, min(z, t1) - max(a, t0)) for a, z in spans)
            if spent > 0:
                out[key] = min(1.0, out.get(key, 0.0) + WEIGHT * spent / (len(tl.colls[key]) * (t1 - t0)))
    return out


ts.idle_shares = idle_shares
sys.argv = [ROOT + "/notes/sim_validation_bench/idle_2026-11-24/offline.py"] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
