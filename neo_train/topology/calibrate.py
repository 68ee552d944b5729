"""A measured model of one machine's collectives, for simulating traces recorded on it.

    samples = measure_collectives(comm)                 # on every rank of a job (any Communicator)
    cal = fit_calibration(samples, world_size=4, transport="gloo", device="cpu")
    cal.save("calib_w4.json"); cal = Calibration.load("calib_w4.json")
    net = cal.network()                                  # the flat network the fit describes
    comm = cal.comm("all_to_allv", group, sizes, name="a2a", after=(...))   # a Comm on it
    cal.latency("all_to_allv", 4)                        # seconds, added before the Comm
    cal.latency("all_to_allv", 4, async_op=True)         # launched, overlapped with compute (--busy-ms)

``neo-train calibrate --nproc 4 --out calib_w4.json`` measures and writes the file;
``neo-train simulate --trace DIR --calibration calib_w4.json`` uses it.

Model. A collective of kind k among g ranks takes ``alpha[k][g] + beta[k] * x``, where x is the
time the flow simulator gives its bytes on the *fabric* at one byte per second. Two fabrics are
fitted and the one with the smaller error is kept:

    shared     every rank behind one link of capacity C (ranks on one host whose transfers are
               copies by the same CPUs, e.g. gloo over loopback): x = bytes that leave a rank,
               summed over ranks (all-to-all: the off-diagonal splits; ring all-reduce 2(g-1)S;
               all-gather / reduce-scatter (g-1)T of the total T)
    per_rank   one link of capacity C per rank (a GPU behind its own NVLink port / NIC): the
               simulator's direct all-to-all, ring all-reduce and ring all-gather among g hosts

``alpha`` is per kind and group size (the fixed cost: software, synchronisation, scheduling of
more processes than cores); ``beta`` is per kind, shared by every group size (it is the fabric's).
C = 1 / beta of the all-to-all (the plainest transport measurement); another kind's bytes are
scaled by ``byte_factor = beta[k] / beta[all_to_allv]`` (its reductions, its algorithm's extra
copies). The fit minimises errors relative to the prediction (sizes span six orders of magnitude)
with non-negative coefficients, reweighted until it settles, so that a cell is charged its mean
(``_fit_kind``; relative to the measured times, the fit was biased towards the fastest cells).
In the simulator a collective is a ``Compute`` of alpha (it holds no link) followed
by its ``Comm``, so concurrent collectives share the fabric's bandwidth but not their latencies
(apart from what a busy calibration measured a companion in flight to add, below).

The ranks waiting for a collective do not resume together: on a host with more busy threads than
cores a rank whose data has arrived waits for a core, and the next collective waits for the last
of them, which a mean return leaves out (the step was under-predicted in every case,
notes/sim_validation.md, 2026-11-24, afternoon). So a blocking cell records when its first rank
returned (``first_s``, after the last rank's call) and the mean over its ranks of their return
after that first one (``spread_s``); an asynchronous cell, the same over the waits that blocked.
alpha (D) is fitted to the first return and ``KindFit.spread_s`` keeps the mean lag per group
size; the simulator draws each rank's lag around it (``trace_sim.calibrated_return_lags``).
``seconds`` stays the mean return (the ranks resuming together), which a file without the spread
is fitted to. The lag grows with how long the ranks that returned first compute after the call
(they hold the cores the others need): W = 4's node-local all-gather in TWRW's backward, followed
by 6 - 7 ms of the embedding backward, returned ~1.5 ms later than the calibration's cell, which is
followed by a burst of ``busy_s`` (notes/sim_validation.md, "2026-11-24, compute after a call").
So a busy calibration's third pass measures the spread with ``busy_s`` and ``AFTER_FACTOR`` x
``busy_s`` of compute after the call (``KindFit.after_lag``: its growth per second), and the
simulator lengthens the lags of a collective whose ranks compute longer than ``busy_s`` after it
by that much (``Calibration.lag_after``; shorter compute keeps the calibrated spread: shrinking it
lost rows).
An asynchronous collective also lasts longer the longer its ranks compute over it: on a host whose
cores the ranks hold, its transport threads wait for a core, and the later the compute ends the
later the stragglers among its steps run (a 36 KB all-reduce at W = 4 took 5.9, 6.9, 7.8, 8.7 ms
under 2.5, 5, 10, 20 ms of compute). The first pass's asynchronous cells draw the compute over them
at random (0 - 2 x the runs' mean per kind) and keep each iteration's draw and completion
(``iters_overlap_s``, ``iters_done_s``); the slope of the completion on the draw, within each cell,
is ``KindFit.overlap_slope`` (with the mean draw, ``overlap_mean_s``), and the simulator charges a
collective whose ranks compute longer over it than that mean the slope times the excess
(``Calibration.latency``'s ``over_s``; less compute is the idle share's business, ``_mix``:
charging it too lost rows; notes/sim_validation.md, "2026-11-25").
A busy calibration also fits the collectives launched asynchronously while the ranks compute
(``async_kinds``: alpha per kind and group size, beta per kind on the same fabric and C); the
simulator uses them for the trace's asynchronous collectives. Training often has two in flight at
once (the output dist beside the next batch's ids, the backward's beside DDP's bucket), and on a
host whose cores the ranks hold each then takes longer: a busy calibration's second pass measures
what that adds (``KindFit.concurrent_s``, per group size), and the simulator adds it to the
asynchronous collectives the trace's order shows in company (``trace_input.concurrent_collectives``),
once however many companions they have (one was measured); and to a blocking call made while an
asynchronous collective its ranks have all launched is in flight (``trace_input.live_company``,
``Calibration.company``: that collective's figure). The ranks do not always compute while
an asynchronous collective progresses: a rank that reaches its wait early blocks, and its core then
serves the transport, as in a blocking call. So the simulator charges an asynchronous collective
the asynchronous fit for the share of its time its ranks compute and the blocking fit for the
share they wait idle for it (``idle`` in ``Calibration.latency``, ``spread`` and ``comm``: latency,
spread and byte factor mixed in proportion); the share comes from the simulated schedule, which it
moves, so ``trace_sim.simulate_calibrated`` simulates again with the last pass's shares until they
settle. With the asynchronous fit alone, TW's output dists, which the ranks holding fewer tables
wait for while the others still look theirs up, came out 25 - 32 % long at every W
(notes/sim_validation.md, "2026-11-24, idle ranks"). Where the host has a core for each rank
(``Calibration.core_per_rank``), a rank blocked in another collective's call while one is in flight
frees its core for both transports, and half that time counts as idle for the one in flight
(``trace_sim.BLOCKED_IDLE``; notes/sim_validation.md, "2026-11-25, session 26").
An all-reduce of fewer than two elements per rank follows a shorter pattern than a larger one: gloo's
ring cuts its buffer into 2g segments, two per rank, and skips the sends of the empty ones, so its
smallest cell (one element per rank) took 2.05 ms at g = 4 where every larger one up to 128 KB took
3.8 - 4.0 (blocking; asynchronous 3.2 against 4.8 - 5.3; at g = 2 the 16-byte cell has four elements
and no empty segment). Fitted with the others, such cells pulled the latency of every group of three
or more ranks down, and DDP's bucket with it. They are fitted apart (``few_elements``,
``KindFit.few_latency_s``), and a trace's all-reduce of that few elements takes their latency
(notes/sim_validation.md, "2026-11-29, session 32").

Measurement (``measure_collectives``): for every kind, group size (ranks 0..g-1 of the job, the
others waiting; busy: the job cut into disjoint groups of that size running side by side, as a
plan's node-local and cross-node groups do) and message size, cells taking turns iteration by
iteration so that a noisy stretch of a shared host hits all of them alike. A call costs what the
simulator charges for it: the collective starts when the last rank of its group calls, and every
rank resumes when it ends. So an iteration's time is, per rank, its return minus the last rank's
call (on the wall clock: one host, or synchronised clocks), averaged over the group's ranks (not the
fastest rank: the slowest one holds the others up at the next collective); a cell's time is the
*mean* over iterations (the simulator adds a cost to every call, so a step takes the sum of their
expected costs; on a busy host a call's time has a long tail, which a median leaves out). *idle*:
each call after a barrier. *busy* (``busy_s``): every rank computes before each call, as in
training; then, as training issues its asynchronous collectives (the output dist, DDP's buckets),
the same collective launched asynchronously, the ranks computing on while it progresses, then waited
for: on a host whose cores the ranks' compute holds, the transport's threads wait for a core, which
a collective the ranks wait in does not see. The ranks launch it together (a barrier first) and
compute equally long (the same draw on every rank) before they wait, because training's ranks leave
the previous collective together and compute alike while theirs is in flight; launched apart and
drawn apart, the first rank to wait frees its core for the transport while the others still compute,
and on a host with more ranks than cores the collective looks shorter than it is in training
(notes/sim_validation.md, 2026-11-24, morning). Its cost is fitted separately
(``Calibration.async_kinds``): the duration D for which the simulator's rule for an asynchronous
collective (it ends D after the last rank handed it to the transport inside its launch, where the
backend marks that, ``Communicator.issued_at``, else after the last launch returned; a rank's wait
returns at the later of its start and that end) gives the measured mean return. Then a second
pass (busy, cells up to ``CONCURRENT_MAX_BYTES``): each launched asynchronously alone, and again
with its twin on another group launched right behind it, each after a burst and a barrier; the two
are fitted together with a latency column for the company, which is kept beside the first pass's
asynchronous fit (the second pass's load differs from the first's: interleaved with it, its extra
waits made every first-pass cell faster, notes/sim_validation.md, "2026-11-24, night"). A third
pass (busy, the
smallest and the largest of those cells) calls each blocking after a barrier and a burst, with
``busy_s`` x U(0.5, 1.5) of compute after the call, then ``AFTER_FACTOR`` x as long: the spreads'
difference per second of compute is ``KindFit.after_lag``. A busy calibration reports the
share of the time its ranks computed (``compute_share`` in its samples), to set beside the runs'
(``trace_input.trace_compute_share``, which ``neo-train simulate --trace`` prints): its barriers
and waits leave its ranks computing less of the time than training's (29 - 55 % against 49 - 68 %
at W = 2 here), and a transport thread that wakes while every core computes waits for a computing
thread's slice to end (up to a 4 ms scheduler tick), so there the asynchronous collectives come
out short. Holding the calibration at the runs' share with longer bursts was measured and left
out: the share hardly moves with the burst (54 -> 66 % for bursts of 1.5 -> 3.8 ms at W = 2) while
the predictions move by 15 points (notes/sim_validation.md, "2026-11-24, late"). Only the ``Communicator`` interface is used,
so the same code calibrates gloo on CPUs and NCCL on GPUs (where ``device`` is "cuda": the result is
read after the collective, which synchronises the stream).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .collectives import all_reduce as _ring_all_reduce
from .collectives import ring_all_gather
from .flat import FlatNetwork
from .simulator import Comm, Transfer, simulate

__all__ = ["Calibration", "KindFit", "CalibrationError", "KINDS", "FABRICS", "FORMAT", "DEFAULT_SIZES",
           "measure_collectives", "fit_calibration", "fabric_comm", "nnls", "add_calibrate_arguments", "parse_sizes",
           "few_elements"]

FORMAT = "neo_train.calibration/1"
CONCURRENT_MAX_BYTES = 128 << 10
"""The busy calibration's second pass (an asynchronous cell alone, then with a twin in flight)
measures the sizes up to this: what the company adds is a latency."""
AFTER_FACTOR = 3.0
"""The busy calibration's third pass calls the smallest and the largest second-pass cells blocking
with the ranks computing ``busy_s`` after the call, and again ``AFTER_FACTOR`` x ``busy_s``: how the
ranks' return lag grows with the compute after it (``KindFit.after_lag``)."""
RATE_MIX = True
"""An asynchronous collective whose ranks wait idle for part of its time (``Calibration.latency``'s
``idle``) costs the harmonic mean of the asynchronous and blocking fits' seconds, weighted by the
shares: each fit is a rate of progress, and the collective runs at one while its ranks compute and
at the other while they wait. False: the weighted sum, as before 2026-11-28 (session 31). Offline on
the AMD EPYC VM's nine kept runs (``sim_validation.py --rescore``): W = 2's DDP bucket +21.6 ->
+13.0 % on average, rows 970 -> 984 of 1008 (eight runs gain 1 - 4, among them FI, recorded after
the choice; the one-launch run FH loses 3), steps 24/24 in each; W = 2's backward output dists move
the other way, -3.3 -> -9.9 % (notes/sim_validation.md, "2026-11-28, session 31")."""
KINDS = ("all_to_allv", "all_reduce", "all_gather", "reduce_scatter")
FABRICS = ("shared", "per_rank")
FEW_ELEMENTS_PER_RANK = 2
"""An all-reduce of fewer elements than this per rank of its group is a different pattern
(``few_elements``): gloo's ring splits the buffer into this many segments per rank."""
DEFAULT_SIZES = (16, 256, 4 << 10, 32 << 10, 128 << 10, 512 << 10, 2 << 20)
"""Bytes of one rank's input tensor (param's in_msg_size x dtype): an all-to-all sends them split
evenly over the group, an all-reduce reduces them, an all-gather contributes them, a
reduce-scatter reduces them into g segments."""


