"""The host model: a recorded CPU trace replayed on the cores of the host that ran it.

    tl = timeline_phases(traces, calibrated_collectives(cal))   # names, blocks, collectives
    res = simulate_host(tl, cal)                                # cal.host: a calibration's CPU fits
    validate_timeline(tl, res)

Why. Ranks emulated on one CPU host (gloo over loopback, the test suite's and this machine's
setting) share its few cores, and their communication is CPU work too: over loopback a
collective is copies, system calls and thread hand-offs (on this project's 2-core VM an idle
calibration's calls spend 60 - 80 % of their time on a CPU, and a 4-rank all-reduce ~2 ms of CPU
per rank). With more busy threads than cores everything a rank does, compute or communication,
runs at the share of a core the OS gives it, so a collective takes longer when the other ranks
compute or communicate beside it. The fabric model (``trace_sim.calibrated_collectives``) charges
each collective a fitted constant instead, which a calibration can only measure under one pattern
of load; the host model derives the load from the schedule itself.

Model. Each host has ``cores`` cores (the calibration's ``host_cores``) shared by processor
sharing: every runnable *work item* on it progresses at min(1, cores / n) CPU-seconds per second
(n runnable items; one thread each). Items are:

- a rank's compute between two blocking intervals: the CPU its issuing thread spent
  (``compute_cpu_ns``; its wall time where the trace lacks it);
- an asynchronous call's launch (``call_cpu_ns``, else its wall time);
- a collective's own work on each member: ``HostFit.cpu`` (per kind, group size and the bytes
  the rank moves), started once every member has called (a blocking call) or launched it; it runs
  beside the rank's compute when the call was asynchronous (the transport's threads).

A collective ends ``HostFit.delay`` (per kind and group size: what it waits for that no core
does, e.g. wake-ups and the network) after the last member's work is done; a blocking call
returns then, a wait once every collective it joins has ended. Collectives of a group of one
rank, and waits on them only, are replayed as recorded. Nothing else is modelled: no memory
bandwidth, no scheduler latency beyond ``delay``, one host's cores shared evenly.
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Mapping

from .schedule import PhaseTiming, SimResult
from .calibrate import rank_bytes
from .trace_input import Timeline, _comm_name
from .trace_sim import entry_sizes

__all__ = ["simulate_host"]


class _Host:
    """Processor sharing of one host's cores among its runnable work items."""

    def __init__(self, cores: float) -> None:
        self.cores = float(cores)
        self.items: dict[int, float] = {}  # item id -> CPU seconds left

    def rate(self) -> float:
        return min(1.0, self.cores / len(self.items)) if self.items else 0.0

    def next_done(self) -> float:
        return min(self.items.values()) / self.rate() if self.items else math.inf

    def advance(self, dt: float) -> list[int]:
        r = self.rate()
        done = []
        for k in list(self.items):
            self.items[k] -= dt * r
            if self.items[k] <= 1e-12:
                done.append(k)
        for k in done:
            del self.items[k]
        return done


def _work(wall: float, cpu: float | None, runq: float | None) -> tuple[float, float]:
    """(CPU seconds, seconds asleep) of a recorded interval: its CPU, and what it spent neither
    running nor waiting for a core (waiting for data, a lock). Without CPU times, all of it is
    CPU; without run-queue times, all of its CPU time is, and it never slept."""
    if cpu is None:
        return wall, 0.0
    if runq is None:
        return cpu, 0.0
    return cpu, max(0.0, wall - cpu - runq)


