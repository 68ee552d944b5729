"""Offline variant (session 26): a rank's asynchronous collectives progress one at a time. An
asynchronous collective launched on a rank while another asynchronous one launched before it is
still open there (by the recorded order: that one's join comes after this one's launch) starts only
once that one has ended. Scored like ``idle_2026-11-24/offline.py`` (which it runs).

    SERIAL=1 [SERIAL_MIN_W=3] [NO_COMPANY=1] python serial_offline.py RUN_DIR

SERIAL_MIN_W: apply it only to traces of at least that many ranks. NO_COMPANY: drop the companion
charge (``_concurrent``) of the collectives it serialises."""
import os
import runpy
import sys
from dataclasses import replace
from pathlib import Path

ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
from neo_train.topology import trace_input as ti  # noqa: E402

_orig_tp, _orig_cc = ti.timeline_phases, ti.concurrent_collectives
MIN_W = int(os.environ.get("SERIAL_MIN_W", "2"))


def ahead_of(blocks):
    """{key: set of keys} the asynchronous collectives open on some rank at each one's launch."""
    out = {}
    for mine in blocks.values():
        join_at = {}
        for b in mine:
            if b.kind == "wait":
                for k in b.colls:
                    join_at.setdefault(k, b.order)
        opened = []
        for b in mine:
            if b.kind == "call" and not b.sync:
                k = b.colls[0]
                ahead = {j for j, at in opened if join_at.get(j, 1 << 60) > b.order}
                if ahead:
                    out.setdefault(k, set()).update(ahead)
                opened.append((k, b.order))
    return out


def concurrent(blocks):
    c = _orig_cc(blocks)
    if os.environ.get("NO_COMPANY") and len(blocks) >= MIN_W:
        ser = ahead_of(blocks)
        drop = set(ser) | {j for v in ser.values() for j in v}
        c = {k: v for k, v in c.items() if k not in drop}
    return c


def timeline_phases(traces, factory, return_lags=None, idle=None):
    tl = _orig_tp(traces, factory, return_lags, idle)
    if ti.trace_world_size(traces) < MIN_W:
        return tl
    ser = ahead_of(tl.blocks)
    by_name = {p.name: i for i, p in enumerate(tl.phases)}
    for k, ahead in ser.items():
        if k in tl.local or k not in tl.comm_start:
            continue
        i = by_name[tl.comm_start[k]]
        p = tl.phases[i]
        extra = tuple(tl.comm_end[j] for j in ahead if j in tl.comm_end and j not in tl.local)
        tl.phases[i] = replace(p, after=tuple(p.after) + extra)
    return tl


if os.environ.get("SERIAL"):
    ti.timeline_phases = timeline_phases
    ti.concurrent_collectives = concurrent
    import neo_train.topology.trace_sim as ts
    if hasattr(ts, "timeline_phases"):
        ts.timeline_phases = timeline_phases

sys.argv = [str(Path(__file__).parent.parent / "idle_2026-11-24/offline.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
