"""The simulator's event loop (``simulator.simulate`` runs it): phases, rounds and bundles.

State. Live rounds' live bundles are concatenated into flat arrays (global ids) whenever the set
of rounds changes (``struct``); bundles that finish later keep their place, marked ``gone``, and
only the live set's ``version`` changes. Allocations are cached per (live set, epoch): the key
names which bundles of which transfers are live, so repeated identical rounds (ring steps) hit
the cache. An allocation takes only the bundles that can move in its epoch (on Opera, bulk
bundles whose circuit is up, found through a per-circuit index), and each step updates only the
bundles that move: an all-to-all among 1024 hosts moves about 1/16 of its bundles per epoch.

Opera speed-ups (all exact: a cached or replayed result is the one the step-by-step loop gives,
up to rounding): allocation caching; fast-forward (a live set that stayed the same for a whole
cycle, simulated epoch by epoch, repeats that cycle byte for byte: whole cycles are skipped, up
to a cycle before the next completion or event, and, with slotted RotorLB, only while it relays
nothing and before any intermediate may start accepting); round replay (slotted RotorLB: a bulk
round starting at a slot boundary with nothing else live or held runs as it ran the last time it
started from the same slot of the cycle: its outcome is replayed when no event falls inside it;
2046 ring steps at 1024 hosts simulate about 130 rounds). Bundles that finish inside an epoch
free their capacity at the epoch's end (a few microseconds later) rather than at once: this
bounds re-allocations by epochs instead of completions, and errs slow by at most that.
"""
from __future__ import annotations

import heapq
import math
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .flows import KIND_BULK, KIND_LOWLAT, Bundles, cat, host_classes, max_min_rates, prepare
from .network import Network
from .opera import OperaNetwork
from .rotorlb import RotorLB
from .schedule import Comm, Compute, Phase, PhaseTiming

__all__ = ["Engine"]


@dataclass
class _Round:
    phase: int
    index: int
    bundles: Bundles
    rem: np.ndarray
    live: np.ndarray
    arrive: float = 0.0


