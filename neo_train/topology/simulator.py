"""Flow-level simulator of a training step's communication on a network (flat, fat-tree, Opera).

    from neo_train.topology import FatTree, simulate
    from neo_train.topology.collectives import ring_all_reduce
    res = simulate([Compute("bwd", 0.01), ring_all_reduce(16, 2.8e9, name="ar", after=("bwd",))], FatTree(16))
    res.total, res.phase("ar").duration, print(res.report())

A schedule is a DAG of phases: ``Compute(name, seconds, after)`` holds no links; ``Comm(name,
rounds, after)`` is a list of dependent rounds, each a ``Transfer`` (host-to-host flows that start
together); round k+1 starts when every byte of round k has arrived. Phases not ordered by
``after`` run concurrently, so compute overlaps communication and collectives share links.

Model. Flows are fluids. At any moment each flow's rate is the max-min fair share over the links it
crosses (progressive filling, ``max_min_rates``): NIC up and down, the host's internal fabric for
traffic between its own devices, and the topology's links. A round's end adds its slowest path's
latency (hops x hop latency). Opera is time-varying: capacities change per rotor epoch (two per
superslice); bulk flows move only while their rack pair's circuit is up; small flows take the
current expander's shortest path. With RotorLB (``vlb``), bulk bytes also go two-hop through an
intermediate rack, in one of two models (``OperaNetwork(rotorlb=...)``, see ``opera.py``):
``"slotted"`` (default, ``rotorlb.py``) relays over the circuits up now, on what direct traffic
leaves, accepted per (intermediate, destination rack) up to one window, and holds each relayed
byte at its intermediate until that rack's own circuit to the destination comes up; bulk rounds
start at superslice boundaries. ``"fluid"`` spreads VLB over the racks' pooled spare uplinks at a
2x tax and adds a fixed average wait T_c/(u+1) to the last byte. They agree on uniform all-to-all
traffic; a dependent ring step costs about a cycle in the slotted model, T_c/(u+1) in the fluid.

Aggregation (what makes 1024 nodes fast). Flows of one round that carry equal bytes, stand in the
same relation to the topology (``Network.relation``: same host / same rack / same pod / other pod
on a fat-tree; the rack pair on Opera, whose circuits differ per pair) and join hosts of equal
classes (``flows.host_classes``: hosts that play alike parts in every collective of the schedule)
are merged into one *bundle* of m member flows sharing one rate: on every link the bundle counts
as many flows as it has members crossing it (NIC links per host, exactly; identical NIC
constraints are kept once). Progressive filling raises all members alike, so when the members are
symmetric the bundle's rate is exactly each member's max-min rate; otherwise every member gets the
rate of its most loaded member (pessimistic; this happens when splitting by class would multiply a
transfer's bundles too far, ``flows.CLASS_SPLIT_LIMIT``: a ring beside an all-to-all at 1024
hosts). RotorLB's offers, acceptances and relays count member flows the same way.
``aggregate=False`` simulates every flow alone; the tests check the two agree on small networks.
A uniform all-to-all among 1024 hosts on Opera is 16,384 rack-pair bundles instead of a million
flows.

Speed-ups (``engine.py``; exact up to rounding): allocations cached per (live set, epoch) and
computed over only the bundles that can move; fast-forward over cycles that repeat; replay of
repeated bulk rounds that start from the same slot with nothing else live (``fast_forward=False``
turns both off). Bundles that finish inside an Opera epoch free their capacity at the epoch's end
(a few microseconds later), which bounds re-allocations by epochs instead of completions.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

from .engine import Engine
from .flows import max_min_rates
from .network import Network
from .schedule import Comm, Compute, Phase, PhaseTiming, SimResult, Transfer

__all__ = ["Transfer", "Comm", "Compute", "Phase", "PhaseTiming", "SimResult", "simulate", "max_min_rates"]


def _check_dag(phases: Sequence[Phase]) -> None:
    """Unique names, known dependencies, no cycle (the one found is named). Iterative: a recorded
    trace's per-rank chains are as deep as its steps times its events, past Python's recursion
    limit."""
    seen: set[str] = set()
    dup = sorted({p.name for p in phases if p.name in seen or seen.add(p.name)})
    if dup:
        raise ValueError(f"schedule: duplicate phase names {dup}")
    for p in phases:
        if not isinstance(p, (Comm, Compute)):
            raise TypeError(f"schedule: {p!r} is neither Comm nor Compute")
        missing = [d for d in p.after if d not in seen]
        if missing:
            raise ValueError(f"schedule: phase '{p.name}' waits for unknown phase(s) {missing}")
    deps = {p.name: tuple(p.after) for p in phases}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in deps:
        if root in state:
            continue
        path, work = [root], [iter(deps[root])]
        state[root] = 1
        while work:
            d = next(work[-1], None)
            if d is None:
                state[path.pop()] = 2
                work.pop()
            elif state.get(d) == 1:
                cyc = path[path.index(d):] + [d]
                raise ValueError(f"schedule: dependency cycle {' -> '.join(cyc)}")
            elif d not in state:
                state[d] = 1
                path.append(d)
                work.append(iter(deps[d]))


def simulate(phases: Sequence[Phase], network: Network, *, aggregate: bool = True,
             fast_forward: bool = True, progress: float | bool = False) -> SimResult:
    """Run ``phases`` (a DAG by ``after``) on ``network``; see the module docstring for the model.
    ``aggregate``: merge symmetric flows into bundles; ``fast_forward``: skip repeating cycles and
    replay repeating rounds (both exact; off: a check). ``progress``: print a line to stderr every
    that many seconds of wall time (True: 5) with the simulated time reached and the phases done."""
    _check_dag(phases)
    seen: set[int] = set()
    for p in phases:
        for tr in p.rounds if isinstance(p, Comm) else ():
            if id(tr) not in seen and tr.max_host >= network.hosts:
                raise ValueError(f"phase '{p.name}' names host {tr.max_host} but {network.name} has "
                                 f"{network.hosts} hosts")
            seen.add(id(tr))
    t0 = time.perf_counter()
    every = 5.0 if progress is True else float(progress or 0.0)
    if not (math.isfinite(every) and every >= 0):
        raise ValueError(f"simulate: progress must be a number of seconds >= 0 or a bool, got {progress!r}")
    eng = Engine(phases, network, aggregate, fast_forward, every)
    total = eng.run()
    return SimResult(network.describe(), total, eng.timing, time.perf_counter() - t0, dict(eng.stats))
