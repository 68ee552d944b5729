"""``neo-train simulate --trace``: a recorded comms trace on the cluster it implies, or on a
calibrated model of the machine that recorded it, predicted against what the run measured.

    neo-train train --nproc 4 --trace-dir traces            # every rank's timeline recorded
    neo-train calibrate --nproc 4 --out calib_w4.json       # this machine's collectives
    neo-train simulate --trace traces --calibration calib_w4.json          # predicted vs measured
    neo-train simulate --trace traces --network fattree     # the same run's compute on a fat-tree
    neo-train simulate --trace old/ --compute output_dist=0.002,output_dist_bwd=0.01   # no recorded compute

Compute. A trace recorded by neo_train's tracer carries each rank's timeline (compute between its
blocking intervals, the intervals, step marks; ``neo_train.comm.trace``): by default every rank
replays its own compute as a chain, joined to the others at collectives
(``trace_input.timeline_phases``), and the report compares the simulated timeline with the
recorded one (``validate_timeline``: step time, and per collective the time from issue to done, the
time blocked and the collective's own part). ``--compute`` takes the trace's phase markers instead
(seconds of compute before each run of that marker's collectives, one global chain; neo_train's
traces carry input_dist, output_dist, output_dist_bwd, dense_allreduce, metrics, ...; a name the
trace lacks is an error listing the ones it has); ``--compute none`` simulates communication only.
A trace with neither recorded compute nor ``--compute`` is an error naming its file.

Network. ``--calibration FILE`` (``topology.calibrate``): the fabric, per-collective latency and
byte factors fitted on the recording machine (for asynchronous collectives, the fit of those
launched while the ranks compute, when the calibration was busy, mixed with the blocking fit by the
share of the collective's time its ranks wait idle for it: ``idle_shares``, simulated again until
they settle, ``simulate_calibrated``), and how far apart the ranks waiting for a collective resume
(``calibrated_return_lags``, drawn from a fixed seed); its world size and transport must match the
trace's. Without it the cluster follows the trace (``trace_cluster_shape``): GPUs
per node = the largest divisor of the trace's world size up to the topology's (a 4-rank trace on an 8-GPU
topology is one node of 4), nodes = the nodes the ranks fill (Opera: its smallest study layout,
16 / 128 / 1024, that holds them); an explicit --gpus-per-node must divide the world size and an
explicit --nodes must hold the ranks, else a ValueError naming the flags.
"""
from __future__ import annotations

import argparse
import bisect
import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..config import nonnegative_int
from .calibrate import KINDS, Calibration, few_elements
from .networks import cluster_for, make_network
from .simulator import Compute, SimResult, simulate
from .spec import ClusterSpec
from .trace_input import (Block, Timeline, _comm_name, _dtype_bytes, _phase, check_compute_markers,
                          has_recorded_compute, load_trace, network_collectives, timeline_phases, trace_markers,
                          trace_phases, trace_load, trace_transports, trace_world_size)

__all__ = ["add_trace_arguments", "free_core_flag", "simulate_trace", "trace_cluster_shape", "validate_timeline", "TraceValidation",
           "calibrated_collectives", "calibrated_return_lags", "entry_sizes", "idle_shares", "simulate_calibrated",
           "free_core_times", "free_core_latency"]


WARMUP_STEPS = 5
"""Steps left out of predicted vs measured by default (``--warmup-steps``: None on the command
line when not given, so a flag meant for --trace alone can be refused without it)."""


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """The ``neo-train simulate`` flags of trace mode."""
    p.add_argument("--trace", type=Path, help="simulate a recorded param comms trace (dir or JSON) instead")
    p.add_argument("--compute", default="",
                   help="with --trace: seconds of compute before each run of a phase marker's collectives, e.g. "
                        "output_dist=0.002,output_dist_bwd=0.01,dense_allreduce=0.005 (neo_train's markers; a name "
                        "the trace lacks is an error listing its markers); 'none': communication only. Default: "
                        "each rank's compute as the trace recorded it (neo-train train --trace-dir)")
    p.add_argument("--calibration", type=Path,
                   help="with --trace: simulate on the calibrated model of the machine that recorded it (a file from "
                        "neo-train calibrate --nproc W --out FILE) and print predicted vs measured step and "
                        "collective times")
    p.add_argument("--free-core", action=argparse.BooleanOptionalAction, default=None,
                   help="with --calibration: an asynchronous all-reduce on a host with a core per rank ends once its "
                        "ranks have left it the blocking latency of free core time (default: on; --no-free-core: "
                        "off; simulate_calibrated's free_core, notes/sim_validation.md, 2026-11-28 and 2026-11-29)")
    p.add_argument("--warmup-steps", type=nonnegative_int, default=None,
                   help=f"with --trace and recorded compute: steps left out of predicted vs measured "
                        f"(default {WARMUP_STEPS})")


def trace_cluster_shape(world: int, default_gpus: int, *, nodes: int | None = None, gpus_per_node: int | None = None,
                        network: str = "fattree") -> tuple[int, int]:
    """(nodes, GPUs per node) for simulating a trace of ``world`` ranks (rank r on node r // G).

    G: ``gpus_per_node`` when given (it must divide ``world``), else the largest divisor of
    ``world`` up to ``default_gpus`` (the topology's): a trace recorded on one machine with fewer
    ranks than the topology's GPUs per node is one node of ``world`` GPUs; a multiple of the
    topology's keeps it. Nodes: ``nodes`` when given (it must hold world // G nodes), else
    world // G (Opera: the smallest of its study layouts, 16 / 128 / 1024, that holds them).
    Inconsistent explicit values are a one-line ValueError naming the flags."""
    if world < 1:
        raise ValueError(f"the trace's world size must be >= 1, got {world}")
    if gpus_per_node is not None:
        G = gpus_per_node
        if world % G:
            raise ValueError(f"--gpus-per-node {G} does not divide the trace's world size {world} (rank r runs on node "
                             f"r // {G}); give a divisor of {world}, or leave --gpus-per-node out to derive it")
    else:
        G = max(d for d in range(1, min(default_gpus, world) + 1) if world % d == 0)
    need = world // G
    if nodes is not None:
        if nodes < need:
            how = f"--gpus-per-node {G}" if gpus_per_node is not None else f"{G} GPUs per node (derived from the trace)"
            raise ValueError(f"--nodes {nodes} is too few for the trace: its {world} ranks at {how} need {need} nodes")
        return nodes, G
    if network == "opera":
        from .opera import OPERA_PRESETS

        return next((n for n in sorted(OPERA_PRESETS) if n >= need), need), G
    return need, G