class Engine:
    """Event loop over phases, rounds and bundles. ``version`` counts changes of the live bundle
    set; allocations are cached per (live set, epoch) and reused while nothing changes (and across
    repeated identical rounds: the cache is keyed by which bundles of which transfers are live)."""

    def __init__(self, phases: Sequence[Phase], net: Network, aggregate: bool, fast_forward: bool,
                 progress: float = 0.0) -> None:
        self.phases, self.net, self.aggregate = list(phases), net, aggregate
        self.opera = net if isinstance(net, OperaNetwork) else None
        self.tv = bool(self.opera is not None and self.opera.time_varying)
        self.fast_forward = fast_forward and self.tv
        self.rlb = RotorLB(self.opera) if self.opera is not None and self.opera.slotted else None
        self.draining: list[_Round] = []  # rounds all sent whose relayed bytes are still held
        self.waiting_rounds: dict[int, _Round] = {}  # bulk rounds waiting for the next slot
        self.memo: dict = {}  # (transfer's bundles, slot) -> (quiet after, arrival) offsets
        self.probe: tuple | None = None  # (key, start, round) of a round run from a quiet state
        self.progress, self.wall0, self.wall_next = progress, time.perf_counter(), progress
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
        self.version, self.built = 0, -1  # changes of the live bundle set
        self.struct, self.struct_built = 0, -1  # changes of the set of live rounds
        self.remaps: list[np.ndarray] = []
        self.alloc: dict = {}
        self.sig_cache: OrderedDict = OrderedDict()
        self.ff_mark: tuple | None = None  # (version, t, rem) at the start of a measured cycle
        self.pending_epoch = None  # epoch whose finished bundles are dropped at its end (Opera)
        self.stats = {"allocations": 0, "steps": 0, "ff_cycles": 0, "bundles_max": 0, "memo_rounds": 0}
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
        if self.rlb is not None and (b.kind == KIND_BULK).any():
            t_slot = self.opera.slot_start(t)
            if t_slot > t:  # RotorLB plans per slot: bulk rounds start at the next one
                self.waiting_rounds[id(r)] = r
                self.push(t_slot, "begin", id(r))
                return
        self.begin(r, t)

    def begin(self, r: _Round, t: float) -> None:
        """Round ``r`` goes live at t. Slotted RotorLB: a bulk round that starts at a slot
        boundary with nothing else live or held runs exactly as it ran the last time it started
        from the same slot of the cycle (the schedule repeats every cycle and nothing else
        interferes): replay that run's outcome (memo) when no event falls inside it."""
        self.probe = None
        if self.fast_forward and self.rlb is not None and not self.rounds and not self.draining \
                and not self.rlb.holding():
            key = (id(r.bundles), self.opera.slot_index(t))
            hit = self.memo.get(key)
            t_ev = self.events[0][0] if self.events else math.inf
            if hit is not None and t_ev > t + hit[0]:
                r.arrive = t + hit[1]
                self.stats["memo_rounds"] += 1
                self.park(r)
                return
            self.probe = (key, t, id(r))
        self.rounds.append(r)
        self.version += 1
        self.struct += 1

    def finish_round(self, r: _Round, t: float) -> None:
        """Every byte of ``r`` has left its source and every relayed byte its intermediate."""
        if self.rlb is not None:
            done = self.rlb.take_done(id(r))
            if done is not None:  # relayed bytes cross one more circuit hop
                bulk = r.bundles.kind == KIND_BULK
                r.arrive = max(r.arrive, done + float(r.bundles.latency[bulk].max()) + self.opera.hop_latency)
            if self.probe is not None and self.probe[2] == id(r):
                key, t0, _ = self.probe
                self.memo[key] = (t - t0, r.arrive - t0)
                self.probe = None
        self.park(r)

    def park(self, r: _Round) -> None:
        """The round's bytes are all sent: the next starts when its last byte arrives."""
        self.parked[id(r)] = r
        self.push(r.arrive, "round", id(r))

    def process_events(self, t: float) -> None:
        while self.events and self.events[0][0] <= t * (1 + 1e-12) + 1e-15:
            te, _, what, arg = heapq.heappop(self.events)
            te = max(te, t)
            self.probe = None  # anything else happening spoils a memo recording
            if what == "compute":
                self.finish_phase(arg, te)
            elif what == "begin":
                self.begin(self.waiting_rounds.pop(arg), te)
            else:
                r = self.parked.pop(arg)
                self.start_round(r.phase, r.index + 1, te)

    # ---- the live bundle set ----------------------------------------------------------------
    def build(self) -> None:
        """After a change of the live set: re-concatenate the rounds' live bundles when the
        rounds themselves changed (``struct``); bundles that finish later stay in place, marked
        ``gone``. Then look up the allocations cached for this live set."""
        if self.built == self.version:
            return
        self.built = self.version
        if self.struct_built != self.struct:
            self.struct_built = self.struct
            self.concat()
        sig = (self.layout, tuple(r.live.tobytes() for r in self.rounds))
        self.alloc = self.sig_cache.pop(sig, None) or {}
        self.sig_cache[sig] = self.alloc
        while len(self.sig_cache) > 64:
            self.sig_cache.popitem(last=False)
        self.pending_epoch = None

    def concat(self) -> None:
        """Concatenate the live bundles of all active rounds (global ids) and their entries."""
        if self.remaps:
            self.scatter_rem()
        self.layout = tuple((id(r.bundles), r.live.tobytes()) for r in self.rounds)
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
        self.alive = np.array([int(r.live.sum()) for r in self.rounds], dtype=np.int64)  # bundles not gone
        self.gone = np.zeros(self.n, dtype=bool)
        self.sub = np.full(self.n, -1, dtype=np.int64)  # global id -> bulk-local id
        self.sub[self.bulk] = np.arange(self.bulk.size)
        self.check_all = True  # the first completion check looks at every bundle (tiny ones)
        self.stages_cache = None
        if self.rlb is not None:
            self.bind_rotorlb()
        self.stats["bundles_max"] = max(self.stats["bundles_max"], self.n)

    def bind_rotorlb(self) -> None:
        """Hand RotorLB the bulk bundles with their NIC entries (bulk-local ids)."""
        N, bulk = self.net.hosts, self.bulk
        f, lk, cf = self.ent
        b = self.sub[f] if f.size else f
        up, down = (b >= 0) & (lk < N), (b >= 0) & (lk >= N) & (lk < 2 * N)
        keys = np.array([id(r) for r in self.rounds], dtype=np.int64)
        self.rlb.bind(self.a[bulk], self.c[bulk], self.members[bulk], keys[self.owner[bulk]],
                      (b[up], lk[up], cf[up]), (b[down], lk[down] - N, cf[down]), self.rem[bulk])

    def scatter_rem(self) -> None:
        """Write the concatenated remaining bytes back into the rounds."""
        for r, remap in zip(self.rounds, self.remaps):
            live = np.flatnonzero(r.live)
            r.rem[live] = self.rem[remap[live]]

    def stages(self) -> tuple:
        """Once per set of rounds: (stage-1 entries except per-epoch multi-hop ones, sorted by
        bundle, with each bundle's first entry; stage-2 fluid-VLB entries in bulk-local ids; each
        bulk bundle's circuit). Links of one class in every active round are one constraint: only
        the first of each class keeps its entries (a bundle that finishes leaves every link of
        its class alike, so they stay equal)."""
        if self.stages_cache is None:
            ent = self.ent
            self.rep_link = np.arange(self.L)  # each link's representative among equal ones
            if self.rounds and ent[0].size:
                classes = np.stack([r.bundles.classes for r in self.rounds], axis=1)
                _, first, inv = np.unique(classes, axis=0, return_index=True, return_inverse=True)
                self.rep_link[: self.below] = first[inv.ravel()]
                rep = np.ones(self.L, dtype=bool)
                rep[: self.below] = False
                rep[first] = True
                keep = rep[ent[1]]
                ent = (ent[0][keep], ent[1][keep], ent[2][keep])
            # pools bind only beside multi-hop flows; otherwise their residual is the circuits'
            one = cat([ent, self.circ] + ([self.pools] if self.low.size else []))
            order = np.argsort(one[0], kind="stable")
            one = tuple(x[order] for x in one)
            ptr = np.searchsorted(one[0], np.arange(self.n + 1))
            two = None
            if self.opera is not None and self.opera.vlb and self.rlb is None and self.bulk.size:
                sub = np.full(self.n, -1, dtype=np.int64)
                sub[self.bulk] = np.arange(self.bulk.size)
                k = sub[ent[0]] >= 0
                f, lk, cf = cat([(ent[0][k], ent[1][k], ent[2][k]), self.vlb])
                two = (sub[f], lk, cf)
            # bulk bundles by their circuit (only those of circuits up can move), and the others
            by_circ = self.circ[0][np.argsort(self.circ[1], kind="stable")]
            circ_ptr = np.searchsorted(np.sort(self.circ[1]), self.net0 + np.arange(self.opera.racks ** 2 + 1)) \
                if self.opera is not None else np.zeros(1, dtype=np.int64)
            others = np.flatnonzero(self.kind != KIND_BULK)
            self.stages_cache = (one, ptr, two, (by_circ, circ_ptr, others))
        return self.stages_cache

    def epoch_cap(self, epoch) -> np.ndarray:
        cap = self.cap.copy()
        if epoch is not None:
            cap[self.net0:] = self.opera.epoch_net_capacity(epoch)
        return cap

    def allocate(self, epoch) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, dict]:
        """(rate, fluid-VLB part of it, residual link capacities for slotted RotorLB, the bundles
        with a rate > 0, RotorLB's scratch for this allocation) per bundle in ``epoch`` (an Opera
        epoch index, or None on a static network or mesh); 0 for bundles gone.
        Stage 1 takes only the bundles that can move: a bulk bundle whose circuit is down would
        freeze at 0 at once, and leaves every link as it was."""
        hit = self.alloc.get(epoch)
        if hit is not None:
            return hit
        self.stats["allocations"] += 1
        n = self.n
        one, ptr, two, (by_circ, circ_ptr, others) = self.stages()
        cap = self.epoch_cap(epoch) if self.opera is not None else self.cap
        f = others
        if self.bulk.size:
            up = self.opera.up_circuits(epoch) if epoch is not None else np.arange(self.opera.racks ** 2)
            cnt = circ_ptr[up + 1] - circ_ptr[up]
            on = by_circ[np.arange(int(cnt.sum())) + np.repeat(circ_ptr[up] - (np.cumsum(cnt) - cnt), cnt)]
            f = np.concatenate([others, on])
        f = f[~self.gone[f]]
        counts = ptr[f + 1] - ptr[f]
        idx = np.arange(int(counts.sum())) + np.repeat(ptr[f] - (np.cumsum(counts) - counts), counts)
        ent = (one[0][idx], one[1][idx], one[2][idx])
        op = self.opera
        if op is None:
            rate = max_min_rates(n, *ent, cap)[0]
            out = (rate, np.zeros(n), None, np.flatnonzero(rate > 0), {})
            self.alloc[epoch] = out
            return out
        low = self.low[~self.gone[self.low]]
        if low.size:
            mem, lk = op.path_links(0 if epoch is None else epoch // 2, self.a[low], self.c[low])
            ent = cat([ent, (low[mem], lk, self.members[low][mem])])
        rate, res = max_min_rates(n, *ent, cap)
        vlb = np.zeros(n)
        if two is not None:
            if not self.low.size:  # pools were no constraint: their residual is their circuits'
                R = op.racks
                rc = res[self.net0:self.net0 + R * R].reshape(R, R)
                res[self.net0 + R * R:self.net0 + R * R + R] = rc.sum(axis=1)
                res[self.net0 + R * R + R:] = rc.sum(axis=0)
            bf, lk, cf = two
            keep = ~self.gone[self.bulk[bf]]
            vlb[self.bulk] = max_min_rates(self.bulk.size, bf[keep], lk[keep], cf[keep], res)[0]
            rate = rate + vlb
        if self.rlb is not None:  # links of one class share one residual: give it to each
            res[: self.below] = res[self.rep_link[: self.below]]
        out = (rate, vlb, res if self.rlb is not None else None, np.flatnonzero(rate > 0), {})
        self.alloc[epoch] = out
        return out

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> float:
        t = 0.0
        for i, w in enumerate(self.waiting):
            if w == 0:
                self.start(i, t)
        op, rlb = self.opera, self.rlb
        while True:
            self.build()
            if self.progress:
                self.report_progress(t)
            if self.n == 0 and (all(self.done) or not (rlb is not None and rlb.holding())):
                # (every phase done: bytes still held at an intermediate belong to no round)
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
            if self.fast_forward and self.n:
                if self.ff_mark is None or self.ff_mark[0] != self.version:
                    self.ff_mark = (self.version, t, self.rem.copy())
                elif t >= self.ff_mark[1] + op.cycle * (1 - 1e-12):
                    if self.skip_cycles(t, t_ev):
                        t = self.t_ff
                    self.ff_mark = (self.version, t, self.rem.copy())
                    continue
                t_mark = self.ff_mark[1] + op.cycle
            if self.n:
                rate, vlb, res, mv, scratch = self.allocate(epoch)
            else:  # only relayed bytes move
                rate, vlb, res, mv, scratch = (np.zeros(0), np.zeros(0), self.epoch_cap(epoch),
                                               np.zeros(0, dtype=np.int64), {})
            if self.pending_epoch is not None:
                mv = mv[~self.gone[mv]]
            r_mv = rate[mv]
            t_relay = math.inf
            if rlb is not None:
                ib, ix = rlb.rates(epoch, t_epoch - t, res, self.rem, self.bulk, scratch)
                if rlb.moving:
                    self.ff_mark = None  # RotorLB state changes: the next cycle need not repeat this one
                    t_mark = math.inf
                    if ib.size:  # add the indirect rates
                        gi = self.bulk[ib]
                        on = np.zeros(self.rem.size, dtype=bool)  # their union, sorted: a mask, not a sort
                        on[mv] = True
                        on[gi] = True
                        both = np.flatnonzero(on)
                        r2 = np.zeros(both.size)
                        r2[np.searchsorted(both, mv)] = r_mv
                        r2[np.searchsorted(both, gi)] += ix
                        mv, r_mv = both, r2
                    t_relay = rlb.next_done(t, [id(r) for r in self.draining])
            self.stats["steps"] += 1
            ttf = self.rem[mv] / r_mv  # only the bundles that move (a bulk bundle's circuit is up)
            if self.tv:
                # freed capacity waits for the epoch's end anyway: step to it, or to the moment a
                # whole round is done (the next round starts then: all its bundles left move)
                t_done = math.inf
                if mv.size:
                    own = self.owner[mv]
                    seg = np.flatnonzero(np.r_[True, own[1:] != own[:-1]])
                    whole = self.alive[own[seg]] == np.diff(np.r_[seg, mv.size])
                    if whole.any():
                        t_done = t + float(np.maximum.reduceat(ttf, seg)[whole].min())
                t_next = min(t_done, t_ev, t_epoch, t_mark, t_relay)
            else:
                t_next = min(t + float(ttf.min(initial=math.inf)), t_ev)
            if not math.isfinite(t_next):
                stuck = sorted({self.phases[self.rounds[int(o)].phase].name for o in self.owner})
                raise RuntimeError(f"simulation stalled at t = {t:.6g} s: flows of {stuck} get no bandwidth")
            dt = t_next - t
            if dt <= 0 and t_ev > t and mv.size:
                # the next completion lies below the clock's resolution at t (t + ttf == t in
                # float): move its bytes anyway, or the loop would never make progress
                dt = float(ttf.min())
            planned = r_mv * dt
            rem_mv = self.rem[mv]
            sent = np.minimum(rem_mv, planned)
            self.rem[mv] = rem_mv - sent
            if rlb is not None:
                bl = self.sub[mv]
                keep = bl >= 0
                rlb.advance(t, dt, bl[keep], sent[keep], planned[keep])
            self.complete(t, ttf, dt, vlb, epoch, mv)
            if self.draining:
                self.settle(t_next)
            t = t_next
            self.process_events(t)
        if not all(self.done):
            stuck = [self.phases[i].name for i in range(len(self.phases)) if not self.done[i]]
            raise ValueError(f"schedule never finishes phases {stuck}: check their 'after' dependencies")
        self.t_end = t
        if self.progress:
            self.report_progress(t, final=True)
        return max((tm.end for tm in self.timing), default=0.0)

    def settle(self, t: float) -> None:
        """Finish the rounds whose last relayed byte has left its intermediate."""
        still = []
        for r in self.draining:
            if self.rlb.pending(id(r)):
                still.append(r)
            else:
                self.finish_round(r, t)
        self.draining = still

    def report_progress(self, t: float, final: bool = False) -> None:
        """A line on stderr every ``progress`` seconds of wall time: simulated time, phases done."""
        now = time.perf_counter()
        if final or now - self.wall0 >= self.wall_next:
            self.wall_next = now - self.wall0 + self.progress
            print(f"simulate: {t * 1e3:,.1f} ms simulated, {sum(self.done)}/{len(self.done)} phases done, "
                  f"{now - self.wall0:.0f} s", file=sys.stderr, flush=True)

    def skip_cycles(self, t: float, t_ev: float) -> bool:
        """Fast-forward (Opera). The live set has not changed for a whole cycle, and allocations
        depend only on the live set and the epoch: the next cycles repeat the one just simulated
        epoch by epoch, byte for byte. Skip as many as leave every bundle, and the next event, a
        cycle's margin; exact, not an average."""
        op = self.opera
        per_cycle = self.ff_mark[2] - self.rem
        with np.errstate(divide="ignore", invalid="ignore"):
            cycles = np.where(per_cycle > 0, self.rem / per_cycle, math.inf)
        opens = math.inf
        if self.rlb is not None:  # RotorLB was idle all cycle: stop before an intermediate may accept
            if self.rlb.holding():
                return False
            opens = self.rlb.cycles_until_open(self.rem[self.bulk], per_cycle[self.bulk])
        k = math.floor(min(float(cycles.min()), (t_ev - t) / op.cycle, opens)) - 1
        if k < 1:
            return False
        self.rem = np.maximum(self.rem - per_cycle * k, 0.0)
        if self.rlb is not None:
            self.rlb.resync(self.rem[self.bulk])
        self.stats["ff_cycles"] += k
        self.t_ff = t + k * op.cycle
        return True

    def complete(self, t: float, ttf: np.ndarray, dt: float, vlb: np.ndarray, epoch, mv: np.ndarray) -> None:
        """Retire bundles whose bytes were all sent in [t, t + dt) (bundle mv[i] at t + ttf[i];
        only the bundles ``mv`` moved). On a static network the rest are re-allocated at once; on
        Opera the freed capacity waits for the epoch's end (at most a few microseconds), which
        bounds re-allocations by epochs instead of completions."""
        fin = ((self.rem[mv] <= self.tol[mv]) | (ttf <= dt)) & ~self.gone[mv]
        g, done_at = mv[fin], t + np.minimum(ttf[fin], dt)
        if self.check_all:  # bundles too small to count, that never moved
            self.check_all = False
            tiny = np.flatnonzero((self.rem <= self.tol) & ~self.gone)
            tiny = np.setdiff1d(tiny, g)
            g, done_at = np.r_[g, tiny], np.r_[done_at, np.full(tiny.size, t)]
        if not g.size:
            return
        op = self.opera
        self.gone[g] = True
        self.alive -= np.bincount(self.owner[g], minlength=self.alive.size)
        # a bundle still on fluid VLB at its end waits an extra hop and for the intermediate's circuit
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
            elif self.rlb is not None and self.rlb.pending(id(r)):
                self.draining.append(r)
            else:
                self.finish_round(r, t + dt)
        if len(still) < len(self.rounds):
            self.remaps = [m for r, m in zip(self.rounds, self.remaps) if r.live.any()]
            self.rounds = still
            self.struct += 1
        self.version += 1
