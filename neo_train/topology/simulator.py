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
superslice); bulk flows move only while their rack pair's circuit is up, then, with RotorLB, over
two-hop VLB paths on what direct traffic leaves; small flows take the current expander's shortest
path (see ``opera.py``).

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
hosts). ``aggregate=False`` simulates every flow alone; the tests check the two agree on small
networks. A uniform all-to-all among 1024 hosts on Opera is 16,384 rack-pair bundles instead of a
million flows.

Opera speed-ups; (1) and (2) are exact. (1) Allocations depend only on which bundles are
live and on the epoch, so they are cached per (live set, epoch); repeated ring steps hit the
cache. (2) Fast-forward: once the live set has stayed the same for a whole cycle, simulated epoch
by epoch, the following cycles repeat it byte for byte, so whole cycles are skipped at once (up
to a cycle before the next completion or event). (3) Bundles that finish inside an epoch free
their capacity at the epoch's end (a few microseconds later) rather than at once: this bounds
re-allocations by epochs instead of completions, and errs slow by at most that.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np

from .flows import KIND_BULK, KIND_LOWLAT, Bundles, cat, host_classes, max_min_rates, prepare
from .network import Network
from .opera import OperaNetwork

__all__ = ["Transfer", "Comm", "Compute", "Phase", "PhaseTiming", "SimResult", "simulate", "max_min_rates"]


# ---- the schedule format -------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Transfer:
    """One round of point-to-point flows: flow i moves ``nbytes[i]`` from host ``src[i]`` to host
    ``dst[i]`` (src == dst: between devices of one host, over its internal fabric)."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray

    def __post_init__(self) -> None:
        src = np.asarray(self.src, dtype=np.int64).ravel()
        dst = np.asarray(self.dst, dtype=np.int64).ravel()
        nb = np.broadcast_to(np.asarray(self.nbytes, dtype=np.float64), src.shape).copy()
        if src.shape != dst.shape:
            raise ValueError(f"transfer: src has {src.size} flows, dst {dst.size}")
        if src.size and (src.min() < 0 or dst.min() < 0):
            raise ValueError("transfer: host ids must be >= 0")
        if not np.isfinite(nb).all() or (nb < 0).any():
            raise ValueError("transfer: bytes must be finite and >= 0")
        keep = nb > 0
        object.__setattr__(self, "src", src[keep])
        object.__setattr__(self, "dst", dst[keep])
        object.__setattr__(self, "nbytes", nb[keep])

    @classmethod
    def from_matrix(cls, matrix: np.ndarray) -> "Transfer":
        """Flows of an (N, N) byte matrix, M[i, j] from host i to host j (diagonal: intra-host)."""
        M = np.asarray(matrix, dtype=np.float64)
        if M.ndim != 2 or M.shape[0] != M.shape[1]:
            raise ValueError(f"transfer: need a square byte matrix, got shape {M.shape}")
        i, j = np.nonzero(M)
        return cls(i, j, M[i, j])

    @property
    def total_bytes(self) -> float:
        return float(self.nbytes.sum())

    @property
    def network_bytes(self) -> float:
        """Bytes that leave their host (through a NIC)."""
        return float(self.nbytes[self.src != self.dst].sum())

    @property
    def max_host(self) -> int:
        return int(max(self.src.max(initial=-1), self.dst.max(initial=-1)))


@dataclass(frozen=True)
class Comm:
    """A collective (or any communication) as dependent rounds of transfers."""

    name: str
    rounds: tuple[Transfer, ...]
    after: tuple[str, ...] = ()
    collective: str = "all_to_all"
    """What it is, for reports and byte shares: all_to_all, all_reduce, all_gather, reduce_scatter, ..."""
    algorithm: str = ""
    """How it is done: direct, pairwise, ring, dps, hierarchical ..."""
    payload: float = 0.0
    """The collective's size in bytes (an all-reduce's S), for reports."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rounds", tuple(self.rounds))
        object.__setattr__(self, "after", tuple(self.after))

    @property
    def network_bytes(self) -> float:
        return sum(r.network_bytes for r in self.rounds)