def _parse_compute(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        if "=" not in part:
            raise ValueError(f"--compute: expected marker=seconds, got {part!r}")
        k, v = (x.strip() for x in part.rsplit("=", 1))
        try:
            sec = float(v)
        except ValueError:
            raise ValueError(f"--compute: {k}={v!r} is not a number of seconds") from None
        if not math.isfinite(sec):
            raise ValueError(f"--compute: {k}={v}: seconds must be a finite number, got {v}")
        if sec < 0:
            raise ValueError(f"--compute: {k}={v}: seconds must be >= 0, got {v}")
        out[k] = sec
    return out


def entry_sizes(kind: str, group: Sequence[int], by_rank: Mapping[int, Mapping[str, Any]]) -> Any:
    """Bytes of a matched collective for ``calibrate.fabric_comm``: all_to_allv the (g, g) matrix
    of per-peer bytes (group[i] -> group[j]), all_reduce S, all_gather / reduce_scatter the g
    per-rank segments, barrier 0."""
    e0 = by_rank[min(by_rank)]
    g = len(group)
    if kind == "barrier":
        return 0.0
    size = _dtype_bytes(e0)
    if kind == "all_to_allv":
        M = np.zeros((g, g))
        for i, r in enumerate(group):
            e = by_rank.get(r, e0)
            split = e.get("in_split") or [int(e.get("in_msg_size") or 0) // g] * g
            if len(split) != g:
                raise ValueError(f"trace rank {r} entry {e.get('_pos')}: in_split has {len(split)} entries for a group "
                                 f"of {g}")
            M[i] = np.asarray(split, dtype=np.float64) * size
        return M
    if kind == "all_reduce":
        return float(e0.get("in_msg_size") or 0) * size
    if kind == "all_gather":
        seg = e0.get("out_split") or [int(e0.get("in_msg_size") or 0)] * g
        return [float(v) * size for v in seg]
    if kind == "reduce_scatter":
        seg = e0.get("in_split") or [int(e0.get("out_msg_size") or 0)] * g
        return [float(v) * size for v in seg]
    raise ValueError(f"trace: no fabric sizes for collective {kind!r}")


def _calibrated_kind(kind: str) -> str:
    """The calibration's name of a trace's collective kind: an even all-to-all is an all_to_allv."""
    return "all_to_allv" if kind == "all_to_all" else kind


def calibrated_collectives(cal: Calibration, free: Mapping[str, Sequence[tuple[float, float, float]]] | None = None):
    """A ``timeline_phases`` factory on the calibrated fabric: the kind's latency (a Compute: it
    holds no link) before its bytes on the fabric. An asynchronous collective (the trace's
    ``async``) takes the calibration's fit for collectives launched while the ranks compute, where
    it has one (``Calibration.async_kinds``: a busy calibration's), and what company in flight
    with it adds (``_concurrent`` in its entries, ``trace_input.concurrent_collectives``); for the
    share of its time its ranks wait idle for it (``_idle`` in its entries, ``idle_shares``), the
    blocking fit, less the launch's recorded time, the mean over the ranks' (``Calibration.latency``:
    the two fits combined as rates, ``calibrate.RATE_MIX``);
    the asynchronous share grows with the compute its ranks do over it beyond the calibration's
    (``_over``, ``trace_input.compute_over``; ``KindFit.overlap_slope``). ``free``: the free core
    time after each collective's start (``free_core_times``, by its Comm's name): an asynchronous
    collective of ``FREE_CORE_KINDS`` ends once that time reaches the blocking fit's latency, less
    the launch, where that is sooner than the above (``free_core_latency``). A blocking call with an
    asynchronous collective live beside it (``_company``, ``trace_input.live_company``) takes what
    that collective's company costs on top (``Calibration.company``). An all-reduce of fewer than
    two elements per rank (its ``in_msg_size``) takes the latency fitted to such cells
    (``calibrate.few_elements``)."""

    def make(kind: str, group: list, by_rank: Mapping[int, dict], name: str, after: tuple):
        if len(group) < 2:
            return None
        k = _calibrated_kind(kind)
        if k not in KINDS + ("barrier",):
            raise ValueError(f"--calibration: the calibrated model has no {kind} (it models {', '.join(KINDS)}); "
                             f"collective {name}")
        e0 = by_rank[min(by_rank)]
        asy = bool(e0.get("async"))
        idle = float(e0.get("_idle", 0.0))
        launch = statistics.fmean(float(e.get("issue_ns", e.get("call_ns")) or 0) for e in by_rank.values()) / 1e9 \
            if asy else 0.0  # the launch up to the issue, where the simulator starts it
        few = few_elements(k, len(group), float(e0.get("in_msg_size") or 0))  # an all-reduce of a few elements
        seconds = cal.latency(k, len(group), asy, concurrent=bool(e0.get("_concurrent")), idle=idle, launch_s=launch,
                              over_s=float(e0.get("_over", 0.0)), few=few)
        if not asy and e0.get("_company"):  # an asynchronous collective live beside the blocking call
            seconds += cal.company(_calibrated_kind(e0["_company"][0]), e0["_company"][1])
        if asy and free and name in free and k in FREE_CORE_KINDS and k in cal.kinds:
            seconds = min(seconds, free_core_latency(free[name], max(0.0, cal.latency(k, len(group), few=few) - launch)))
        lat = Compute(f"latency:{name}", seconds, after)
        comm = cal.comm(k, group, entry_sizes(k, group, by_rank), name=name, after=(lat.name,), async_op=asy,
                        idle=idle)
        return [lat, comm], comm.name

    return make


ORDERED_LAGS = True
"""``calibrated_return_lags`` hands the drawn lags out in the run's order of leaving each
collective (``trace_input.leave_order``). The ranks' compute after a collective is replayed as
recorded, and on a host with fewer cores than ranks it depends on that order: the rank that left
last computes less after it (measured, W = 4 plain runs of FG:
correlation −0.23 to −0.30 between a rank's place in leaving DDP's bucket and its compute up to the
next step's ids), so lags drawn at random spread the next collective's arrivals wider than the run's
(W = 4 TW plain's ids: 5.2 ms against 4.4; notes/sim_validation.md, "2026-11-28, session 30").
Built in session 33 together with ``FREE_CORE``: W = 4 TW plain's ids +22.1 -> +9.7 % on average
over eleven runs ("2026-11-29, session 33"). False: the random order (tests, comparisons)."""


def calibrated_return_lags(cal: Calibration, seed: int = 0):
    """A ``timeline_phases`` ``return_lags`` from the calibration's spread: the ranks that wait for
    a collective (in a blocking call, or a wait that blocks) do not resume together. It ends when
    the first of them returns (alpha, or an asynchronous collective's D, is fitted to that); one
    rank resumes then, and each other after an exponential lag of mean ``spread * g / (g - 1)``,
    so the mean return over the ranks is the calibrated cell's while the last one, which the next
    collective waits for, is as late as on the host. Which rank gets which lag is the run's order
    of leaving it (``_leave`` in its entries, ``trace_input.leave_order``; ``ORDERED_LAGS``): the
    first to leave none, the others the drawn lags sorted; where the trace does not place its
    ranks, at random (one rank drawn to resume at the end). A rank that reaches
    its wait after the end plus its lag resumes at once. Draws from ``seed``, in the trace's order
    of collectives: the same trace and seed give the same timeline. The spread of an asynchronous
    collective mixes in the blocking one by the share of its time its ranks wait idle for it
    (``_idle``, as ``calibrated_collectives``). The ranks that return first compute on while the
    others wait for a core: where they compute longer after it than the calibration's burst
    (``_after``, ``trace_input.compute_after``), the lagging ranks' lags grow by
    ``Calibration.lag_after`` (per rank that lags: times g / (g - 1))."""
    rng = np.random.default_rng(seed)

    def lags(kind: str, group: list, by_rank: Mapping[int, dict]) -> dict[int, float]:
        g = len(group)
        e0 = by_rank[min(by_rank)]
        k = _calibrated_kind(kind)
        m = cal.spread(k, g, bool(e0.get("async")), float(e0.get("_idle", 0.0)))  # 0 for one
        if m <= 0:
            return {}
        drawn = rng.exponential(m * g / (g - 1), g).tolist()
        first = int(rng.integers(g))
        place = {r: by_rank[r].get("_leave") for r in group if r in by_rank}
        if ORDERED_LAGS and len(place) == g and None not in place.values():
            # the same draws, the rank that left first in the run at 0 and the others' lags in their order
            ordered = sorted(group, key=place.__getitem__)
            out = {ordered[0]: 0.0} | dict(zip(ordered[1:], sorted(drawn[:first] + drawn[first + 1:])))
        else:
            out = dict(zip(group, drawn))
            out[group[first]] = 0.0
        extra = cal.lag_after(k, g, float(e0.get("_after", 0.0))) * g / (g - 1)  # on the g - 1 that lag
        return {r: v + extra if v > 0 else v for r, v in out.items()} if extra > 0 else out

    return lags


IDLE_PASSES = 6
"""At most this many simulations of a calibrated trace (``simulate_calibrated``): the first with no
rank idle, each next with the idle shares of the one before, until no share moves by more than
``IDLE_TOLERANCE``: 2 - 6 on the validation's traces, mostly 3 - 5 (each pass moves the shares
about a fifth to a third as much as the one before)."""
IDLE_TOLERANCE = 0.02


def idle_shares(tl: Timeline, res: SimResult, blocked: float = 0.0, together: bool = False) -> dict[tuple, float]:
    """{key: share} for the asynchronous collectives of a simulated timeline: the share of the
    collective's time (from its last rank's launch, where its first phase starts, to its end) that its
    ranks spent waiting for it, each in its own wait, summed over the ranks and divided by the
    group's size times that time (one joined by a backward: the ranks' waits at the backward's end).
    A rank computing, or waiting for another asynchronous collective, is busy: its core serves that
    work (a wait on a collective in flight keeps its transport's threads running). A rank blocked in
    another collective's call between this one's launch and its join counts ``blocked`` of that time
    (``BLOCKED_IDLE`` where the host had a core for each rank, ``simulate_calibrated``: the freed
    core serves both transports; 0 elsewhere, where other ranks' compute takes it). Blocking calls
    have no share: the blocking fit is theirs. ``together`` (``IDLE_TOGETHER``, where the host had
    fewer cores than ranks): only the time during which every rank of the group waits for it at
    once counts, the share of the collective's time it covers."""
    end = {p.name: p.end for p in res.phases}
    start = {p.name: p.start for p in res.phases}
    waits: dict[tuple, list[tuple[float, float, float]]] = {}  # (from, to, weight) per rank interval
    for rank, blocks in tl.blocks.items():
        joined = {k for b in blocks if b.kind == "wait" for k in b.colls}
        in_flight: dict[tuple, None] = {}  # launched on this rank, not yet joined, in launch order
        for b in blocks:
            a, z = tl.nodes[(rank, b.order)]
            if b.kind == "wait":
                for k in b.colls:
                    waits.setdefault(k, []).append((end[a], end[z], 1.0))
                    in_flight.pop(k, None)
            elif not b.sync:
                if b.colls[0] in joined:  # one this rank never joins has no share here
                    in_flight[b.colls[0]] = None
            elif blocked > 0 and b.colls[0] not in tl.local:
                for k in in_flight:
                    waits.setdefault(k, []).append((end[a], end[z], blocked))
    out: dict[tuple, float] = {}
    for key, by_rank in tl.colls.items():
        if key in tl.local or key not in waits or not by_rank[min(by_rank)].get("async"):
            continue
        comm = tl.comm_end[key]
        t0, t1 = start[tl.comm_start[key]], end[comm]
        if t1 <= t0:
            continue
        if together:
            share = _all_waiting(waits[key], len(by_rank), t0, t1) / (t1 - t0)
        else:
            spent = sum(w * max(0.0, min(z, t1) - max(a, t0)) for a, z, w in waits[key])
            share = min(1.0, spent / (len(by_rank) * (t1 - t0)))
        if share > 0:
            out[key] = share
    return out


def _all_waiting(spans: Sequence[tuple[float, float, float]], ranks: int, t0: float, t1: float) -> float:
    """Seconds of [t0, t1] during which ``ranks`` of ``spans`` (from, to, weight; one rank's own
    waits do not overlap each other, so the spans in force count the ranks waiting) hold at once;
    only full-weight waits count (a rank blocked in another call is not waiting for this one)."""
    events = sorted(ev for a, z, w in spans if w >= 1.0 and min(z, t1) > max(a, t0)
                    for ev in ((max(a, t0), 1), (min(z, t1), -1)))
    n, last, spent = 0, t0, 0.0
    for t, d in events:
        if n >= ranks:
            spent += t - last
        n, last = n + d, t
    return spent


IDLE_TOGETHER = True
"""Where the calibrated host had fewer cores than ranks (``Calibration.cores_short``), an
asynchronous collective's idle share counts only the time during which all its ranks wait for it
at once (``idle_shares(together=True)``), not the mean over them: one rank waiting while the others
compute frees nothing their compute does not take, so the collective runs at the blocking fit's
speed only once they all wait. Offline on the AMD EPYC VM's runs FA - FD (``sim_validation.py
--rescore``): W = 3, 4's DDP buckets 0 - 8 points longer (they were short: W = 4 −12 to −28 %), rows
+1, +1, 0, 0, none lost (notes/sim_validation.md, "2026-11-28, session 28")."""


BLOCKED_IDLE = 0.5
"""``idle_shares``' weight of the time a rank spends blocked in another collective's call while an
asynchronous collective of its is in flight, on a host with a core for each rank
(``Calibration.core_per_rank``): the core the blocked rank frees serves the two collectives'
transports, half each. On the validation's W = 2 traces it moved TWRW's bucket, launched just before
the backward's blocking node-local all-gather, from +0 to +46 % (weight 0) or −6 to −28 % (weight 1)
to −15 to +18 %, and gained rows on five runs of six, losing none (notes/sim_validation.md,
"2026-11-25, session 26"); counted at W = 3, 4 (more ranks than cores) it lost rows."""


FREE_CORE_KINDS = ("all_reduce",)
"""The kinds ``simulate_calibrated(free_core=True)`` gives free core time (``free_core_times``):
DDP's bucket is the row it is for. Offline on runs FA and FB (the AMD EPYC VM) every asynchronous
kind gave the same counts, with W = 2's all-to-alls 3 - 11 points shorter (notes/sim_validation.md,
"2026-11-28, session 27")."""
FREE_WAIT_OTHER = 1.0
"""``free_core_times``' rate for a rank waiting for another asynchronous collective (0.5 on FA and FB
gained nothing: notes/sim_validation.md, "2026-11-28, session 27")."""


def free_core_times(tl: Timeline, res: SimResult, blocked: float = BLOCKED_IDLE
                    ) -> dict[str, list[tuple[float, float, float]]]:
    """{an asynchronous collective's Comm name (of ``FREE_CORE_KINDS``): [(from, to, rate)]}: where
    its ranks' cores are free of compute after its start (seconds from it), at what rate the freed
    core serves it; at each
    instant the fastest of its ranks'. A rank waiting for it: rate 1, until the collective ends
    (open: the wait lasts as long as it does); waiting for another asynchronous collective:
    ``FREE_WAIT_OTHER``; blocked in another collective's call: ``blocked`` (its own transport takes
    the rest; ``BLOCKED_IDLE``). Computing, or in a launch: none. From a simulated timeline, as
    ``idle_shares``; read by ``calibrated_collectives`` (``free_core_latency``). A rank's stops after
    its own wait are not looked at: that wait frees its core at the highest rate until the end."""
    end = {p.name: p.end for p in res.phases}
    start = {p.name: p.start for p in res.phases}
    stops: dict[int, list[tuple[float, float, tuple, bool]]] = {}  # per rank, in time order
    for rank, blocks in tl.blocks.items():
        stops[rank] = [(end[tl.nodes[(rank, b.order)][0]], end[tl.nodes[(rank, b.order)][1]], b.colls, b.sync)
                       for b in blocks if b.kind == "wait" or (b.sync and b.colls[0] not in tl.local)]
    stop_ends = {r: [z for _, z, _, _ in v] for r, v in stops.items()}
    out: dict[str, list[tuple[float, float, float]]] = {}
    for key, by_rank in tl.colls.items():
        e0 = by_rank[min(by_rank)]
        if key in tl.local or not e0.get("async") or _calibrated_kind(_comm_name(e0)) not in FREE_CORE_KINDS:
            continue
        t0 = start[tl.comm_start[key]]
        spans = []
        for r in by_rank:  # its stops from the collective's start up to its own wait, which is open
            for a, z, colls, sync in stops.get(r, [])[bisect.bisect_right(stop_ends.get(r, []), t0):]:
                if key in colls:
                    spans.append((max(a, t0) - t0, math.inf, 1.0))
                    break
                spans.append((max(a, t0) - t0, z - t0, blocked if sync else FREE_WAIT_OTHER))
        out[tl.comm_end[key]] = _fastest(spans)
    return out


def _fastest(spans: Sequence[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """[(from, to, rate)] where any of ``spans`` (from, to, rate) covers, at the fastest rate of
    those covering each piece, in order."""
    cuts = sorted({x for a, z, _ in spans for x in (a, z)})
    segs = []
    for a, z in zip(cuts, cuts[1:]):
        rate = max((w for s0, s1, w in spans if s0 <= a and s1 >= z), default=0.0)
        if rate > 0:
            segs.append((a, z, rate))
    return segs


def free_core_latency(segments: Sequence[tuple[float, float, float]], need: float) -> float:
    """Seconds from a collective's start until ``segments`` (``free_core_times``) have given it
    ``need`` seconds of a core, and at least ``need``; inf where they never do."""
    if need <= 0:
        return 0.0
    for a, z, rate in segments:
        if (z - a) * rate >= need:
            return max(need, a + need / rate)
        need -= (z - a) * rate
    return math.inf


FREE_CORE = True
"""``simulate_calibrated``'s default for ``free_core`` (``neo-train simulate --trace --calibration``
with ``--no-free-core`` turns it off): an option from session 27 to 32, the default since session 33,
when it and ``ORDERED_LAGS`` together gave 1215 of 1232 collective rows over eleven kept runs of the
AMD EPYC VM against 1203 without them (W = 2's DDP buckets +16.6 -> +0.5 % on average for TW
pipelined, +19.7 -> +4.9 % for RW pipelined), the steps 24/24 in each, and no run lost a row
(notes/sim_validation.md, "2026-11-29, session 33")."""


def simulate_calibrated(traces: Mapping[int, list], cal: Calibration, *, seed: int = 0, passes: int = IDLE_PASSES,
                        free_core: bool = FREE_CORE, **simulate_kw: Any) -> tuple[Timeline, SimResult, int]:
    """The trace's per-rank chains on the calibrated fabric, with return lags (``seed``), simulated
    until the idle shares settle (``idle_shares``, ``IDLE_PASSES``): (timeline, result, passes run).
    An asynchronous collective costs what the calibration's asynchronous fit says while its ranks
    compute, and what the blocking fit says while they wait idle for it; which it is depends on
    the simulated schedule, so the shares of one pass set the costs of the next (where the host had
    fewer cores than ranks, only the time all of a collective's ranks wait for it at once counts:
    ``IDLE_TOGETHER``). The result's ``wall_seconds`` is what all the passes took.

    ``free_core`` (``FREE_CORE``, on by default; where the calibrated host had a core for each rank,
    ``Calibration.core_per_rank``): a transport there is starved while its ranks compute (a W = 2
    all-reduce under any compute completes once the compute ends; notes/sim_validation.md,
    "2026-11-28, session 27"), so an asynchronous all-reduce ends once its ranks' free core time
    (``free_core_times``, of the pass before) reaches the blocking fit's latency, where that is
    sooner than the model above. On three runs of the AMD EPYC VM it moved W = 2's DDP bucket from
    +5 to +46 % to −11 to +32 % (rows 106 -> 108 and 109 -> 110 offline, 109 -> 111 in a fresh run).
    Where that bucket was −4 to +22 % without it (the Intel host's runs, and run FH on the AMD host) it
    shortens the bucket too far (FH: 108 -> 106 rows under session 30's model; "2026-11-28, session
    30"), so it was an option until session 33; with the fits combined as rates (``calibrate.RATE_MIX``)
    the model is this rule with some progress while the ranks compute, and it leaves FH's count as it
    was (``FREE_CORE``). The Intel host's runs were not kept, so they have not been rescored with it."""
    net = cal.network()
    free_core = free_core and cal.core_per_rank
    idle: dict[tuple, float] = {}
    free: dict[str, list[tuple[float, float, float]]] = {}
    wall = 0.0
    for n in range(1, max(1, passes) + 1):
        tl = timeline_phases(traces, calibrated_collectives(cal, free), calibrated_return_lags(cal, seed),
                             idle)  # the same draws each pass
        res = simulate(tl.phases, net, **simulate_kw)
        wall += res.wall_seconds
        if n == passes:
            break
        new = idle_shares(tl, res, BLOCKED_IDLE if cal.core_per_rank else 0.0,
                          together=IDLE_TOGETHER and cal.cores_short)
        new_free = free_core_times(tl, res) if free_core else {}
        if new_free == free and all(abs(new.get(k, 0.0) - idle.get(k, 0.0)) <= IDLE_TOLERANCE
                                    for k in set(new) | set(idle)):
            break
        idle, free = new, new_free
    return tl, dataclasses.replace(res, wall_seconds=wall), n


@dataclass
class TraceValidation:
    """The run's recorded timeline next to the simulated one (``validate_timeline``)."""

    steps: list[dict[str, Any]]
    """Per step: measured_s, predicted_s (means over ranks of the step's span), steady (counted)."""
    collectives: list[dict[str, Any]]
    """Per (marker, collective, sync/async): instances, medians and means of measured / predicted
    duration (issue to done, as the rank saw it) and of blocked time (the rank waiting for it)."""
    warmup_steps: int

    def steady(self) -> list[dict[str, Any]]:
        return [s for s in self.steps if s["steady"]]

    def step_time(self, which: str, how: str = "median") -> float:
        v = [s[which] for s in self.steady()]
        if not v:
            return math.nan
        return float(statistics.median(v) if how == "median" else statistics.fmean(v))

    def summary(self) -> dict[str, Any]:
        m, p = self.step_time("measured_s"), self.step_time("predicted_s")
        mm, pm = self.step_time("measured_s", "mean"), self.step_time("predicted_s", "mean")
        return {"steps": len(self.steady()), "warmup_steps": self.warmup_steps, "measured_step_s": m,
                "predicted_step_s": p, "step_error": p / m - 1 if m > 0 else math.nan,
                "measured_step_mean_s": mm, "predicted_step_mean_s": pm,
                "step_mean_error": pm / mm - 1 if mm > 0 else math.nan, "collectives": self.collectives}

    def table(self) -> str:
        s = self.summary()
        lines = [f"predicted vs measured, {s['steps']} steady steps (the first {self.warmup_steps} left out), "
                 f"mean over ranks per step:",
                 f"  step time median {s['measured_step_s'] * 1e3:.2f} ms measured, {s['predicted_step_s'] * 1e3:.2f} "
                 f"ms predicted ({s['step_error']:+.1%}); mean {s['measured_step_mean_s'] * 1e3:.2f} / "
                 f"{s['predicted_step_mean_s'] * 1e3:.2f} ms ({s['step_mean_error']:+.1%})",
                 f"  {'marker':<22} {'collective':<15} {'mode':<5} {'n':>4} {'took ms meas':>12} {'pred':>8} {'err':>7} "
                 f"{'blocked meas':>12} {'pred':>7} {'net meas':>9} {'pred':>7}"]
        for r in self.collectives:
            err = r["predicted_s"] / r["measured_s"] - 1 if r["measured_s"] > 0 else math.nan
            net = (f"{r['measured_net_s'] * 1e3:9.3f} {r['predicted_net_s'] * 1e3:7.3f}" if r["measured_net_s"] is not None
                   else f"{'-':>9} {'-':>7}")
            lines.append(f"  {r['marker']:<22} {r['comms']:<15} {r['mode']:<5} {r['n']:>4} {r['measured_s'] * 1e3:12.3f} "
                         f"{r['predicted_s'] * 1e3:8.3f} {err:+7.1%} {r['measured_blocked_s'] * 1e3:12.3f} "
                         f"{r['predicted_blocked_s'] * 1e3:7.3f} {net}")
        return "\n".join(lines)


def validate_timeline(tl: Timeline, res: SimResult, warmup_steps: int = WARMUP_STEPS) -> TraceValidation:
    """Compare the recorded timeline with the simulated one.

    Measured: each rank's timeline rebuilt from its blocks (compute, then the block's recorded
    length), from its first block. Predicted: the same points in the simulated schedule. A step's
    span on a rank runs from its boundary to the next (the trainer marks a step's start; the loop's
    end closes the last); steps before ``warmup_steps`` (and outside the loop) are left out. Per
    collective, 'took' is issue to done as the rank saw it (``duration_ns``: a blocking call's
    return, an async one's wait, or, joined by a backward, its completion) and 'blocked' the time
    the rank waited in its call and wait."""
    end = {p.name: p.end for p in res.phases}
    start_pred = {k: end[a] for k, (a, _) in tl.nodes.items()}
    end_pred = {k: end[b] for k, (_, b) in tl.nodes.items()}
    start_meas: dict[tuple[int, int], float] = {}
    end_meas: dict[tuple[int, int], float] = {}
    for rank, blocks in tl.blocks.items():
        t = 0.0
        for b in blocks:
            start_meas[(rank, b.order)] = t + b.compute
            t = end_meas[(rank, b.order)] = t + b.compute + b.blocked
    # step spans
    spans: dict[int, dict[str, list[float]]] = {}
    for rank, bounds in tl.boundaries.items():
        for (step, node, b), nxt in zip(bounds, bounds[1:]):
            if step is None:
                continue
            _, node2, b2 = nxt
            meas = (start_meas[(rank, b2.order)] - b2.step_lead) - (start_meas[(rank, b.order)] - b.step_lead)
            pred = end[node2] - end[node]
            d = spans.setdefault(step, {"measured_s": [], "predicted_s": []})
            d["measured_s"].append(meas)
            d["predicted_s"].append(pred)
    steps = [{"step": s, "measured_s": statistics.fmean(v["measured_s"]), "predicted_s": statistics.fmean(v["predicted_s"]),
              "ranks": len(v["measured_s"]), "steady": s >= warmup_steps} for s, v in sorted(spans.items())]
    steady = {s["step"] for s in steps if s["steady"]}
    # per collective instance and rank
    call_of: dict[tuple[int, tuple], Block] = {}
    wait_of: dict[tuple[int, tuple], Block] = {}
    for rank, blocks in tl.blocks.items():
        for b in blocks:
            for k in b.colls:
                (call_of if b.kind == "call" else wait_of)[(rank, k)] = b
    groups: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for key, by_rank in tl.colls.items():
        if key in tl.local:
            continue
        for rank, e in by_rank.items():
            c = call_of.get((rank, key))
            if c is None or c.step not in steady or e.get("duration_ns") is None:
                continue
            w = wait_of.get((rank, key))
            s0 = start_pred[(rank, c.order)]
            if c.sync:
                took = end_pred[(rank, c.order)] - s0
                blocked_m, blocked_p = c.blocked, took
            elif w is not None and e.get("joined_by", "wait") == "wait":
                took = end_pred[(rank, w.order)] - s0
                blocked_m, blocked_p = w.blocked, end_pred[(rank, w.order)] - start_pred[(rank, w.order)]
            else:
                took = end[tl.comm_end[key]] - s0
                blocked_m = w.blocked if w is not None else 0.0
                blocked_p = end_pred[(rank, w.order)] - start_pred[(rank, w.order)] if w is not None else 0.0
            row = groups.setdefault((_phase(e), _comm_name(e), "sync" if c.sync else "async"),
                                    {"measured_s": [], "predicted_s": [], "mb": [], "pb": []})
            row["measured_s"].append(e["duration_ns"] / 1e9)
            row["predicted_s"].append(took)
            row["mb"].append(blocked_m)
            row["pb"].append(blocked_p)
        net = _net_times(key, by_rank, call_of, start_pred, end_pred, end[tl.comm_end[key]], steady)
        if net is not None:
            e0 = by_rank[min(by_rank)]
            mode = "async" if e0.get("async") else "sync"
            row = groups.setdefault((_phase(e0), _comm_name(e0), mode), {"measured_s": [], "predicted_s": [], "mb": [],
                                                                         "pb": []})
            row.setdefault("mn", []).append(net[0])
            row.setdefault("pn", []).append(net[1])
    colls = []
    for (m, c, mode), v in sorted(groups.items()):
        if not v["measured_s"]:
            continue
        colls.append({"marker": m, "comms": c, "mode": mode, "n": len(v["measured_s"]),
                      "measured_s": statistics.median(v["measured_s"]), "predicted_s": statistics.median(v["predicted_s"]),
                      "measured_mean_s": statistics.fmean(v["measured_s"]),
                      "predicted_mean_s": statistics.fmean(v["predicted_s"]),
                      "measured_blocked_s": statistics.median(v["mb"]), "predicted_blocked_s": statistics.median(v["pb"]),
                      "measured_blocked_mean_s": statistics.fmean(v["mb"]),
                      "predicted_blocked_mean_s": statistics.fmean(v["pb"]),
                      "measured_net_s": statistics.median(v["mn"]) if v.get("mn") else None,
                      "predicted_net_s": statistics.median(v["pn"]) if v.get("pn") else None})
    return TraceValidation(steps, colls, warmup_steps)


def _net_times(key: tuple, by_rank: Mapping[int, dict], call_of: Mapping, start_pred: Mapping, end_pred: Mapping,
               comm_end: float, steady: set) -> tuple[float, float] | None:
    """(measured, predicted) seconds from the last rank's call (an asynchronous collective: the
    last rank's issue inside its launch, or without one recorded the launch's return, where the
    simulator starts it) to the collective's end: in the
    run, the mean over its ranks of their return (a blocking call) or completion (joined by a
    backward), on the wall clock (``startTime_ns``: one host); in the simulation, likewise the mean
    over its ranks of their resumption (a blocking call's ranks lag its Comm's end by their return
    lags) or its Comm's end.
    The part of 'took' that is the collective itself rather than waiting for late ranks: it tells
    the network model's error from the schedule's. None when the run does not show it (an async
    collective joined by a wait: its completion is not recorded; or a CUDA trace, whose durations
    are the device's while ``startTime_ns`` is each host's clock)."""
    starts, dones, arrive, resume = [], [], [], []
    for rank, e in by_rank.items():
        c = call_of.get((rank, key))
        if c is None or c.step not in steady or e.get("startTime_ns") is None or e.get("duration_ns") is None:
            return None
        if e.get("clock") == "cuda":
            return None
        if not c.sync and e.get("joined_by") != "backward":
            return None
        starts.append(e["startTime_ns"] + c.starts_at * 1e9)  # a call's start, an async launch's issue
        dones.append(e["startTime_ns"] + (e["call_ns"] if c.sync else e["duration_ns"]))
        arrive.append(start_pred[(rank, c.order)] + c.starts_at)
        resume.append(end_pred[(rank, c.order)] if c.sync else comm_end)
    if len(starts) < 2:
        return None
    return (statistics.fmean(dones) - max(starts)) / 1e9, statistics.fmean(resume) - max(arrive)


def _comm_only(res: SimResult) -> SimResult:
    """The result's collectives only (the per-rank chains' compute nodes are thousands of lines)."""
    keep = [p for p in res.phases if p.kind != "compute"]
    return SimResult(res.network, res.total, keep, res.wall_seconds, res.stats)


def free_core_flag(args: argparse.Namespace) -> str | None:
    """The free core flag given on the command line (``--free-core`` or ``--no-free-core``), None
    where neither was (``add_trace_arguments``): for the errors that name it."""
    given = getattr(args, "free_core", None)
    return None if given is None else ("--free-core" if given else "--no-free-core")


def simulate_trace(args: argparse.Namespace, overrides: dict[str, Any], bulk_threshold: float
                   ) -> tuple[SimResult, dict[str, Any], ClusterSpec]:
    """``neo-train simulate --trace``: the recorded trace on the cluster it derives, or with
    ``--calibration`` on the calibrated model of the machine that recorded it (see the module
    docstring); returns the result, the summary row and the cluster."""
    compute_off = args.compute.strip().lower() == "none"
    compute = {} if compute_off else _parse_compute(args.compute)
    traces = load_trace(args.trace)
    world = trace_world_size(traces)
    check_compute_markers(trace_markers(traces), compute, "--compute")
    calibration = getattr(args, "calibration", None)
    free_core = getattr(args, "free_core", None)  # None: not given (the default, FREE_CORE)
    if free_core is not None and not calibration:
        raise ValueError(f"{free_core_flag(args)} applies to --calibration (the calibrated model of the recording "
                         "machine)")
    cal = Calibration.load(calibration) if calibration else None
    if cal is not None:
        cal.check_for(world, trace_transports(traces), f"trace {args.trace}")
    default_gpus = cluster_for(args.topology, 1).devices_per_node
    nodes, G = trace_cluster_shape(world, default_gpus, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                                   network=args.network)
    recorded = has_recorded_compute(traces)
    per_rank = recorded and not compute and not compute_off
    if not (per_rank or compute or compute_off):
        # as before recorded compute existed: the communication alone, said once
        first = min(traces)
        where = getattr(traces, "files", {}).get(first, args.trace)
        print(f"note: trace {where}: no recorded compute times (rank {first}'s entries have no field 'compute_ns'; "
              f"neo-train train --trace-dir records them): simulating the communication only; give --compute "
              f"marker=seconds (its markers: {', '.join(trace_markers(traces))}) to add compute")
        compute_off = True
    if cal is not None and not per_rank:
        raise ValueError("--calibration replays the trace's own recorded compute per rank; it does not combine with "
                         "--compute (leave --compute out, on a trace recorded by neo-train train --trace-dir)")
    ar = "ring" if args.allreduce == "auto" and args.network != "opera" else (
        "dps" if args.allreduce == "auto" else args.allreduce)
    if cal is not None:
        # the recording machine: its devices from the cpu_local preset (CPU ranks) or the topology
        # (GPUs; not used by the simulation), its fabric from the calibration
        base = "cpu_local" if cal.device == "cpu" else args.topology
        G_cal = cal.devices_per_host
        share = cal.bandwidth / G_cal  # per device: the shared fabric is split among the ranks on it
        cluster = cluster_for(base, cal.world_size // G_cal, G_cal, **overrides).replace(
            name=f"calibrated {cal.transport}/{cal.device}, {cal.fabric} fabric", devices_per_nic=G_cal,
            intra_node_bandwidth=share, inter_node_bandwidth=cal.bandwidth,
            intra_node_latency=cal.latency("all_to_allv", cal.world_size) if "all_to_allv" in cal.kinds else 0.0,
            inter_node_latency=cal.latency("all_to_allv", cal.world_size) if "all_to_allv" in cal.kinds else 0.0)
        print(f"trace: {world} ranks; network: the calibrated model of the recording machine ({calibration}; "
              f"--network / --topology / --nodes do not apply)")
        print(cal.table())
        ar = "calibrated"
    else:
        cluster = cluster_for(args.topology, nodes, G, **overrides)
        derived = "" if args.gpus_per_node else f" (GPUs per node derived from the trace; the topology has {default_gpus})"
        print(f"trace: {world} ranks on {world // G} node(s) of {G} GPUs{derived}")
        net = make_network(args.network, cluster, bulk_threshold=bulk_threshold, vlb=not args.no_vlb, seed=args.seed,
                           routing=args.routing)
        net.hosts_for(world)  # a clear error when the trace needs more hosts
        factory = network_collectives(world, G, ar)
    row: dict[str, Any] = {"trace": str(args.trace), "nodes": cluster.nodes, "network": args.network if cal is None
                           else "calibrated", "allreduce": ar}
    if per_rank:
        print("compute: each rank's recorded compute (per-rank chains joined at collectives)")
        warmup = getattr(args, "warmup_steps", None)
        warmup = WARMUP_STEPS if warmup is None else warmup
        gap, overlap, by_kind, share = trace_load(traces, warmup)
        by_kind = {k: v for k, v in by_kind.items() if k in KINDS}  # the kinds a calibration measures
        if gap > 0:
            kinds = ",".join(f"{k}={v * 1e3:.2f}" for k, v in by_kind.items()) or f"{overlap * 1e3:.2f}"
            print(f"duty: {gap * 1e3:.2f} ms of compute between blocking intervals, {overlap * 1e3:.2f} ms while an "
                  f"asynchronous collective is in flight, computing {share:.0%} of the time (a calibration for this "
                  f"trace: neo-train calibrate --nproc {world} --busy-ms {gap * 1e3:.2f} --overlap-ms {kinds} --out "
                  f"FILE; its ranks' own share is in the file's meta)")
        if cal is not None:
            tl, res, passes = simulate_calibrated(traces, cal, aggregate=not args.exact, fast_forward=not args.exact,
                                                  progress=True,
                                                  free_core=FREE_CORE if free_core is None else free_core)
            print(f"simulated {passes} time(s), each with the asynchronous collectives' idle shares of the one "
                  f"before (simulate_calibrated)")
        else:
            tl = timeline_phases(traces, factory)
            res = simulate(tl.phases, net, aggregate=not args.exact, fast_forward=not args.exact, progress=True)
        val = validate_timeline(tl, res, warmup)
        if val.steady():
            print(val.table())
        else:
            print(f"no steady training steps marked in the trace (recorded by Trainer.run, after {val.warmup_steps} "
                  f"warm-up steps): nothing to compare; the whole trace takes {res.total * 1e3:.3f} ms simulated")
        summary = val.summary()
        # the iteration: the predicted step, or without step marks (no Trainer.run) the whole trace
        it = summary["predicted_step_s"] if val.steady() else res.total
        row |= {"iteration_s": it, "predicted_step_s": summary["predicted_step_s"],
                "measured_step_s": summary["measured_step_s"], "step_error": summary["step_error"],
                "makespan_s": res.total, "validation": summary}
        res = _comm_only(res)
    else:
        phases = trace_phases(traces, G, compute, allreduce=ar)
        res = simulate(phases, net, aggregate=not args.exact, fast_forward=not args.exact, progress=True)
        row["iteration_s"] = res.total
    row |= res.totals()
    return res, row, cluster