class CalibrationError(ValueError):
    """A calibration file that is unreadable, malformed, or for another machine than the trace."""


@dataclass(frozen=True)
class KindFit:
    latency_s: dict[int, float]
    """alpha per group size (seconds)."""
    seconds_per_byte: float
    """beta: seconds per unit of x (bytes on the fabric at one byte per second)."""
    byte_factor: float = 1.0
    rms_rel_err: float = 0.0
    max_rel_err: float = 0.0
    samples: int = 0
    spread_s: dict[int, float] = field(default_factory=dict)
    """Per group size: the mean over the ranks that waited for the collective (in a blocking call,
    or a wait that blocked) of how long after the first of them each returned; alpha is then
    fitted to that first return. Empty: they return together, alpha fitted to their mean return
    (files written before the spread was measured). See the module docstring."""
    concurrent_s: dict[int, float] = field(default_factory=dict)
    """Asynchronous collectives, per group size: the latency added when another collective is in
    flight on its ranks (a busy calibration's second pass: cells launched with a twin on another group;
    fitted beside alpha). Empty: none measured (files written before it was)."""
    after_lag: dict[int, float] = field(default_factory=dict)
    """Blocking calls, per group size: how much the mean return lag (``spread_s``) grows per second
    the ranks compute after the call beyond the calibration's burst (``busy_s``; a busy calibration's
    third pass, ``AFTER_FACTOR``): the ranks that returned first hold the cores the others need to
    return. Empty: none measured (files written before it was)."""
    overlap_slope: dict[int, float] = field(default_factory=dict)
    """Asynchronous collectives, per group size: how much the completion grows per second of
    compute its ranks draw over it (a busy calibration's first pass, within each cell; at least 0).
    Empty: none measured (files written before the iterations were kept)."""
    overlap_mean_s: dict[int, float] = field(default_factory=dict)
    """Beside ``overlap_slope``: the mean compute the first pass drew over it (seconds), which its
    latency is fitted at."""
    few_latency_s: dict[int, float] = field(default_factory=dict)
    """All-reduces, per group size: alpha of the cells of fewer than ``FEW_ELEMENTS_PER_RANK``
    elements per rank (``few_elements``), fitted apart from ``latency_s`` (their mean time less the
    bytes' term); a trace's all-reduce that small takes it. Empty: no such cell (a group of two, whose
    smallest cell has four elements, or a file written before 2026-11-29)."""


# ---- collectives on the calibrated fabric ----------------------------------------------------------

def fabric_comm(kind: str, group: Sequence[int], sizes: Any, fabric: str, *, name: str, after: Sequence[str] = (),
                byte_factor: float = 1.0) -> Comm:
    """The collective of ``kind`` among the global ranks ``group`` on ``fabric`` (hosts: 0 for
    every rank when shared, the rank itself per_rank). ``sizes`` in bytes: all_to_allv a (g, g)
    matrix (group[i] sends sizes[i][j] to group[j]); all_reduce S; all_gather / reduce_scatter the
    g per-rank segments; barrier anything (it moves nothing). Bytes are scaled by ``byte_factor``."""
    g = len(group)
    f = float(byte_factor)
    if kind == "barrier" or g < 2:
        return Comm(name, (), tuple(after), kind, "calibrated", 0.0)
    if fabric == "shared":
        if kind == "all_to_allv":
            M = np.asarray(sizes, dtype=np.float64)
            x = float(M.sum() - np.trace(M))
        elif kind == "all_reduce":
            x = 2.0 * (g - 1) * float(sizes)
        elif kind in ("all_gather", "reduce_scatter"):
            x = (g - 1) * float(np.sum(sizes))
        else:
            raise ValueError(f"fabric_comm: unknown collective kind {kind!r} (known: {KINDS})")
        payload = float(np.sum(sizes)) if kind != "all_reduce" else float(sizes)
        rounds = (Transfer([0], [0], [x * f]),) if x > 0 else ()
        return Comm(name, rounds, tuple(after), _report_kind(kind), "calibrated", payload)
    if fabric != "per_rank":
        raise ValueError(f"fabric_comm: unknown fabric {fabric!r} (known: {FABRICS})")
    hosts = list(group)
    if kind == "all_to_allv":
        M = np.asarray(sizes, dtype=np.float64) * f
        np.fill_diagonal(M, 0.0)
        i, j = np.nonzero(M)
        h = np.asarray(hosts)
        return Comm(name, (Transfer(h[i], h[j], M[i, j]),), tuple(after), "all_to_all", "calibrated",
                    float(np.sum(sizes)))
    if kind == "all_reduce":
        c = _ring_all_reduce("ring", hosts, float(sizes) * f, name=name, after=after)
        return Comm(name, c.rounds, tuple(after), "all_reduce", "calibrated", float(sizes))
    if kind in ("all_gather", "reduce_scatter"):
        c = ring_all_gather(hosts, float(np.sum(sizes)) * f, name=name, after=after, collective=kind)
        return Comm(name, c.rounds, tuple(after), kind, "calibrated", float(np.sum(sizes)))
    raise ValueError(f"fabric_comm: unknown collective kind {kind!r} (known: {KINDS})")


def _report_kind(kind: str) -> str:
    return "all_to_all" if kind == "all_to_allv" else kind


def _even_sizes(kind: str, g: int, nbytes: float) -> Any:
    """``fabric_comm`` sizes of a calibration sample: one rank's input of ``nbytes``."""
    if kind == "all_to_allv":
        return np.full((g, g), nbytes / g)
    if kind == "all_reduce":
        return float(nbytes)
    if kind == "all_gather":
        return [float(nbytes)] * g
    return [nbytes / g] * g  # reduce_scatter: g segments of the rank's input


def _unit_time(kind: str, g: int, nbytes: float, fabric: str) -> float:
    """x: the sample's bytes on ``fabric`` at one byte per second (simulated, no latency)."""
    comm = fabric_comm(kind, list(range(g)), _even_sizes(kind, g, nbytes), fabric, name="x")
    if not comm.rounds:
        return 0.0
    return simulate([comm], _unit_network(fabric, g)).total