@dataclass(frozen=True)
class Compute:
    """Work that holds no network link, ``seconds`` long."""

    name: str
    seconds: float
    after: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "after", tuple(self.after))
        if not (math.isfinite(self.seconds) and self.seconds >= 0):
            raise ValueError(f"compute '{self.name}': seconds must be >= 0, got {self.seconds}")


Phase = Union[Comm, Compute]


@dataclass
class PhaseTiming:
    name: str
    kind: str
    """'compute' or the collective ('all_to_all', 'all_reduce', ...)."""
    algorithm: str
    start: float
    end: float
    rounds: int = 0
    network_bytes: float = 0.0
    lower_bound: float = 0.0
    """Bandwidth bound: sum over rounds of max over hosts of max(bytes out, bytes in) / NIC rate
    (intra-host rounds: bytes / internal fabric). All-to-all: bytes a host sends / B; ring
    all-reduce: 2(N-1)/N * S / B; DPS: the same in two rounds."""

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class SimResult:
    network: str
    total: float
    """Makespan: the last phase's end (seconds)."""
    phases: list[PhaseTiming]
    wall_seconds: float = 0.0
    stats: dict = field(default_factory=dict)

    def phase(self, name: str) -> PhaseTiming:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase '{name}'")

    def busy_time(self, kind: str) -> float:
        """Seconds during which at least one phase of ``kind`` ('compute', 'all_to_all', ...) runs."""
        return self._union_seconds(lambda p: p.kind == kind)

    def comm_busy_time(self) -> float:
        """Seconds during which at least one communication phase (any kind but 'compute') runs."""
        return self._union_seconds(lambda p: p.kind != "compute")

    def _union_seconds(self, keep) -> float:
        """Length of the union of the kept phases' [start, end) intervals."""
        spans = sorted((p.start, p.end) for p in self.phases if keep(p) and p.end > p.start)
        busy, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            if cur_e is None or s > cur_e:
                busy += 0.0 if cur_e is None else cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        return busy + (0.0 if cur_e is None else cur_e - cur_s)

    def totals(self) -> dict[str, float]:
        """Busy seconds per kind and network bytes per collective."""
        kinds = sorted({p.kind for p in self.phases})
        out = {f"{k}_s": self.busy_time(k) for k in kinds}
        for k in kinds:
            if k != "compute":
                out[f"{k}_bytes"] = sum(p.network_bytes for p in self.phases if p.kind == k)
        return out

    def report(self) -> str:
        """The timeline, each collective's bandwidth lower bound beside its simulated time."""
        w = max([14] + [len(p.name) for p in self.phases])
        head = f"{self.network}: iteration {self.total * 1e3:.3f} ms (simulated in {self.wall_seconds:.2f} s)"
        lines = [head, f"{'phase':<{w}} {'kind':<14} {'algo':<9} {'start ms':>9} {'end ms':>9} {'took ms':>9} "
                       f"{'bound ms':>9} {'x bound':>7} {'net GB':>8}"]
        for p in self.phases:
            ratio = f"{p.duration / p.lower_bound:7.2f}" if p.lower_bound > 0 else f"{'':>7}"
            bound = f"{p.lower_bound * 1e3:9.3f}" if p.kind != "compute" else f"{'':>9}"
            lines.append(f"{p.name:<{w}} {p.kind:<14} {p.algorithm:<9} {p.start * 1e3:9.3f} {p.end * 1e3:9.3f} "
                         f"{p.duration * 1e3:9.3f} {bound} {ratio} {p.network_bytes / 1e9:8.3f}")
        return "\n".join(lines)


# ---- the engine ------------------------------------------------------------------------------------

@dataclass
class _Round:
    phase: int
    index: int
    bundles: Bundles
    rem: np.ndarray
    live: np.ndarray
    arrive: float = 0.0