def simulate_host(tl: Timeline, cal: Any) -> SimResult:
    """Replay ``tl`` (``timeline_phases``) on the host model of ``cal`` (a Calibration with a
    ``host`` fit); returns a SimResult whose phases carry the end of every node ``tl`` names
    (each rank's compute and blocking intervals, each collective), as ``validate_timeline`` reads."""
    fit = cal.host
    if fit is None:
        raise ValueError(f"{cal._where()} has no host fit (no CPU times in its samples: calibrate again with this "
                         f"version of neo-train calibrate)")
    per_host = max(1, int(fit.ranks_per_host))
    hosts: dict[int, _Host] = {}
    ends: dict[str, float] = {}  # the ranks' nodes
    coll_start: dict[tuple, float] = {}
    coll_end: dict[str, float] = {}
    # per rank: its program, ops ("run", CPU seconds, seconds asleep, node), ("arrive", key) and
    # ("block", keys, node)
    progs: dict[int, list[tuple]] = {}
    for rank, blocks in tl.blocks.items():
        ops: list[tuple] = []
        for b in blocks:
            c, end = tl.nodes[(rank, b.order)]
            work, sleep = _work(b.compute, b.compute_cpu, b.compute_runq)
            if b.compute_helpers:  # the rank's helper threads ran beside this compute
                ops.append(("helper", b.compute_helpers))
            if b.step_lead is not None:
                frac = min(b.step_lead, b.compute) / b.compute if b.compute > 0 else 0.0
                ops.append(("run", work * (1.0 - frac), sleep * (1.0 - frac), c + "a"))
                ops.append(("run", work * frac, sleep * frac, c))
            else:
                ops.append(("run", work, sleep, c))
            joins = tuple(k for k in b.colls if k not in tl.local)
            if b.kind == "call" and not joins:  # a group of one: the rank's own work, as recorded
                ops.append(("run", *_work(b.blocked, b.call_cpu, b.call_runq), end))
            elif b.kind == "call" and b.sync:
                ops.append(("arrive", joins[0]))
                ops.append(("block", joins, end))
            elif b.kind == "call":  # an asynchronous launch, then the collective can start
                ops.append(("run", *_work(b.blocked, b.call_cpu, b.call_runq), end))
                ops.append(("arrive", joins[0]))
            elif joins:
                ops.append(("block", joins, end))
            else:  # a wait on local collectives only
                ops.append(("run", b.blocked, 0.0, end))
        progs[rank] = ops
    pos = {r: 0 for r in progs}
    arrived: dict[tuple, int] = {}
    pending: dict[tuple, int] = {}  # collective -> its members' work items not done
    done: set = set()
    item_of: dict[int, tuple] = {}  # work item -> ("rank", rank) or ("coll", key)
    blocked_on: dict[int, tuple] = {}
    timers: list[tuple[float, int, tuple]] = []  # (when, seq, ("rank", r): a sleep ends | ("coll", key): it ends)
    seq = [0]

    def host_of(rank: int) -> _Host:
        h = rank // per_host
        if h not in hosts:
            hosts[h] = _Host(fit.cores)
        return hosts[h]

    def add_item(rank: int, work: float, owner: tuple) -> None:
        seq[0] += 1
        host_of(rank).items[seq[0]] = work
        item_of[seq[0]] = owner

    def add_timer(when: float, owner: tuple) -> None:
        seq[0] += 1
        heapq.heappush(timers, (when, seq[0], owner))

    def kind_of(key: tuple) -> tuple[str, list]:
        by_rank = tl.colls[key]
        group = sorted(by_rank)
        kind = _comm_name(by_rank[group[0]])
        return ("all_to_allv" if kind == "all_to_all" else kind), group

    def start_collective(key: tuple, t: float) -> None:
        kind, group = kind_of(key)
        g = len(group)
        coll_start[key] = t
        sizes = entry_sizes(kind, group, tl.colls[key]) if kind != "barrier" else None
        pending[key] = g
        for i, r in enumerate(group):
            add_item(r, fit.cpu(kind, g, 0.0 if sizes is None else rank_bytes(kind, g, sizes, i)), ("coll", key))

    def step(rank: int, t: float) -> None:
        """The rank's current op is over at ``t``: record its node, go on."""
        ends[progs[rank][pos[rank]][-1]] = t
        pos[rank] += 1
        run(rank, t)

    def run(rank: int, t: float) -> None:
        """Advance the rank from its position until it waits for the CPU, a sleep or a collective."""
        ops = progs[rank]
        while pos[rank] < len(ops):
            op = ops[pos[rank]]
            if op[0] == "run":
                if op[1] > 0:
                    add_item(rank, op[1], ("rank", rank))
                    return
                if op[2] > 0:
                    add_timer(t + op[2], ("rank", rank))
                    return
                ends[op[3]] = t
            elif op[0] == "helper":
                add_item(rank, op[1], ("helper", rank))
            elif op[0] == "arrive":
                key = op[1]
                arrived[key] = arrived.get(key, 0) + 1
                if arrived[key] == len(tl.colls[key]):
                    start_collective(key, t)
            else:  # block
                if not all(k in done for k in op[1]):
                    blocked_on[rank] = op[1]
                    return
                ends[op[2]] = t
            pos[rank] += 1

    def finish(owner: tuple, t: float, from_timer: bool) -> None:
        if owner[0] == "helper":
            return
        if owner[0] == "rank":
            r = owner[1]
            op = progs[r][pos[r]]
            if not from_timer and op[2] > 0:  # its CPU is done; now it sleeps
                add_timer(t + op[2], owner)
            else:
                step(r, t)
            return
        key = owner[1]
        if not from_timer:  # a member's work is done
            pending[key] -= 1
            if pending[key] == 0:
                kind, group = kind_of(key)
                add_timer(t + fit.delay(kind, len(group)), owner)
            return
        done.add(key)
        coll_end[tl.comm_end[key]] = t
        for r in [r for r, keys in blocked_on.items() if key in keys]:
            if all(k in done for k in blocked_on[r]):
                del blocked_on[r]
                step(r, t)

    t = 0.0
    for r in progs:
        run(r, t)
    while True:
        dt = min(min((h.next_done() for h in hosts.values()), default=math.inf),
                 timers[0][0] - t if timers else math.inf)
        if not math.isfinite(dt):
            break
        finished = [item for h in hosts.values() for item in h.advance(max(dt, 0.0))]
        t += max(dt, 0.0)
        for item in finished:
            finish(item_of.pop(item), t, False)
        while timers and timers[0][0] <= t + 1e-15:
            finish(heapq.heappop(timers)[2], t, True)
    stuck = sorted(r for r in progs if pos[r] < len(progs[r]))
    if stuck:
        r = stuck[0]
        raise ValueError(f"host model: rank {r} never passed op {pos[r]} of its timeline ({progs[r][pos[r]][0]}): a "
                         f"collective it waits for never started (the trace's ranks disagree)")
    phases = [PhaseTiming(name, "compute", "", end, end) for name, end in ends.items()]
    for key, name in tl.comm_end.items():
        phases.append(PhaseTiming(name, kind_of(key)[0], "host", coll_start[key], coll_end[name]))
    return SimResult("host", t, phases)