def _unit_network(fabric: str, world: int, bandwidth: float = 1.0) -> FlatNetwork:
    if fabric == "shared":
        return FlatNetwork(1, host_bandwidth=bandwidth, hop_latency=0.0, devices_per_host=world,
                           intra_bandwidth=bandwidth / world)
    return FlatNetwork(world, host_bandwidth=bandwidth, hop_latency=0.0, devices_per_host=1,
                       intra_bandwidth=bandwidth)


# ---- fitting ----------------------------------------------------------------------------------------

def nnls(A: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """min ||A x - b|| subject to x >= 0 (Lawson-Hanson active set; small dense problems)."""
    A, b = np.asarray(A, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(iters):
        w = A.T @ (b - A @ x)
        cand = ~passive & (w > 1e-12 * max(1.0, float(np.abs(w).max(initial=0.0))))
        if not cand.any():
            break
        passive[int(np.argmax(np.where(cand, w, -np.inf)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            step = np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300))
            x = x + step * (z - x)
            passive &= x > 1e-15
    return x


IRLS_ITERS = 20
BLOCKED_NS = 20_000
"""A wait that returned later than this after it began blocked for its collective (one that found
it done returns in a few microseconds)."""


def few_elements(kind: str, group_size: int, elements: float) -> bool:
    """True for an all-reduce of fewer than ``FEW_ELEMENTS_PER_RANK`` elements per rank of its
    group (and at least one): gloo's ring cuts the buffer into two segments per rank and skips the
    sends of the empty ones (its ``ring``: a segment out of range has no length), a shorter pattern
    than any larger all-reduce's. ``elements`` unknown (0): False."""
    return kind == "all_reduce" and group_size >= 2 and 0 < elements < FEW_ELEMENTS_PER_RANK * group_size


def _split_few(kind: str, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the cells the kind's fit takes, those of few elements, fitted apart: ``few_elements`` of a
    calibration cell's float32 elements). A group whose every cell is that small keeps them all in the
    fit: it has nothing else to give its latency."""
    small = [few_elements(kind, int(r["group"]), _cell_elements(int(r["group"]), int(r["bytes"]))) for r in rows]
    main = [r for r, x in zip(rows, small) if not x]
    few = [r for r, x in zip(rows, small) if x]
    if {int(r["group"]) for r in few} - {int(r["group"]) for r in main}:
        return rows, []
    return main, few


def _few_latency(fit: KindFit, few: list[dict], xs: list[float]) -> dict[int, float]:
    """``KindFit.few_latency_s``: per group size, the mean over the few-element cells of the time
    the fit is to (the first return where the fit keeps a spread, else the mean) less the fit's
    bytes' term, at least 0."""
    by_group: dict[int, list[float]] = {}
    for r, x in zip(few, xs):
        t = float(r["first_s"] if fit.spread_s else r["seconds"])
        by_group.setdefault(int(r["group"]), []).append(max(0.0, t - fit.seconds_per_byte * x))
    return {g: float(np.mean(v)) for g, v in sorted(by_group.items())}


def _cell_units(kind: str, rows: list[dict], fabric: str) -> list[float]:
    """Each cell's bytes on the fabric as the fit's regressor (``_unit_time`` of its group and bytes)."""
    return [_unit_time(kind, int(r["group"]), float(r["bytes"]), fabric) for r in rows]


def _fit_split(kind: str, rows: list[dict], fabric: str) -> tuple[KindFit, list[dict], list[float]]:
    """``_fit_kind`` over the kind's cells but those of few elements, whose latency is fitted apart
    (``_split_few``, ``_few_latency``): (the fit, the cells it took, their bytes on the fabric)."""
    main, few = _split_few(kind, rows)
    xs = _cell_units(kind, main, fabric)
    fit = _fit_kind(main, xs)
    if few:
        fit = dataclasses.replace(fit, few_latency_s=_few_latency(
            fit, few, _cell_units(kind, few, fabric)))
    return fit, main, xs


def _fit_kind(rows: list[dict], xs: list[float]) -> KindFit:
    """alpha per group size and seconds per byte-unit, non-negative, relative to the prediction:
    least squares of (t - p) / p, reweighted until the weights settle (a quasi-likelihood with
    the variance growing as p^2: for one alpha it is the cells' mean). Weighting by the measured
    t instead, (t - p) / t, would be biased low: a slow cell's error counts less than a fast one's
    (for cells of 1 and 3 ms it gives 1.2 ms, not 2), and the calibration's cells are means of a
    few iterations with a long tail, so that bias under-predicted every collective. Cells that
    carry ``first_s`` and ``spread_s`` are fitted to the first waiting rank's return, the mean
    spread kept per group size (``KindFit.spread_s``). The reported errors are relative to the
    larger of measured and predicted."""
    groups = sorted({int(r["group"]) for r in rows})
    col = {g: i for i, g in enumerate(groups)}
    # cells launched with a twin in flight: their own latency column, what the company adds
    pairs = sorted({int(r["group"]) for r in rows if r.get("concurrent")})
    pcol = {g: len(groups) + i for i, g in enumerate(pairs)}
    # the ranks waiting for a collective return apart: fit when the first returned, keep the others' lag
    spread = all("first_s" in r and "spread_s" in r for r in rows)
    t = np.array([max(float(r["first_s"] if spread else r["seconds"]), 1e-7) for r in rows])
    A = np.zeros((len(rows), len(groups) + len(pairs) + 1))
    for i, r in enumerate(rows):
        A[i, col[int(r["group"])]] = 1.0
        if r.get("concurrent"):
            A[i, pcol[int(r["group"])]] = 1.0
        A[i, -1] = xs[i]
    # the start: absolute errors. Relative to the measured times instead, a cell measured near 0 (an
    # asynchronous collective done before its ranks waited) outweighed every other, pinned its group's
    # alpha to 0 and the bandwidth to what fits the rest from there; and relative to the prediction
    # an over-prediction costs at most 1 per cell, so the reweighting stayed in that corner (a W = 4
    # all-to-all fitted 437 x slower per byte than its blocking twin, a step predicted 6 x too long)
    coef = nnls(A, t)
    floor = 1e-3 * float(np.median(t))
    for _ in range(IRLS_ITERS):
        p = np.maximum(A @ coef, floor)
        new = nnls(A / p[:, None], t / p)
        done = np.allclose(new, coef, rtol=1e-6, atol=1e-12)
        coef = new
        if done:
            break
    p = A @ coef
    rel = (p - t) / np.maximum(t, p)  # relative to the larger: an asynchronous cell's D may be 0
    lags = {}
    if spread:
        lags = {g: float(np.mean([float(r["spread_s"]) for r in rows if int(r["group"]) == g])) for g in groups}
    return KindFit({g: float(coef[col[g]]) for g in groups}, float(coef[-1]), 1.0,
                   float(np.sqrt(np.mean(rel ** 2))), float(np.abs(rel).max()), len(rows), lags,
                   {g: float(coef[pcol[g]]) for g in pairs})


def fit_calibration(samples: Sequence[Mapping[str, Any]], *, world_size: int, transport: str, device: str,
                    fabrics: Sequence[str] = FABRICS, meta: Mapping[str, Any] | None = None) -> "Calibration":
    """Fit alpha per (kind, group size) and beta per kind on each fabric; keep the fabric with the
    smaller RMS relative error. ``samples``: dicts with kind, group, bytes, seconds (more keys are
    kept in the file); those with ``async`` true (a busy calibration's asynchronous collectives)
    are fitted apart on the kept fabric (``Calibration.async_kinds``). A ValueError when nothing
    depends on size (no bandwidth to fit)."""
    if not samples:
        raise ValueError("fit_calibration: no samples")
    for i, s in enumerate(samples):
        if s.get("kind") not in KINDS:
            raise ValueError(f"fit_calibration: sample {i} has kind {s.get('kind')!r} (known: {KINDS})")
        if not (int(s.get("group", 0)) >= 2 and float(s.get("seconds", 0)) > 0 and float(s.get("bytes", -1)) >= 0):
            raise ValueError(f"fit_calibration: sample {i} needs group >= 2, bytes >= 0 and seconds > 0, got {dict(s)}")
    sync = [s for s in samples if not s.get("async") and not s.get("pass")]
    if not sync:
        raise ValueError("fit_calibration: no samples of blocking calls (only asynchronous ones)")
    best: tuple[float, str, dict[str, KindFit], float] | None = None
    errs: dict[str, float] = {}
    for fab in fabrics:
        fits: dict[str, KindFit] = {}
        sq, n, share = 0.0, 0, 0.0
        for kind in KINDS:
            rows = [s for s in sync if s["kind"] == kind]
            if not rows:
                continue
            f, rows, xs = _fit_split(kind, rows, fab)  # the errors and the bytes' share: of the cells fitted together
            fits[kind] = f
            sq += f.rms_rel_err ** 2 * len(rows)
            n += len(rows)
            # how much of a sample's time the bandwidth term explains, at most
            share = max([share] + [f.seconds_per_byte * x / float(r["seconds"]) for x, r in zip(xs, rows)])
        errs[fab] = math.sqrt(sq / n)
        if best is None or errs[fab] < best[0]:
            best = (errs[fab], fab, fits, share)
    assert best is not None
    _, fabric, fits, share = best
    ref = fits.get("all_to_allv")
    beta_ref = ref.seconds_per_byte if ref is not None and ref.seconds_per_byte > 0 else max(
        f.seconds_per_byte for f in fits.values())
    if beta_ref <= 0 or share < 1e-3:
        raise ValueError("fit_calibration: no collective's time grows with its size in these samples (give larger "
                         "message sizes): there is no bandwidth to fit")
    kinds = {k: dataclasses.replace(_relative(f, beta_ref), after_lag=_after_lag(samples, k)) for k, f in fits.items()}
    async_kinds = {}
    for kind in KINDS:
        rows = [s for s in samples if s.get("async") and s["kind"] == kind and not s.get("pass")]
        if rows:
            fit, main, _ = _fit_split(kind, rows, fabric)
            # the second pass (alone, then with a twin in flight): what the company adds, to the first's fit
            second = _split_few(kind, [s for s in samples if s.get("async") and s["kind"] == kind
                                       and s.get("pass") == "concurrent"])[0]
            if any(r.get("concurrent") for r in second):
                fit = dataclasses.replace(fit, concurrent_s=_fit_kind(second, _cell_units(kind, second, fabric)).concurrent_s)
            slope, mean = _overlap_slope(main)
            async_kinds[kind] = dataclasses.replace(_relative(fit, beta_ref), overlap_slope=slope, overlap_mean_s=mean)
    return Calibration(transport, device, int(world_size), fabric, 1.0 / beta_ref, kinds, errs,
                       [dict(s) for s in samples], dict(meta or {}), async_kinds=async_kinds)


def _relative(f: KindFit, beta_ref: float) -> KindFit:
    """``f`` with its byte factor: its beta relative to the all-to-all's (the fabric's 1 / C)."""
    return dataclasses.replace(f, byte_factor=f.seconds_per_byte / beta_ref)


def _after_lag(samples: Sequence[Mapping[str, Any]], kind: str) -> dict[int, float]:
    """``KindFit.after_lag`` of ``kind`` from the third pass's samples: per group size, the growth of
    the mean spread (over its cells) between the two compute lengths after the call, per second of
    the difference; at least 0."""
    rows = [s for s in samples if s.get("pass") == "after" and s["kind"] == kind and "spread_s" in s]
    out = {}
    for g in sorted({int(r["group"]) for r in rows}):
        by_after: dict[float, list[float]] = {}
        for r in rows:
            if int(r["group"]) == g:
                by_after.setdefault(float(r["after_s"]), []).append(float(r["spread_s"]))
        if len(by_after) == 2:
            (a0, s0), (a1, s1) = sorted((a, float(np.mean(v))) for a, v in by_after.items())
            if a1 > a0:
                out[g] = max(0.0, (s1 - s0) / (a1 - a0))
    return out


def _overlap_slope(rows: Sequence[Mapping[str, Any]]) -> tuple[dict[int, float], dict[int, float]]:
    """``KindFit.overlap_slope`` and ``overlap_mean_s`` from a kind's first-pass asynchronous
    samples that kept their iterations: per group size, the least-squares slope of the completion
    on the compute drawn over it, each cell's means taken off (on the draw itself: the draw cut at
    the completion has a slope of 1 wherever it outlasts it), at least 0; and the mean draw."""
    xs: dict[int, list[np.ndarray]] = {}
    ys: dict[int, list[np.ndarray]] = {}
    for r in rows:
        ov, done = r.get("iters_overlap_s"), r.get("iters_done_s")
        if not ov or not done or len(ov) != len(done):
            continue
        g = int(r["group"])
        xs.setdefault(g, []).append(np.asarray(ov, dtype=np.float64))
        ys.setdefault(g, []).append(np.asarray(done, dtype=np.float64))
    slope, mean = {}, {}
    for g in sorted(xs):
        x = np.concatenate([v - v.mean() for v in xs[g]])
        y = np.concatenate([v - v.mean() for v in ys[g]])
        sxx = float((x * x).sum())
        if sxx > 0:
            slope[g] = max(0.0, float((x * y).sum()) / sxx)
            mean[g] = float(np.mean([v.mean() for v in xs[g]]))
    return slope, mean


# ---- the calibration --------------------------------------------------------------------------------

@dataclass
class Calibration:
    transport: str
    """The process groups' backend: gloo, nccl, ..."""
    device: str
    """cpu or cuda."""
    world_size: int
    fabric: str
    bandwidth: float
    """C, bytes per second of the fabric's link(s)."""
    kinds: dict[str, KindFit]
    fabric_rms_rel_err: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    async_kinds: dict[str, KindFit] = field(default_factory=dict)
    """Collectives launched asynchronously while the ranks compute (a busy calibration's); a kind
    without one uses its blocking fit."""

    def network(self) -> FlatNetwork:
        """The fabric as a flat network (no hop latency: alpha carries the fixed costs)."""
        return _unit_network(self.fabric, self.world_size, self.bandwidth)

    def host_of(self, rank: int) -> int:
        return 0 if self.fabric == "shared" else int(rank)

    @property
    def devices_per_host(self) -> int:
        return self.world_size if self.fabric == "shared" else 1

    @property
    def core_per_rank(self) -> bool:
        """Whether the calibrated host had a CPU core for each rank (``meta['cpus']``, the
        calibrating host's, against the world size): there a rank blocked in one collective frees
        its core for the transports of the others it has in flight (``trace_sim.idle_shares``).
        False where the file does not say, and on a GPU, whose transport is not the host's cores."""
        cpus = self._host_cpus
        return cpus is not None and cpus >= self.world_size

    @property
    def cores_short(self) -> bool:
        """Whether the calibrated host had fewer CPU cores than ranks (``meta['cpus']`` against the
        world size; CPU only, False where the file does not say): there an asynchronous collective
        runs at its blocking speed only while all its ranks wait for it (``trace_sim.IDLE_TOGETHER``)."""
        cpus = self._host_cpus
        return cpus is not None and cpus < self.world_size

    @property
    def _host_cpus(self) -> int | None:
        """The calibrating host's CPU count where its ranks' transport ran on them (CPU calibrations
        whose meta says; None otherwise)."""
        cpus = self.meta.get("cpus")
        return cpus if self.device == "cpu" and isinstance(cpus, int) else None

    def _where(self) -> str:
        return f"calibration {self.source}" if self.source else "calibration"

    def fit_for(self, kind: str, async_op: bool = False) -> KindFit:
        """The fit of ``kind`` (a barrier uses the all-reduce's latency); ``async_op``: its fit as an
        asynchronous collective overlapped with compute, where the calibration has one."""
        k = "all_reduce" if kind == "barrier" else kind
        if async_op and k in self.async_kinds:
            return self.async_kinds[k]
        if k not in self.kinds:
            raise CalibrationError(f"{self._where()} has no fit for {k} (it has {', '.join(sorted(self.kinds))}); "
                                   f"calibrate with that collective")
        return self.kinds[k]

    def _mix(self, kind: str, async_op: bool, idle: float) -> list[tuple[float, KindFit]]:
        """(weight, fit) pairs whose weighted sum is ``kind``'s figure: its fit (``fit_for``); an
        asynchronous collective whose ranks wait idle for it for the share ``idle`` of its time
        (0..1, ``trace_sim.idle_shares``) mixes in the blocking fit by that share. The asynchronous
        fit was measured with every rank computing while the collective progressed, the blocking
        one with every rank waiting in it, when a rank's core serves the transport
        (notes/sim_validation.md, "2026-11-24, idle ranks")."""
        if not 0.0 <= idle <= 1.0:
            raise ValueError(f"{self._where()}: idle share {idle} of a {kind} is not within 0..1")
        fit = self.fit_for(kind, async_op)
        k = "all_reduce" if kind == "barrier" else kind
        if async_op and idle > 0 and k in self.async_kinds and k in self.kinds:
            return [(1.0 - idle, fit), (idle, self.kinds[k])]
        return [(1.0, fit)]

    def latency(self, kind: str, group_size: int, async_op: bool = False, concurrent: bool = False,
                idle: float = 0.0, launch_s: float = 0.0, over_s: float = 0.0, few: bool = False) -> float:
        """alpha: the fixed seconds of a collective of ``kind`` among ``group_size`` ranks (0 for one);
        ``async_op``: launched asynchronously (``fit_for``); ``concurrent``: with other collectives
        in flight on its ranks (adds ``KindFit.concurrent_s`` where the fit has it, once: the
        calibration measures one companion; charging it per companion over-predicted W = 3, 4 mixed
        plans by 13 - 21 %, notes/sim_validation.md, "2026-11-24, night"); ``idle``: the share of an
        asynchronous collective's time its ranks wait idle for it (``_mix``), ``launch_s`` its
        launch's seconds up to where it was handed to the transport (the whole launch where that
        is not recorded): the blocking fit's time runs from the last rank's call, an asynchronous
        collective's from there, so the blocking share is charged that much less. ``over_s``: the
        compute its ranks do over it (the mean over them, launch to join): beyond the calibration's
        mean draw, the asynchronous fit's share is charged ``KindFit.overlap_slope`` per second.

        The two fits are rates, and rates add over time: a collective that progresses at 1 / A
        while its ranks compute and at 1 / B while they wait (A, B the two fits' seconds, B less the
        launch) for the shares 1 - idle and idle of its time T is done when T (1 - idle) / A +
        T idle / B = 1, so T is their harmonic mean weighted by the shares (``RATE_MIX``; where B is
        not positive, the weighted sum). ``few``: an all-reduce of few elements (``few_elements``),
        whose alpha is ``KindFit.few_latency_s`` where the fit has it."""
        if group_size < 2:
            return 0.0
        mix = self._mix(kind, async_op, idle)
        seconds = []
        for _, fit in mix:
            if group_size not in fit.latency_s:
                raise CalibrationError(f"{self._where()}: {kind} was calibrated for groups of "
                                       f"{', '.join(map(str, sorted(fit.latency_s)))} ranks, not {group_size}")
            company = fit.concurrent_s.get(group_size, 0.0) if concurrent else 0.0
            over = max(0.0, over_s - fit.overlap_mean_s.get(group_size, 0.0))  # the blocking fit has no slope: 0
            alpha = fit.few_latency_s.get(group_size, fit.latency_s[group_size]) if few else fit.latency_s[group_size]
            seconds.append(alpha + company + fit.overlap_slope.get(group_size, 0.0) * over)
        if len(mix) == 1:
            return seconds[0]
        (w_async, _), (w_idle, _) = mix  # the blocking fit mixed in
        busy, waiting = seconds[0], seconds[1] - launch_s
        if RATE_MIX and busy > 0 and waiting > 0:
            return 1.0 / (w_async / busy + w_idle / waiting)
        return max(0.0, w_async * busy + w_idle * waiting)

    @property
    def busy_s(self) -> float:
        """The compute burst of a busy calibration (its samples' ``busy_s``; 0: idle, or none kept)."""
        return max((float(s.get("busy_s") or 0.0) for s in self.samples), default=0.0)

    def lag_after(self, kind: str, group_size: int, after_s: float) -> float:
        """Seconds added to the mean return lag of a collective whose ranks compute ``after_s``
        after it (the mean over its ranks): ``KindFit.after_lag`` of the blocking fit times what
        exceeds the calibration's own burst (``busy_s``); 0 without the measurement."""
        k = "all_reduce" if kind == "barrier" else kind
        fit = self.kinds.get(k)
        if fit is None or group_size < 2:
            return 0.0
        return fit.after_lag.get(group_size, 0.0) * max(0.0, after_s - self.busy_s)

    def company(self, kind: str, group_size: int) -> float:
        """Seconds a blocking call is charged for an asynchronous collective of ``kind`` among
        ``group_size`` ranks live beside it (``trace_input.live_company``): what a companion adds to
        that collective, its asynchronous fit's ``KindFit.concurrent_s`` (the twin the second pass
        launches is another group's, not a world collective's, so the blocking call's own kind's
        figure measures nothing of it: about 0 at W = 4, notes/sim_validation.md, "2026-11-24,
        session 23"). 0 where not measured: an idle calibration, or a file written before."""
        fit = self.async_kinds.get("all_reduce" if kind == "barrier" else kind)
        return fit.concurrent_s.get(group_size, 0.0) if fit is not None else 0.0

    def spread(self, kind: str, group_size: int, async_op: bool = False, idle: float = 0.0) -> float:
        """``KindFit.spread_s``: the mean lag of the ranks waiting for a collective behind the first
        of them to return (0: they return together, as in calibrations before the spread was
        measured, and for a barrier); ``idle`` as in ``latency``."""
        if group_size < 2 or kind == "barrier":
            return 0.0
        return sum(w * fit.spread_s.get(group_size, 0.0) for w, fit in self._mix(kind, async_op, idle))

    def comm(self, kind: str, group: Sequence[int], sizes: Any, *, name: str, after: Sequence[str] = (),
             async_op: bool = False, idle: float = 0.0) -> Comm:
        """The collective's bytes on the fabric (``fabric_comm``, scaled by the kind's byte factor;
        ``idle`` as in ``latency``)."""
        factor = 0.0 if kind == "barrier" else sum(w * fit.byte_factor for w, fit in self._mix(kind, async_op, idle))
        hosts = [self.host_of(r) for r in group] if self.fabric == "per_rank" else list(group)
        return fabric_comm(kind, hosts, sizes, self.fabric, name=name, after=after, byte_factor=factor)

    def predict(self, kind: str, group_size: int, nbytes: float, async_op: bool = False,
                elements: float | None = None) -> float:
        """Seconds the model gives one collective alone: alpha + its bytes' simulated time.
        ``elements``: its element count (``few_elements``); by default a calibration cell's of
        ``nbytes`` (float32)."""
        fit = self.fit_for(kind, async_op)
        n = _cell_elements(group_size, int(nbytes)) if elements is None else elements
        return (self.latency(kind, group_size, async_op, few=few_elements(kind, group_size, n))
                + fit.seconds_per_byte * _unit_time(kind, group_size, nbytes, self.fabric))

    def check_for(self, world_size: int, transports: Sequence[str], what: str = "the trace") -> None:
        """CalibrationError unless this calibration describes ``what``'s machine: its world size
        and (when ``what`` records it) transport."""
        if world_size != self.world_size:
            raise CalibrationError(f"{self._where()} is for {self.world_size} ranks but {what} has {world_size} "
                                   f"(calibrate with --nproc {world_size})")
        other = sorted({t for t in transports if t and t != self.transport})
        if other:
            raise CalibrationError(f"{self._where()} measured transport {self.transport!r} but {what} ran on "
                                   f"{', '.join(map(repr, other))}")

    # ---- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "transport": self.transport, "device": self.device, "world_size": self.world_size,
            "fabric": self.fabric, "bandwidth_Bps": self.bandwidth,
            "kinds": _fits_dict(self.kinds), "async_kinds": _fits_dict(self.async_kinds),
            "fabric_rms_rel_err": self.fabric_rms_rel_err, "meta": self.meta, "samples": self.samples,
        }

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1))
        return p

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        """Read and check a calibration file; CalibrationError naming the file and field."""
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise CalibrationError(f"calibration {p}: no such file (make one with neo-train calibrate --nproc W "
                                   f"--out {p})") from None
        except IsADirectoryError:
            raise CalibrationError(f"calibration {p} is a directory, not a calibration file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CalibrationError(f"calibration {p}: not valid JSON ({e})") from None
        return cls.from_dict(data, str(p))

    @classmethod
    def from_dict(cls, data: Any, source: str = "") -> "Calibration":
        where = f"calibration {source}" if source else "calibration"
        if not isinstance(data, dict):
            raise CalibrationError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise CalibrationError(f"{where}: field 'format' is {data.get('format')!r}, expected {FORMAT!r} "
                                   f"(not a calibration file, or another version)")

        def num(v: Any, key: str, positive: bool = False) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (
                    positive and v <= 0):
                raise CalibrationError(f"{where}: field '{key}' must be a finite number "
                                       f"{'> 0' if positive else '>= 0'}, got {v!r}")
            return float(v)

        for key in ("transport", "device", "fabric"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise CalibrationError(f"{where}: field '{key}' must be a non-empty string, got {data.get(key)!r}")
        if data["fabric"] not in FABRICS:
            raise CalibrationError(f"{where}: field 'fabric' is {data['fabric']!r}, expected one of {FABRICS}")
        W = data.get("world_size")
        if isinstance(W, bool) or not isinstance(W, int) or W < 2:
            raise CalibrationError(f"{where}: field 'world_size' must be an integer >= 2, got {W!r}")
        bw = num(data.get("bandwidth_Bps"), "bandwidth_Bps", positive=True)
        kinds_raw = data.get("kinds")
        if not isinstance(kinds_raw, dict) or not kinds_raw:
            raise CalibrationError(f"{where}: field 'kinds' must be an object of per-collective fits")
        async_raw = data.get("async_kinds") or {}  # absent in files written before asynchronous fits
        if not isinstance(async_raw, dict):
            raise CalibrationError(f"{where}: field 'async_kinds' must be an object of per-collective fits")

        def fits(raw: dict, key: str) -> dict[str, KindFit]:
            out: dict[str, KindFit] = {}
            for k, f in raw.items():
                if k not in KINDS:
                    raise CalibrationError(f"{where}: field '{key}' names {k!r}, not a collective ({', '.join(KINDS)})")
                if not isinstance(f, dict) or not isinstance(f.get("latency_s"), dict) or not f["latency_s"]:
                    raise CalibrationError(f"{where}: field '{key}.{k}.latency_s' must be an object "
                                           f"{{group size: seconds}}")
                lat = {}
                for g, a in f["latency_s"].items():
                    if not str(g).isdecimal() or int(g) < 2:
                        raise CalibrationError(f"{where}: field '{key}.{k}.latency_s' has group size {g!r} (need >= 2)")
                    lat[int(g)] = num(a, f"{key}.{k}.latency_s.{g}")
                lag = f.get("spread_s") or {}  # absent in files written before the spread was measured
                if not isinstance(lag, dict) or any(not str(g).isdecimal() or int(g) < 2 for g in lag):
                    raise CalibrationError(f"{where}: field '{key}.{k}.spread_s' must be an object "
                                           f"{{group size >= 2: seconds}}, got {lag!r}")
                company = f.get("concurrent_s") or {}  # absent in files written before it was measured
                after = f.get("after_lag") or {}  # likewise
                slope, over = f.get("overlap_slope") or {}, f.get("overlap_mean_s") or {}  # likewise
                few = f.get("few_latency_s") or {}  # likewise
                for name, v in (("concurrent_s", company), ("after_lag", after), ("overlap_slope", slope),
                                ("overlap_mean_s", over), ("few_latency_s", few)):
                    if not isinstance(v, dict) or any(not str(g).isdecimal() or int(g) < 2 for g in v):
                        raise CalibrationError(f"{where}: field '{key}.{k}.{name}' must be an object "
                                               f"{{group size >= 2: {'seconds' if name.endswith('_s') else 'ratio'}}}, "
                                               f"got {v!r}")
                if set(slope) != set(over):
                    raise CalibrationError(f"{where}: fields '{key}.{k}.overlap_slope' and '{key}.{k}.overlap_mean_s' "
                                           f"name different group sizes ({sorted(slope)} vs {sorted(over)})")
                out[k] = KindFit(lat, num(f.get("seconds_per_byte"), f"{key}.{k}.seconds_per_byte"),
                                 num(f.get("byte_factor"), f"{key}.{k}.byte_factor"),
                                 float(f.get("rms_rel_err") or 0.0), float(f.get("max_rel_err") or 0.0),
                                 int(f.get("samples") or 0),
                                 {int(g): num(v, f"{key}.{k}.spread_s.{g}") for g, v in lag.items()},
                                 {int(g): num(v, f"{key}.{k}.concurrent_s.{g}") for g, v in company.items()},
                                 {int(g): num(v, f"{key}.{k}.after_lag.{g}") for g, v in after.items()},
                                 {int(g): num(v, f"{key}.{k}.overlap_slope.{g}") for g, v in slope.items()},
                                 {int(g): num(v, f"{key}.{k}.overlap_mean_s.{g}") for g, v in over.items()},
                                 {int(g): num(v, f"{key}.{k}.few_latency_s.{g}") for g, v in few.items()})
            return out

        return cls(data["transport"], data["device"], W, data["fabric"], bw, fits(kinds_raw, "kinds"),
                   dict(data.get("fabric_rms_rel_err") or {}), list(data.get("samples") or []),
                   dict(data.get("meta") or {}), source, fits(async_raw, "async_kinds"))

    def table(self) -> str:
        """The fit, one line per kind: latency per group size, bandwidth, errors."""
        lines = [f"calibration: {self.transport} on {self.device}, {self.world_size} ranks, fabric {self.fabric} "
                 f"({', '.join(f'{k} rms {v:.1%}' for k, v in self.fabric_rms_rel_err.items())}), "
                 f"C = {self.bandwidth / 1e9:.3f} GB/s"]
        for mode, fits in (("", self.kinds), (" async", self.async_kinds)):
            for k, f in fits.items():
                lat = ", ".join(f"g={g}: {a * 1e6:.0f} us" for g, a in sorted(f.latency_s.items()))
                lag = (f"; ranks return {', '.join(f'{v * 1e6:.0f}' for _, v in sorted(f.spread_s.items()))} us after "
                       f"the first" if f.spread_s else "")
                lag += (f"; with another in flight +{', '.join(f'{v * 1e6:.0f}' for _, v in sorted(f.concurrent_s.items()))} "
                        f"us" if f.concurrent_s else "")
                lag += (f"; lag +{', '.join(f'{v * 1e3:.0f}' for _, v in sorted(f.after_lag.items()))} us per ms "
                        f"computed after it" if f.after_lag else "")
                lag += (f"; +{', '.join(f'{v * 1e3:.0f}' for _, v in sorted(f.overlap_slope.items()))} us per ms computed "
                        f"over it beyond {', '.join(f'{v * 1e3:.1f}' for _, v in sorted(f.overlap_mean_s.items()))} ms"
                        if f.overlap_slope else "")
                lag += (f"; under {FEW_ELEMENTS_PER_RANK} elements per rank "
                        f"{', '.join(f'g={g}: {a * 1e6:.0f} us' for g, a in sorted(f.few_latency_s.items()))}"
                        if f.few_latency_s else "")
                lines.append(f"  {k + mode:<21} latency {lat}; byte factor {f.byte_factor:.2f}; rel err rms "
                             f"{f.rms_rel_err:.1%}, max {f.max_rel_err:.1%} over {f.samples} samples{lag}")
        return "\n".join(lines)


def _fits_dict(fits: Mapping[str, KindFit]) -> dict[str, Any]:
    """Per-kind fits as the file stores them."""
    return {k: {"latency_s": {str(g): a for g, a in sorted(f.latency_s.items())},
                "seconds_per_byte": f.seconds_per_byte, "byte_factor": f.byte_factor, "rms_rel_err": f.rms_rel_err,
                "max_rel_err": f.max_rel_err, "samples": f.samples}
            | ({"spread_s": {str(g): v for g, v in sorted(f.spread_s.items())}} if f.spread_s else {})
            | ({"concurrent_s": {str(g): v for g, v in sorted(f.concurrent_s.items())}} if f.concurrent_s else {})
            | ({"after_lag": {str(g): v for g, v in sorted(f.after_lag.items())}} if f.after_lag else {})
            | ({"overlap_slope": {str(g): v for g, v in sorted(f.overlap_slope.items())},
                "overlap_mean_s": {str(g): v for g, v in sorted(f.overlap_mean_s.items())}} if f.overlap_slope else {})
            | ({"few_latency_s": {str(g): v for g, v in sorted(f.few_latency_s.items())}} if f.few_latency_s else {})
            for k, f in fits.items()}


# ---- measuring (on every rank of a job) ------------------------------------------------------------

def measure_collectives(comm: Any, *, sizes: Sequence[int] = DEFAULT_SIZES, kinds: Sequence[str] = KINDS,
                        groups: Sequence[int] | None = None, iters: int = 7, warmup: int = 2,
                        busy_s: float = 0.0, overlap_s: float | Mapping[str, float] | None = None,
                        seed: int = 0, tiled: bool | None = None, concurrent: bool | None = None
                        ) -> list[dict[str, Any]]:
    """Time every kind x group size x message size on ``comm`` (a ``neo_train.comm``
    Communicator; every rank calls this). Returns the same samples on every rank: dicts of kind,
    group, bytes, seconds (the mean over iterations of ``_call_seconds``), p25 / p50 / p75 of the
    iterations, iters, busy_s, and ``async`` for the asynchronous ones (those of the first pass whose
    handle has the backend's future also keep each iteration's compute over the collective and its
    completion, ``_completions``). See the module docstring.

    ``busy_s`` > 0: instead of a barrier, before each call every rank computes for ``busy_s`` x
    U(0.5, 1.5) seconds (one thread, a kernel that releases the GIL), so the ranks arrive skewed
    and, as in training, stay CPU-bound between collectives: on a host with fewer free cores than
    busy processes a woken rank then waits for a core, which is what communication costs there.
    Each cell is then also launched asynchronously, the ranks computing for ``overlap_s`` x
    U(0, 2) before they wait (``async`` samples, seconds from ``_async_seconds``): the mean compute
    a run does while its asynchronous collectives are in flight (default ``busy_s`` / 2), or per
    kind (a mapping, ``trace_input.trace_duties``: DDP's buckets overlap a backward, the ids a
    forward; kinds it lacks take the mean of its values). Every rank launches it after a barrier
    and draws the same overlap (the module docstring says why). Times are on the wall clock (one
    host, or synchronised clocks).

    ``tiled`` (default: when busy): a group size g < W is measured as the world cut into W // g
    disjoint groups running every cell at once (the samples pool their ranks' iterations), as a
    plan's node-local and cross-node groups run in training; otherwise ranks 0..g-1 alone, the
    others idle (the transport alone). On a host with fewer cores than ranks the groups' collectives
    compete for the cores: training's g = 2 ranks returned 0.9 - 1.2 ms apart at W = 4, ranks 0, 1
    alone 0.7, tiled 0.9 (notes/sim_validation.md, "launches, calibration noise, tiled groups").

    ``concurrent`` (default: when busy): a second pass over the cells up to
    ``CONCURRENT_MAX_BYTES``, each launched asynchronously alone and then with its twin on another
    group of the same ranks right behind it (samples with ``pass`` "concurrent" and ``concurrent``
    false / true; ``fit_calibration`` turns their difference into ``KindFit.concurrent_s``); and a
    third over the smallest and largest of them, called blocking with ``busy_s`` and then
    ``AFTER_FACTOR`` x ``busy_s`` of compute after the call (samples with ``pass`` "after" and
    ``after_s``; ``KindFit.after_lag``).

    Every sample carries ``compute_share``: the share of the first pass's counted iterations the
    ranks spent computing (0 when idle), to set beside the runs' (``trace_input.trace_compute_share``)."""
    import random

    import torch

    W, rank = comm.world_size, comm.rank
    device = getattr(comm, "device", "cpu")
    groups = sorted(set(groups or range(2, W + 1)))
    if any(g < 2 or g > W for g in groups):
        raise ValueError(f"measure_collectives: group sizes must lie in 2..{W}, got {groups}")
    if not (math.isfinite(busy_s) and busy_s >= 0):
        raise ValueError(f"measure_collectives: busy_s must be a finite number >= 0, got {busy_s}")
    if isinstance(overlap_s, Mapping):
        per_kind = {str(k): float(v) for k, v in overlap_s.items()}
        mean_overlap = sum(per_kind.values()) / len(per_kind) if per_kind else busy_s / 2
    else:
        per_kind, mean_overlap = {}, float(busy_s / 2 if overlap_s is None else overlap_s)
    for v in [mean_overlap, *per_kind.values()]:
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"measure_collectives: overlap_s must be finite numbers >= 0, got {overlap_s}")
    overlap_of = {k: per_kind.get(k, mean_overlap) for k in kinds}
    # the groups of each size: ranks 0..g-1, or (tiled) the world cut into W // g disjoint groups that
    # run every cell at once, as a plan's node-local and cross-node groups do; a rank outside them idles
    tiled = busy_s > 0 if tiled is None else bool(tiled)
    tiles = {g: [list(range(j * g, (j + 1) * g)) for j in range(W // g if tiled else 1)] for g in groups}

    def groups_of(suffix: str) -> dict[int, Any]:
        """This rank's group of each size, named calibrate{g}{suffix}[_j]; every rank takes part in
        creating every group. The world itself for g = W, except for a twin."""
        found = {}
        for g in groups:
            for j, members in enumerate(tiles[g]):
                name = f"calibrate{g}{suffix}" + (f"_{j}" if j else "")
                sub = comm if g == W and not suffix else comm.subgroup(members, name=name)
                if rank in members:
                    found[g] = sub
        return found

    cells = [(k, g, s) for k in kinds for g in groups for s in sizes]
    subs = groups_of("")
    ops = {cell: _cell_op(cell, subs[cell[1]], device) for cell in cells if cell[1] in subs}
    # busy: a twin of every group, for a cell launched with its twin right behind (two collectives in flight)
    twin_ops = {}
    concurrent = busy_s > 0 if concurrent is None else bool(concurrent) and busy_s > 0
    if concurrent:
        twins = groups_of("_twin")
        twin_ops = {cell: _cell_op(cell, twins[cell[1]], device) for cell in cells if cell[1] in twins}
    rng = random.Random(seed * 1000 + rank)  # the skew before a call: each rank its own
    rng_overlap = random.Random(seed)  # the compute under an asynchronous collective: alike on every rank
    on_gpu = torch.device(device).type == "cuda"
    work = torch.randn(*((1024, 1024) if on_gpu else (96, 96)), device=device)
    computed = [0.0]  # seconds this rank computed in the iteration

    def compute(seconds: float) -> None:
        t0 = time.perf_counter()
        _busy(work, seconds)
        computed[0] += time.perf_counter() - t0
    # per cell and iteration, wall-clock ns: a blocking call and its return (rows 0, 1); with busy_s an
    # asynchronous launch's issue, the start of its wait and the wait's return (2 - 4), and in the
    # second pass the same alone (5 - 7) and with its twin (8 - 10), and in the third pass a blocking
    # call and its return with busy_s of compute after it (11, 12) and AFTER_FACTOR x busy_s (13, 14);
    # the first pass's asynchronous cell's completion as its future's callback saw it (15) and its
    # draw of compute over it (16, ns)
    t = np.full((17, len(cells), warmup + iters), np.nan)

    def launched(c: int, it: int, j: int, company: bool = False) -> None:
        """A burst, then cell c launched asynchronously (``company``: its twin right behind it),
        computed over, waited for: t[j], t[j + 1], t[j + 2] its issue inside the launch (the
        launch's return where the backend does not mark it), its wait's start and return."""
        compute(busy_s * rng.uniform(0.5, 1.5))
        # launched together and overlapped alike, as training's ranks, which leave their previous
        # collective together; every rank draws, in the group or not, so the draws stay the same
        comm.barrier()
        overlap = overlap_of[cells[c][0]] * rng_overlap.uniform(0.0, 2.0)
        op = ops.get(cells[c])
        if op is None:
            return
        handle, t[j, c, it] = _launch(comm, op)  # the simulator starts it once every rank issued it
        seen: list[int] = []  # the first pass: when it completed, while the rank computes or waits
        done = None
        if j == 2 and getattr(handle, "has_future", False) and not on_gpu:
            done = handle.future().then(lambda _f: seen.append(time.time_ns()))
        other = twin_ops[cells[c]](True) if company else None
        compute(overlap)
        t[j + 1, c, it] = time.time_ns()
        _synchronised(handle.wait())
        t[j + 2, c, it] = time.time_ns()
        if done is not None:
            done.wait()
            t[15, c, it], t[16, c, it] = min(seen[0], t[j + 2, c, it]), overlap * 1e9
        if other is not None:
            _synchronised(other.wait())

    def called(c: int, it: int, j: int, after: float) -> None:
        """A barrier and a burst, then cell c called blocking (t[j], t[j + 1] its call and return),
        then ``after`` x busy_s x U(0.5, 1.5) of compute (ended by the next barrier)."""
        comm.barrier()
        compute(busy_s * rng.uniform(0.5, 1.5))
        op = ops.get(cells[c])
        if op is not None:
            t[j, c, it] = time.time_ns()
            _synchronised(op(False))
            t[j + 1, c, it] = time.time_ns()
        compute(after * busy_s * rng.uniform(0.5, 1.5))

    shares = np.zeros(2)  # (seconds computed, seconds) over the counted iterations, summed over ranks
    for it in range(warmup + iters):
        computed[0], it_t0 = 0.0, time.perf_counter()
        for c, cell in enumerate(cells):
            if busy_s > 0:  # no barrier: the collectives themselves keep the ranks in step, as in training
                compute(busy_s * rng.uniform(0.5, 1.5))
            else:
                comm.barrier()
            op = ops.get(cell)
            if op is not None:
                t[0, c, it] = time.time_ns()
                _synchronised(op(False))
                t[1, c, it] = time.time_ns()
            if busy_s > 0:
                launched(c, it, 2)
        if it >= warmup:
            shares += (computed[0], time.perf_counter() - it_t0)
    if busy_s > 0:  # the share the ranks computed, all of them together (idle: none)
        shares = comm.all_reduce(torch.tensor(shares, dtype=torch.float64, device=device), tag="calibrate").cpu().numpy()
    share = float(shares[0] / shares[1]) if shares[1] > 0 else 0.0
    # busy: a second pass, each cell launched asynchronously alone and then with its twin right behind
    # on another group (as training's output dist with the next batch's ids in flight, or the
    # backward's with DDP's bucket), after a burst and a barrier each: what the company adds is the
    # difference of the two under the same load. Apart from the first pass: interleaved, its waits
    # left the ranks computing less of the time and the first pass's cells came out faster (steps
    # predicted 4 - 18 points lower at W = 3, 4). Up to CONCURRENT_MAX_BYTES: a latency.
    pair_cells = [c for c, cell in enumerate(cells) if cell[2] <= CONCURRENT_MAX_BYTES] if concurrent else []
    for it in range(warmup + iters if pair_cells else 0):
        for c in pair_cells:
            launched(c, it, 5)
            launched(c, it, 8, company=True)
    # busy: a third pass, the smallest and the largest of those cells called blocking with the ranks
    # computing busy_s after the call, then AFTER_FACTOR x as long: the ranks that return first hold
    # the cores the others need to return, longer the longer they compute (training computes 0.1 -
    # 7 ms after a call; notes/sim_validation.md, "2026-11-24, compute after a call")
    ends = sorted({cells[c][2] for c in pair_cells})
    after_cells = [c for c in pair_cells if cells[c][2] in (ends[0], ends[-1])] if ends else []
    for it in range(warmup + iters if after_cells else 0):
        for c in after_cells:
            called(c, it, 11, 1.0)
            called(c, it, 13, AFTER_FACTOR)
    mine = torch.tensor(t[:, :, warmup:].reshape(-1), dtype=torch.float64, device=device)
    got = comm.all_gather_v(mine, [mine.numel()] * W, tag="calibrate").cpu().numpy().reshape(W, t.shape[0], len(cells), iters)
    out = []
    for c, (k, g, s) in enumerate(cells):
        # every group's ranks and iterations, as more iterations of one group
        mine_g = np.concatenate([got[members][:, :, c, :] for members in tiles[g]], axis=-1)
        per_iter = _call_seconds(mine_g[:, 0], mine_g[:, 1])
        q = np.percentile(per_iter, [25, 50, 75])
        base = {"kind": k, "group": g, "bytes": 4 * _cell_elements(g, s), "iters": iters, "busy_s": busy_s, "overlap_s": overlap_of[k],
                "groups_together": len(tiles[g]), "compute_share": share}
        first, spread = _return_spread(mine_g[:, 0], mine_g[:, 1])
        out.append(base | {"seconds": float(max(per_iter.mean(), 1e-7)), "p25": float(q[0]), "p50": float(q[1]),
                           "p75": float(q[2]), "first_s": first, "spread_s": spread})
        if c in after_cells:  # the third pass: the blocking call with compute after it
            for j, f in ((11, 1.0), (13, AFTER_FACTOR)):
                first, spread = _return_spread(mine_g[:, j], mine_g[:, j + 1])
                out.append(base | {"seconds": float(max(_call_seconds(mine_g[:, j], mine_g[:, j + 1]).mean(), 1e-7)),
                                   "first_s": first, "spread_s": spread, "pass": "after", "after_s": f * busy_s})
        # the first pass's asynchronous cell, and the second pass's: alone, then with its twin in flight
        launches = [(2, {})] if busy_s > 0 else []
        if c in pair_cells:
            launches += [(5, {"pass": "concurrent", "concurrent": False}), (8, {"pass": "concurrent", "concurrent": True})]
        for j, extra in launches:
            d, first, spread = _async_seconds(mine_g[:, j], mine_g[:, j + 1], mine_g[:, j + 2])
            if j == 2 and np.isfinite(mine_g[:, 15:17]).all():
                extra = extra | _completions(mine_g[:, 2], mine_g[:, 15], mine_g[0, 16])
            out.append(base | {"seconds": float(max(d, 1e-7)), "first_s": first, "spread_s": spread, "async": True}
                       | extra)
    return out


def _completions(launch_ns: np.ndarray, done_ns: np.ndarray, overlap_ns: np.ndarray) -> dict[str, list[float]]:
    """Per iteration of an asynchronous cell, for offline models of how the compute over a collective
    slows it (notes/sim_validation.md, "2026-11-24, session 24"): ``iters_overlap_s``, the compute the
    ranks drew to do over it, and ``iters_done_s``, the mean over ranks of its completion (its
    future's callback, which runs on time while the ranks compute in matrix products) after the
    last rank's launch, seconds to the microsecond. Arrays (ranks, iterations) of wall-clock ns."""
    done = (done_ns.mean(axis=0) - launch_ns.max(axis=0)) / 1e9
    return {"iters_overlap_s": [round(float(v) / 1e9, 6) for v in overlap_ns],
            "iters_done_s": [round(float(v), 6) for v in done]}


def _cell_elements(g: int, nbytes: int) -> int:
    """float32 elements of a cell of ``nbytes`` in a group of g: a multiple of g, at least g."""
    return max(g, (int(nbytes) // 4) // g * g)


def _cell_op(cell: tuple[str, int, int], sub: Any, device: Any) -> Any:
    """The calibration cell (kind, group size, bytes) on the group ``sub``: a function of async_op
    that issues it (float32 ones, ``_cell_elements``)."""
    import torch

    k, g, s = cell
    n = _cell_elements(g, s)
    x = torch.ones(n, device=device)
    if k == "all_to_allv":
        sp = [n // g] * g
        return lambda a: sub.all_to_all_v(x, sp, sp, async_op=a, tag="calibrate")
    if k == "all_reduce":
        return lambda a: sub.all_reduce(x.clone(), async_op=a, tag="calibrate")
    if k == "all_gather":
        return lambda a: sub.all_gather_v(x, [n] * g, async_op=a, tag="calibrate")
    if k == "reduce_scatter":
        return lambda a: sub.reduce_scatter_v(x, [n // g] * g, async_op=a, tag="calibrate")
    raise ValueError(f"measure_collectives: unknown kind {k!r} (known: {KINDS})")


def _launch(comm: Any, op: Any) -> tuple[Any, int]:
    """(handle, wall-clock ns) of ``op(True)``, an asynchronous launch on ``comm``: the instant the
    collective was handed to the transport inside the launch, which the communicator's backend
    marks (``Communicator.issued_at``; gloo's thread may move the data before the launch returns),
    else the launch's return."""
    probe = callable(getattr(comm, "issued_at", None)) and callable(getattr(comm, "clear_issue", None))
    if probe:
        comm.clear_issue()
    w0, p0 = time.time_ns(), time.perf_counter_ns()
    handle = op(True)
    issued = comm.issued_at() if probe else None
    return handle, (w0 + (issued - p0) if issued is not None and issued >= p0 else time.time_ns())


def _synchronised(out: Any) -> None:
    """Wait for a CUDA result on the host (the stream is done); nothing for CPU tensors."""
    if getattr(out, "is_cuda", False):
        float(out.reshape(-1)[:1].sum())


def _call_seconds(call_ns: np.ndarray, ret_ns: np.ndarray) -> np.ndarray:
    """Per iteration, what a blocking call cost its ranks as the simulator charges it: the mean over
    the group's ranks of (its return - the last rank's call), seconds. Arrays (ranks, iterations)
    of wall-clock ns."""
    return (ret_ns.mean(axis=0) - call_ns.max(axis=0)) / 1e9


def _return_spread(call_ns: np.ndarray, ret_ns: np.ndarray) -> tuple[float, float]:
    """(first, spread) of a blocking cell, seconds: the mean over iterations of the first rank's
    return after the last rank's call, and the mean over ranks and iterations of a rank's return
    after that first one. Arrays (ranks, iterations) of wall-clock ns. first + spread is the
    cell's mean (``_call_seconds``)."""
    first = ret_ns.min(axis=0)
    return float((first - call_ns.max(axis=0)).mean() / 1e9), float((ret_ns - first).mean() / 1e9)


def _async_seconds(launch_ns: np.ndarray, wait_ns: np.ndarray, ret_ns: np.ndarray) -> tuple[float, float, float]:
    """(D, first, spread) of an asynchronous collective under the simulator's rule: it ends D after
    the last rank's launch (its issue, or its return) ``launch_ns``, and a rank's wait returns at
    the later of its start and that end. D gives the measured mean return over ranks and
    iterations. The waits that blocked (returned more than ``BLOCKED_NS`` after they began) return
    apart, as a blocking call's ranks do: spread is the mean over them of their return after the
    first of them in the iteration,
    and ``first`` is D with each such wait returning with that first one (the rule with return
    lags, ``trace_sim.calibrated_return_lags``). Arrays (ranks, iterations) of wall-clock ns. A
    wait that began after the collective ended constrains D only from above; the mean return is
    reached by the other waits (D is 0 when every wait returned at once)."""
    last = launch_ns.max(axis=0)
    blocked = ret_ns - wait_ns > BLOCKED_NS
    first = np.where(blocked, ret_ns, np.inf).min(axis=0)
    lags = np.where(blocked, ret_ns - first, 0.0)
    spread = float(lags[blocked].mean() / 1e9) if blocked.any() else 0.0
    return _rule_duration(last, wait_ns, ret_ns), _rule_duration(last, wait_ns, ret_ns - lags), spread


def _rule_duration(last: np.ndarray, wait_ns: np.ndarray, ret_ns: np.ndarray) -> float:
    """The D, seconds, for which max(wait start, last launch + D) has the mean of ``ret_ns``."""
    target = float(ret_ns.mean())

    def mean_return(d: float) -> float:
        return float(np.maximum(wait_ns, last + d).mean())

    lo, hi = 0.0, max(0.0, float((ret_ns - last).max()))
    if mean_return(lo) >= target:
        return 0.0
    for _ in range(60):  # mean_return rises with d: bisection to well under a nanosecond
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_return(mid) < target else (lo, mid)
    return 0.5 * (lo + hi) / 1e9


def _busy(work: Any, seconds: float) -> None:
    """Keep this rank computing for ``seconds``: on CPU its thread, in matrix products (the GIL
    is released). On a GPU the host only enqueues: as many products as fill ``seconds`` of the
    device (one timed once with CUDA events, ``_gpu_product_seconds``), then the host waits for
    the stream, so the burst ends on the host's clock when it ends on the device and the next
    collective, called then, starts on the device then too, as it would behind a step's kernels
    (host-synchronising: a calibration, not a training step). CPU-verified: not yet run on a GPU."""
    if getattr(work, "is_cuda", False):
        import torch

        for _ in range(round(seconds / _gpu_product_seconds(work))):
            torch.mm(work, work)
        torch.cuda.current_stream().synchronize()
        return
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        work @ work


_GPU_PRODUCT_S: dict[tuple, float] = {}


def _gpu_product_seconds(work: Any) -> float:
    """Device seconds of one ``work @ work`` (CUDA events around 20, after a warm-up; once per
    device and shape)."""
    import torch

    key = (str(work.device), tuple(work.shape), str(work.dtype))
    if key not in _GPU_PRODUCT_S:
        for _ in range(3):
            torch.mm(work, work)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            torch.mm(work, work)
        end.record()
        end.synchronize()
        _GPU_PRODUCT_S[key] = max(start.elapsed_time(end) / 20 / 1e3, 1e-7)
    return _GPU_PRODUCT_S[key]


# ---- the command's flags (``neo-train calibrate``; cli.py launches the ranks) ----------------------

def parse_sizes(text: str) -> list[int]:
    """'16,4KB,1MB' -> bytes (a ValueError naming the bad entry)."""
    units = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    out = []
    for part in filter(None, (t.strip() for t in text.split(","))):
        num = part.rstrip("KMGBkmgb")
        unit = part[len(num):].upper()
        try:
            v = float(num) * units[unit]
        except (ValueError, KeyError):
            raise ValueError(f"--sizes: cannot read {part!r} (e.g. 16,4KB,1MB)") from None
        if not (math.isfinite(v) and v >= 4):
            raise ValueError(f"--sizes: {part!r} must be at least 4 bytes")
        out.append(int(v))
    if not out:
        raise ValueError("--sizes: give one or more sizes, e.g. 16,4KB,1MB")
    return out


def parse_overlaps(text: str) -> float | dict[str, float]:
    """``--overlap-ms``: '2' (ms, every kind) or 'all_reduce=1.2,all_to_allv=0.9' (per collective
    kind; kinds left out take the mean of those given) -> seconds. A ValueError names the bad
    entry."""
    def ms(part: str, num: str) -> float:
        try:
            v = float(num)
        except ValueError:
            raise ValueError(f"--overlap-ms: cannot read {part!r} (e.g. 2, or all_reduce=1.2,all_to_allv=0.9)") from None
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"--overlap-ms: {part!r} must be a number of milliseconds >= 0")
        return v / 1e3

    text = text.strip()
    if "=" not in text:
        return ms(text, text)
    out: dict[str, float] = {}
    for part in filter(None, (t.strip() for t in text.split(","))):
        kind, _, num = part.partition("=")
        if kind.strip() not in KINDS:
            raise ValueError(f"--overlap-ms: unknown collective kind {kind.strip()!r} in {part!r} (known: {', '.join(KINDS)})")
        out[kind.strip()] = ms(part, num)
    return out


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    from ..config import nonnegative_float, positive_float, positive_int

    p.add_argument("--out", type=Path, required=True, help="the calibration JSON to write")
    p.add_argument("--nproc", type=positive_int,
                   help="local ranks to start via torchrun (default: 2 on CPU, one per GPU): the world size of the "
                        "traces it will simulate; under torchrun, its ranks")
    p.add_argument("--sizes", default="", help="bytes of one rank's input per collective, e.g. 16,4KB,1MB "
                                               f"(default {','.join(map(str, DEFAULT_SIZES))})")
    p.add_argument("--iters", type=positive_int, default=21,
                   help="timed calls per cell (default 21; the mean counts: with 7, two calibrations' predictions of "
                        "one trace differed by up to 12 %%)")
    p.add_argument("--groups", choices=("auto", "first", "tiled"), default="auto",
                   help="a group size g below the world: 'first' ranks 0..g-1 alone, 'tiled' the world cut into "
                        "disjoint groups of g running together (as node-local and cross-node groups do in training); "
                        "default auto: tiled with --busy-ms, first without")
    p.add_argument("--busy-ms", type=nonnegative_float, default=0.0,
                   help="every rank computes for about this long before each call (the run's compute between "
                        "collectives): calibrates the transport on a host whose ranks are CPU-bound, asynchronous "
                        "collectives too, alone and with a second one in flight (default 0: idle)")
    p.add_argument("--overlap-ms", default=None,
                   help="with --busy-ms: the ranks' mean compute while an asynchronous collective is in flight (the "
                        "run's), one number or per kind, e.g. all_reduce=1.2,all_to_allv=0.9 (`neo-train simulate "
                        "--trace` prints it); default: half of --busy-ms")
    p.add_argument("--timeout", type=positive_float, default=300.0, help="collective timeout, seconds")