class _Engine:
    """Event loop over phases, rounds and bundles. ``version`` counts changes of the live bundle
    set; allocations are cached per (live set, epoch) and reused while nothing changes (and across
    repeated identical rounds: the cache is keyed by which bundles of which transfers are live)."""

    def __init__(self, phases: Sequence[Phase], net: Network, aggregate: bool, fast_forward: bool) -> None:
        self.phases, self.net, self.aggregate = list(phases), net, aggregate
        self.opera = net if isinstance(net, OperaNetwork) else None
        self.tv = bool(self.opera is not None and self.opera.time_varying)
        self.fast_forward = fast_forward and self.tv
        self.cap = net.capacity()
        self.L = self.cap.shape[0]
        self.net0 = net.first_net_link
        self.below = self.net0 if self.opera is not None else self.L  # dedupable links
        self.prepared: dict[int, Bundles] = {}
        self.classes = host_classes([t for p in self.phases if isinstance(p, Comm) for t in p.rounds], net) \
            if aggregate and net.class_split else None
        self.rounds: list[_Round] = []
        self.parked: dict[int, _Round] = {}
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.version, self.built = 0, -1
        self.alloc: dict = {}
        self.sig_cache: OrderedDict = OrderedDict()
        self.ff_mark: tuple | None = None  # (version, t, rem) at the start of a measured cycle
        self.pending_epoch = None  # epoch whose finished bundles are dropped at its end (Opera)
        self.stats = {"allocations": 0, "steps": 0, "ff_cycles": 0, "bundles_max": 0}
        self.index = {p.name: i for i, p in enumerate(self.phases)}
        self.timing = [PhaseTiming(p.name, "compute" if isinstance(p, Compute) else p.collective,
                                   "" if isinstance(p, Compute) else p.algorithm, math.nan, math.nan,
                                   0 if isinstance(p, Compute) else len(p.rounds)) for p in self.phases]
        self.done = [False] * len(self.phases)
        self.waiting = [len(set(p.after)) for p in self.phases]  # unfinished dependencies
        self.children: list[list[int]] = [[] for _ in self.phases]
        for i, p in enumerate(self.phases):
            for d in set(p.after):
                self.children[self.index[d]].append(i)

    # ---- the DAG ----------------------------------------------------------------------------
    def push(self, t: float, what: str, arg: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, what, arg))

    def start(self, i: int, t: float) -> None:
        p = self.phases[i]
        self.timing[i].start = t
        if isinstance(p, Compute):
            self.push(t + p.seconds, "compute", i)
        else:
            self.start_round(i, 0, t)

    def finish_phase(self, i: int, t: float) -> None:
        self.done[i] = True
        self.timing[i].end = t
        for j in self.children[i]:
            self.waiting[j] -= 1
            if self.waiting[j] == 0:
                self.start(j, t)

    def start_round(self, i: int, k: int, t: float) -> None:
        p = self.phases[i]
        if k == len(p.rounds):
            self.finish_phase(i, t)
            return
        tr = p.rounds[k]
        b = self.prepared.get(id(tr))
        if b is None:
            b = self.prepared[id(tr)] = prepare(tr, self.net, self.aggregate, self.classes)
        self.timing[i].lower_bound += b.bound
        self.timing[i].network_bytes += b.network_bytes
        r = _Round(i, k, b, b.nbytes.copy(), np.ones(b.n, dtype=bool), t)
        if b.n == 0:
            self.park(r)
            return
        self.rounds.append(r)
        self.version += 1

    def park(self, r: _Round) -> None:
        """The round's bytes are all sent: the next starts when its last byte arrives."""
        self.parked[id(r)] = r
        self.push(r.arrive, "round", id(r))

    def process_events(self, t: float) -> None:
        while self.events and self.events[0][0] <= t * (1 + 1e-12) + 1e-15:
            te, _, what, arg = heapq.heappop(self.events)
            te = max(te, t)
            if what == "compute":
                self.finish_phase(arg, te)
            else:
                r = self.parked.pop(arg)
                self.start_round(r.phase, r.index + 1, te)

    # ---- the live bundle set ----------------------------------------------------------------
    def build(self) -> None:
        """Concatenate the live bundles of all active rounds (global ids) and their entries."""
        if self.built == self.version:
            return
        self.built = self.version
        sig = tuple((id(r.bundles), r.live.tobytes()) for r in self.rounds)
        self.alloc = self.sig_cache.pop(sig, None) or {}
        self.sig_cache[sig] = self.alloc
        while len(self.sig_cache) > 64:
            self.sig_cache.popitem(last=False)
        cols: dict[str, list] = {k: [] for k in ("members", "kind", "a", "c", "rem", "owner", "local", "tol")}
        sets: dict[str, list] = {k: [] for k in ("ent", "circ", "pools", "vlb")}
        self.remaps, o = [], 0
        for ri, r in enumerate(self.rounds):
            b, live = r.bundles, np.flatnonzero(r.live)
            remap = np.full(b.n, -1, dtype=np.int64)
            remap[live] = np.arange(live.size) + o
            self.remaps.append(remap)
            for k, v in (("members", b.members), ("kind", b.kind), ("a", b.a), ("c", b.c), ("rem", r.rem)):
                cols[k].append(v[live])
            cols["owner"].append(np.full(live.size, ri))
            cols["local"].append(live)
            cols["tol"].append(b.nbytes[live] * 1e-9 + 1e-6)
            for k in sets:
                e = getattr(b, k)
                if e[0].size:
                    g = remap[e[0]]
                    keep = g >= 0
                    sets[k].append((g[keep], e[1][keep], e[2][keep]))
            o += live.size
        self.n = o
        for k, v in cols.items():
            setattr(self, k, np.concatenate(v) if v else np.zeros(0))
        self.owner = self.owner.astype(np.int64)
        self.local = self.local.astype(np.int64)
        self.a, self.c = self.a.astype(np.int64), self.c.astype(np.int64)
        self.ent, self.circ, self.pools, self.vlb = (cat(sets[k]) for k in sets)
        self.bulk = np.flatnonzero(self.kind == KIND_BULK)
        self.low = np.flatnonzero(self.kind == KIND_LOWLAT)
        self.round_starts = np.cumsum([0] + [int(r.live.sum()) for r in self.rounds[:-1]]).astype(np.int64)
        self.gone = np.zeros(self.n, dtype=bool)
        self.pending_epoch = None
        self.stages_cache = None
        self.stats["bundles_max"] = max(self.stats["bundles_max"], self.n)

    def scatter_rem(self) -> None:
        """Write the concatenated remaining bytes back into the rounds."""
        for r, remap in zip(self.rounds, self.remaps):
            live = np.flatnonzero(r.live)
            r.rem[live] = self.rem[remap[live]]

    def stages(self) -> tuple:
        """(stage-1 entries except per-epoch multi-hop ones, stage-2 VLB entries in bulk-local ids),
        once per version. Links of one class in every active round are one constraint: only the
        first of each class keeps its entries."""
        if self.stages_cache is None:
            ent = self.ent
            if self.rounds and ent[0].size:
                classes = np.stack([r.bundles.classes for r in self.rounds], axis=1)
                _, first = np.unique(classes, axis=0, return_index=True)
                rep = np.ones(self.L, dtype=bool)
                rep[: self.below] = False
                rep[first] = True
                keep = rep[ent[1]]
                ent = (ent[0][keep], ent[1][keep], ent[2][keep])
            # pools bind only beside multi-hop flows; otherwise their residual is the circuits'
            one = cat([ent, self.circ] + ([self.pools] if self.low.size else []))
            two = None
            if self.opera is not None and self.opera.vlb and self.bulk.size:
                sub = np.full(self.n, -1, dtype=np.int64)
                sub[self.bulk] = np.arange(self.bulk.size)
                k = sub[ent[0]] >= 0
                f, lk, cf = cat([(ent[0][k], ent[1][k], ent[2][k]), self.vlb])
                two = (sub[f], lk, cf)
            self.stages_cache = (one, two)
        return self.stages_cache

    def allocate(self, epoch) -> tuple[np.ndarray, np.ndarray]:
        """(rate, VLB part of it) per live bundle in ``epoch`` (an Opera epoch index, or None on a
        static network or mesh)."""
        hit = self.alloc.get(epoch)
        if hit is not None:
            return hit
        self.stats["allocations"] += 1
        n = self.n
        one, two = self.stages()
        op = self.opera
        if op is None:
            out = (max_min_rates(n, *one, self.cap)[0], np.zeros(n))
            self.alloc[epoch] = out
            return out
        cap = self.cap.copy()
        if epoch is not None:
            cap[self.net0:] = op.epoch_net_capacity(epoch)
        if self.low.size:
            mem, lk = op.path_links(0 if epoch is None else epoch // 2, self.a[self.low], self.c[self.low])
            one = cat([one, (self.low[mem], lk, self.members[self.low][mem])])
        rate, res = max_min_rates(n, *one, cap)
        vlb = np.zeros(n)
        if two is not None:
            if not self.low.size:  # pools were no constraint: their residual is their circuits'
                R = op.racks
                rc = res[self.net0:self.net0 + R * R].reshape(R, R)
                res[self.net0 + R * R:self.net0 + R * R + R] = rc.sum(axis=1)
                res[self.net0 + R * R + R:] = rc.sum(axis=0)
            vlb[self.bulk] = max_min_rates(self.bulk.size, *two, res)[0]
            rate = rate + vlb
        out = (rate, vlb)
        self.alloc[epoch] = out
        return out

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> float:
        t = 0.0
        for i, w in enumerate(self.waiting):
            if w == 0:
                self.start(i, t)
        op = self.opera
        while True:
            self.build()
            if self.n == 0:
                if not self.events:
                    break
                t = self.events[0][0]
                self.process_events(t)
                continue
            epoch, t_epoch = op.epoch_of(t) if op is not None else (None, math.inf)
            if self.pending_epoch is not None and epoch != self.pending_epoch:
                self.version += 1  # drop the bundles that finished in the last epoch
                continue
            t_ev = self.events[0][0] if self.events else math.inf
            t_mark = math.inf
            if self.fast_forward:
                if self.ff_mark is None or self.ff_mark[0] != self.version:
                    self.ff_mark = (self.version, t, self.rem.copy())
                elif t >= self.ff_mark[1] + op.cycle * (1 - 1e-12):
                    if self.skip_cycles(t, t_ev):
                        t = self.t_ff
                    self.ff_mark = (self.version, t, self.rem.copy())
                    continue
                t_mark = self.ff_mark[1] + op.cycle
            rate, vlb = self.allocate(epoch)
            if self.pending_epoch is not None:
                rate, vlb = np.where(self.gone, 0.0, rate), np.where(self.gone, 0.0, vlb)
            self.stats["steps"] += 1
            with np.errstate(divide="ignore", invalid="ignore"):
                ttf = np.where(rate > 0, self.rem / rate, math.inf)
            if self.tv:
                # freed capacity waits for the epoch's end anyway: step to it, or to the moment a
                # whole round is done (the next round starts then)
                last = np.maximum.reduceat(np.where(self.gone, -math.inf, ttf), self.round_starts)
                t_next = min(t + float(last.min()), t_ev, t_epoch, t_mark)
            else:
                t_next = min(t + float(ttf.min()), t_ev)
            if not math.isfinite(t_next):
                stuck = sorted({self.phases[self.rounds[int(o)].phase].name for o in self.owner})
                raise RuntimeError(f"simulation stalled at t = {t:.6g} s: flows of {stuck} get no bandwidth")
            dt = t_next - t
            if dt <= 0 and t_ev > t:
                # the next completion lies below the clock's resolution at t (t + ttf == t in
                # float): move its bytes anyway, or the loop would never make progress
                dt = float(ttf[np.isfinite(ttf)].min())
            self.rem = np.maximum(self.rem - rate * dt, 0.0)
            self.complete(t, ttf, dt, vlb, epoch)
            t = t_next
            self.process_events(t)
        if not all(self.done):
            stuck = [self.phases[i].name for i in range(len(self.phases)) if not self.done[i]]
            raise ValueError(f"schedule never finishes phases {stuck}: check their 'after' dependencies")
        self.t_end = t
        return max((tm.end for tm in self.timing), default=0.0)

    def skip_cycles(self, t: float, t_ev: float) -> bool:
        """Fast-forward (Opera). The live set has not changed for a whole cycle, and allocations
        depend only on the live set and the epoch: the next cycles repeat the one just simulated
        epoch by epoch, byte for byte. Skip as many as leave every bundle, and the next event, a
        cycle's margin; exact, not an average."""
        op = self.opera
        per_cycle = self.ff_mark[2] - self.rem
        with np.errstate(divide="ignore", invalid="ignore"):
            cycles = np.where(per_cycle > 0, self.rem / per_cycle, math.inf)
        k = math.floor(min(float(cycles.min()), (t_ev - t) / op.cycle)) - 1
        if k < 1:
            return False
        self.rem = np.maximum(self.rem - per_cycle * k, 0.0)
        self.scatter_rem()
        self.stats["ff_cycles"] += k
        self.t_ff = t + k * op.cycle
        return True

    def complete(self, t: float, ttf: np.ndarray, dt: float, vlb: np.ndarray, epoch) -> None:
        """Retire bundles whose bytes were all sent in [t, t + dt) (bundle i at t + ttf[i]). On a
        static network the rest are re-allocated at once; on Opera the freed capacity waits for the
        epoch's end (at most a few microseconds), which bounds re-allocations by epochs instead of
        completions."""
        fin = ((self.rem <= self.tol) | (ttf <= dt)) & ~self.gone
        self.scatter_rem()
        if not fin.any():
            return
        op = self.opera
        g = np.flatnonzero(fin)
        self.gone[g] = True
        done_at = t + np.minimum(ttf[g], dt)
        # a bundle still on VLB at its end waits an extra hop and for the intermediate's circuit
        extra = np.where(vlb[g] > 0, op.hop_latency + op.vlb_delay, 0.0) if op is not None else np.zeros(g.size)
        owners, local = self.owner[g], self.local[g]
        for ri in np.unique(owners):
            sel = owners == ri
            r = self.rounds[int(ri)]
            r.live[local[sel]] = False
            r.arrive = max(r.arrive, float((done_at[sel] + r.bundles.latency[local[sel]] + extra[sel]).max()))
        if self.tv and all(r.live.any() for r in self.rounds):
            self.pending_epoch = epoch
            return
        still = []
        for r in self.rounds:
            if r.live.any():
                still.append(r)
            else:
                self.park(r)
        self.rounds = still
        self.version += 1


def _check_dag(phases: Sequence[Phase]) -> None:
    names = [p.name for p in phases]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"schedule: duplicate phase names {dup}")
    known = set(names)
    for p in phases:
        if not isinstance(p, (Comm, Compute)):
            raise TypeError(f"schedule: {p!r} is neither Comm nor Compute")
        missing = [d for d in p.after if d not in known]
        if missing:
            raise ValueError(f"schedule: phase '{p.name}' waits for unknown phase(s) {missing}")
    deps = {p.name: p.after for p in phases}
    state: dict[str, int] = {}

    def visit(nm: str, path: tuple[str, ...]) -> None:
        if state.get(nm) == 2:
            return
        if state.get(nm) == 1:
            raise ValueError(f"schedule: dependency cycle {' -> '.join(path + (nm,))}")
        state[nm] = 1
        for d in deps[nm]:
            visit(d, path + (nm,))
        state[nm] = 2

    for nm in names:
        visit(nm, ())


def simulate(phases: Sequence[Phase], network: Network, *, aggregate: bool = True,
             fast_forward: bool = True) -> SimResult:
    """Run ``phases`` (a DAG by ``after``) on ``network``; see the module docstring for the model."""
    _check_dag(phases)
    seen: set[int] = set()
    for p in phases:
        for tr in p.rounds if isinstance(p, Comm) else ():
            if id(tr) not in seen and tr.max_host >= network.hosts:
                raise ValueError(f"phase '{p.name}' names host {tr.max_host} but {network.name} has "
                                 f"{network.hosts} hosts")
            seen.add(id(tr))
    t0 = time.perf_counter()
    eng = _Engine(phases, network, aggregate, fast_forward)
    total = eng.run()
    return SimResult(network.describe(), total, eng.timing, time.perf_counter() - t0, dict(eng.stats))
