"""Offline variant (session 29): session 28's ``inflight_offline.py`` charged a blocking call the
company of an asynchronous collective in flight on its rank, and fixed W = 4 TWRW's node-local
all-gather in the backward but made the cross-node all-to-all before it long. Here the charge goes
only where the collective in flight is *live* by the recorded order: every rank of its group is
known (by happens-before through the collectives completed so far) to have launched it by the time
the blocking call completes. A world all-reduce whose ranks have not all launched it waits for the
late ones and takes no core; once all have, its transport threads run.

    python live_offline.py RUN_DIR                      # every W
    LIVE_MIN_W=4 python live_offline.py RUN_DIR
    LIVE=0 python live_offline.py RUN_DIR               # session 28's charge (no liveness test)

The rule was then built (e5b8a93, ``trace_input.live_company``): run this on the code before it, with
``ROOT=`` a checkout of 95a75a8 (``git worktree add /tmp/base 95a75a8``); on later code it charges twice."""
import os
import runpy
import sys
from pathlib import Path

ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
from neo_train.topology import trace_input as ti  # noqa: E402
from neo_train.topology import trace_sim as ts  # noqa: E402

MIN_W = int(os.environ.get("LIVE_MIN_W", "2"))
LIVE = os.environ.get("LIVE", "1") != "0"
KINDS = set(os.environ.get("LIVE_KINDS", "all_reduce,all_to_allv,all_gather,reduce_scatter").split(","))
_orig_tp, _orig_cc = ti.timeline_phases, ts.calibrated_collectives
_inflight: dict[tuple, tuple[str, int]] = {}  # (pg_id, k) of a blocking call -> (kind, group size) in flight
STATS = {"charged": 0, "not_live": 0}


def _known_at_end(blocks, colls):
    """{(rank, block index): {rank s: the highest block index of s known launched when it ends}}."""
    ranks = sorted(blocks)
    ptr = {r: 0 for r in ranks}
    vc = {r: {} for r in ranks}
    issued: dict[tuple, dict[int, dict]] = {}
    started: set = set()
    end_vc = {}
    moved = True
    while moved:
        moved = False
        for r in ranks:
            while ptr[r] < len(blocks[r]):
                i = ptr[r]
                b = blocks[r][i]
                if (r, i) not in started:
                    started.add((r, i))
                    if b.kind == "call":
                        v = dict(vc[r])
                        v[r] = i
                        issued.setdefault(b.colls[0], {})[r] = v
                needs = [b.colls[0]] if b.kind == "call" and b.sync else list(b.colls) if b.kind == "wait" else []
                if any(len(issued.get(c, {})) < len(colls[c]) for c in needs):
                    break
                for c in needs:
                    for v in issued[c].values():
                        for s, o in v.items():
                            if vc[r].get(s, -1) < o:
                                vc[r][s] = o
                vc[r][r] = i
                end_vc[(r, i)] = dict(vc[r])
                ptr[r] += 1
                moved = True
    return end_vc


def _scan(traces) -> None:
    _inflight.clear()
    if ti.trace_world_size(traces) < MIN_W:
        return
    blocks, colls = ti.rank_timelines(traces)
    call_at = {}  # (coll key, rank) -> block index of its launch
    for rank, mine in blocks.items():
        for i, b in enumerate(mine):
            if b.kind == "call":
                call_at[(b.colls[0], rank)] = i
    end_vc = _known_at_end(blocks, colls) if LIVE else {}
    for rank, mine in blocks.items():
        joined_at = {}
        for b in mine:
            if b.kind == "wait":
                for k in b.colls:
                    joined_at.setdefault(k, b.order)
        open_ = {}
        for i, b in enumerate(mine):
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
                live = open_
                if LIVE:
                    known = end_vc.get((rank, i), {})
                    live = {j: v for j, v in open_.items()
                            if all(known.get(s, -1) >= call_at[(j, s)] for s in colls[j])}
                if live:
                    _inflight[(k[0][0], k[1])] = max(live.values(), key=lambda v: v[1])
                    STATS["charged"] += 1
                else:
                    STATS["not_live"] += 1


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

if __name__ == "__main__":
    import atexit
    atexit.register(lambda: print("blocking calls charged / in flight but not live:", STATS, file=sys.stderr))
    sys.argv = [str(Path(__file__).parent.parent / "idle_2026-11-24/offline.py")] + sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
