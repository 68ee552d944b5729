"""RotorLB slot by slot: Opera's two-hop load balancing of bulk traffic, where a relayed byte waits
at its intermediate rack until that rack's own circuit to the destination comes up.

The simulator uses it for ``OperaNetwork(rotorlb="slotted")`` (the default). Opera's RotorLB
(Mellette et al., NSDI'20, after RotorNet's): per slot a ToR (1) sends the relayed traffic it
holds for the racks it is connected to now, and its own traffic for them, directly; (2) offers
what is left of its own traffic to the racks it is connected to, which accept, per final
destination, what they can deliver to it in their next slot. The model, per engine step (within
one rotor epoch, so the circuits up are fixed; rates are constant in a step):

1. direct: the fluid allocation of every flow (``max_min_rates`` over NICs, circuits up, ...),
   cached per live set and epoch; RotorLB uses what it leaves (its residual capacities);
2. relay: bytes held at rack c for rack R leave over c -> R while that circuit is up, on its
   residual; the circuits bringing relays into R share the NIC residual of R's hosts that have
   relayed bytes coming;
3. indirect: every bulk bundle with bytes left offers its hosts' NIC residual (split evenly over
   the member flows of all offering bundles on that host) to the circuits its rack has up now, in
   proportion to each one's spare capacity (residual after relays, capped by the acceptance rate
   below), towards every intermediate c that accepts for its destination rack R:
       accept(c, R) = B W - held(c, R) - (c's own bulk bytes left for R)
   bytes, one direct window W of c -> R (a rate: accept / the epoch's time left). Offers above a
   circuit's spare capacity, then above an acceptance, are scaled down (propose / accept, one
   round per step; what is refused is offered again in the next step). Accepted bytes join
   held(c, R) and cost the source's NIC and the a -> c circuit now, the c -> R circuit and the
   destination's NIC later: the bandwidth tax is paid explicitly.

Direct traffic is served before relayed traffic here (RotorLB serves relayed bytes first); they
compete only on circuits that carry both, and acceptance keeps what is held within a window.

Completion: a round is delivered when its bundles have sent everything and every byte it relayed
has left its intermediate. Per queue (c, R) the model counts bytes in and out (FIFO); per round it
keeps the 'in' count after its last byte joined each queue, and the round is done when 'out'
passes every such mark (at the exact moment, interpolated within the step).
"""
from __future__ import annotations

import math

import numpy as np

from .opera import OperaNetwork

__all__ = ["RotorLB", "htsim_ring_round"]

Entries = tuple[np.ndarray, np.ndarray, np.ndarray]


class RotorLB:
    """RotorLB state of one simulation: relayed bytes held per (intermediate, destination rack)."""

    def __init__(self, net: OperaNetwork) -> None:
        R, N = net.racks, net.hosts
        self.net, self.R, self.N = net, R, N
        self.net0 = net.first_net_link
        self.window_bytes = net.host_bandwidth * net.window
        self.rack_of = net.rack_of
        self.tol_bytes = 1e-6
        self.tol_rate = 1e-9 * net.host_bandwidth
        self.held = np.zeros(R * R)
        """Bytes held at rack c for rack R, at c * R + R."""
        self.inn = np.zeros(R * R)
        self.out = np.zeros(R * R)
        self.held_host = np.zeros(N)
        """Relayed bytes on their way to each destination host (which NICs relays share)."""
        self.marks: dict[int, np.ndarray] = {}
        """Round key -> per queue the 'in' count after its last byte joined (0: none)."""
        self.done_at: dict[int, float] = {}
        """Round key -> when its last relayed byte so far left its intermediate."""
        self.bind(*(np.zeros(0, dtype=np.int64),) * 2, np.zeros(0), np.zeros(0, dtype=np.int64),
                  _empty(), _empty(), np.zeros(0))
        self._drain: tuple | None = None
        self._trip: tuple | None = None

    # ---- the live bulk bundles (once per live set) --------------------------------------------
    def bind(self, a: np.ndarray, c: np.ndarray, members: np.ndarray, keys: np.ndarray, src: Entries,
             dst: Entries, rem: np.ndarray) -> None:
        """The bulk bundles of the live rounds, ids 0..nb-1: source rack ``a``, destination rack
        ``c``, member flows, their round's key, their NIC entries (bundle, host, members on it) at
        the sources (``src``) and destinations (``dst``), and their bytes left per member."""
        self.nb = int(a.size)
        self.ga, self.gc, self.m, self.keys = a, c, members, keys
        self.pair = a * self.R + c
        self._src_raw, self._dst_raw = src, dst
        self._src = self._dst = None
        order = np.argsort(a, kind="stable")  # bundles by source rack
        self.by_rack, self.rack_ptr = order, np.searchsorted(a[order], np.arange(self.R + 1))
        self.resync(rem)

    def resync(self, rem: np.ndarray) -> None:
        """Recount each rack pair's bulk bytes left (``rem``: per member, every bulk bundle)."""
        self._left = np.bincount(self.pair, self.m * rem, minlength=self.R * self.R)
        self._sent: list[tuple[np.ndarray, np.ndarray]] = []

    @property
    def left(self) -> np.ndarray:
        """Bulk bytes each rack pair has left to send (a * R + c), bytes sent since last asked
        taken off (they are booked lazily: most steps never ask)."""
        if self._sent:
            pairs, nbytes = (np.concatenate(x) for x in zip(*self._sent))
            self._left -= np.bincount(pairs, nbytes, minlength=self.R * self.R)
            self._sent = []
        return self._left

    def _src_sorted(self) -> tuple:
        """Source NIC entries sorted by bundle, and where each bundle's start (built lazily: most
        sets of rounds never offer anything)."""
        if self._src is None:
            self._src = _by_bundle(self._src_raw, self.nb)
        return self._src

    def _dst_sorted(self) -> tuple:
        if self._dst is None:
            self._dst = _by_bundle(self._dst_raw, self.nb)
        return self._dst

    # ---- queries ------------------------------------------------------------------------------
    def holding(self) -> bool:
        """Whether any relayed byte is still held at an intermediate: a queue's bytes above the
        float residue of what went through it (``held`` is joined minus drained, so after
        hundreds of MB a queue that has emptied can keep a few micro-bytes: the relative term)."""
        return bool(self.marks) or bool((self.held > self.tol_bytes + 1e-9 * self.inn).any())

    def pending(self, key: int) -> bool:
        """Whether round ``key`` still has relayed bytes held somewhere."""
        mk = self.marks.get(key)
        if mk is None:
            return False
        if (mk > self.out + self.tol_bytes + 1e-9 * mk).any():
            return True
        del self.marks[key]
        return False

    def take_done(self, key: int) -> float | None:
        """When round ``key``'s last relayed byte left its intermediate (None: it relayed none)."""
        self.pending(key)
        return self.done_at.pop(key, None)

    def next_done(self, t: float, keys: list[int]) -> float:
        """The earliest moment one of the rounds ``keys`` (all sent) gets its last relayed byte
        out at the current drain rates (inf if one of its queues is not draining now)."""
        if self._drain is None or not keys:
            return math.inf
        idx, dr = self._drain[0], self._drain[1]
        rate = np.zeros(self.R * self.R)
        rate[idx] = dr
        best = math.inf
        for key in keys:
            mk = self.marks.get(key)
            if mk is None:
                continue
            p = np.flatnonzero(mk > self.out + self.tol_bytes + 1e-9 * mk)
            if p.size and (rate[p] > 0).all():
                best = min(best, t + float(((mk[p] - self.out[p]) / rate[p]).max()))
        return best

    def cycles_until_open(self, rem: np.ndarray, per_cycle: np.ndarray) -> float:
        """Whole cycles until an intermediate first accepts for a rack it accepts nothing for now
        (its own bytes for the rack fall below a window), bulk bytes left ``rem`` falling by
        ``per_cycle`` a cycle: fast-forward must stop before RotorLB may start relaying."""
        if self.nb == 0:
            return math.inf
        n = self.R * self.R
        left = np.bincount(self.pair, self.m * rem, minlength=n)
        fall = np.bincount(self.pair, self.m * per_cycle, minlength=n)
        closed = (left - self.window_bytes > self.tol_bytes) & (fall > 0)
        if not closed.any():
            return math.inf
        return float(((left[closed] - self.window_bytes) / fall[closed]).min())

    # ---- one step -------------------------------------------------------------------------------
    def rates(self, epoch: int, tau: float, res: np.ndarray, rem: np.ndarray, bulk: np.ndarray,
              scratch: dict) -> tuple[np.ndarray, np.ndarray]:
        """Indirect rates for a step in ``epoch`` with ``tau`` seconds left in it: (bulk bundles,
        rate per member of each), given the direct allocation's residual capacities ``res``
        (every link; NICs un-deduplicated) and bytes left per member ``rem`` of the engine's
        bundles (bulk bundle b is ``bulk[b]`` there; 0 once gone). Also sets the relay drains the
        next ``advance`` applies; ``moving`` tells whether anything moves. ``scratch``: a dict
        that lives as long as the allocation ``res`` (what depends on it alone is kept there)."""
        R, N = self.R, self.N
        self._drain = self._trip = None
        none = (np.zeros(0, dtype=np.int64), np.zeros(0))
        held = self.held
        if not (self.marks or held.any()):  # nothing held: the spare circuits are the allocation's
            if "spare" not in scratch:
                up = self.net.up_circuits(epoch)
                circ = res[self.net0 + up]
                sp = np.flatnonzero(circ > self.tol_rate)
                scratch["spare"] = (up[sp], circ[sp])
            if not scratch["spare"][0].size:
                return none
        up = self.net.up_circuits(epoch)
        circ = res[self.net0 + up]
        if self.marks or held.any():
            act = np.flatnonzero(held[up] > self.tol_bytes)
            if act.size:
                cap = circ[act]
                dR = up[act] % R
                hosts = np.flatnonzero(self.held_host > self.tol_bytes)
                down = res[N:2 * N]
                dstcap = np.bincount(self.rack_of[hosts], down[hosts], minlength=R)
                tot = np.bincount(dR, cap, minlength=R)
                with np.errstate(divide="ignore", invalid="ignore"):
                    scale = np.where(tot > dstcap, dstcap / tot, 1.0)
                dr = cap * scale[dR]
                circ[act] -= dr
                keep = dr > self.tol_rate
                if keep.any():
                    self._drain = (up[act][keep], dr[keep], down)
        if self.nb == 0 or tau <= 0:
            return none
        # intermediates connected now over a spare circuit, and the racks each accepts for: one
        # window of c -> R less what c holds and still has of its own for R
        sp = np.flatnonzero(circ > self.tol_rate)
        if not sp.size:
            return none
        spu = up[sp]
        sa, sc, sv = spu // R, spu % R, circ[sp]
        accept = (self.window_bytes - held - self.left).reshape(R, R)
        opened = accept > self.tol_bytes
        np.fill_diagonal(opened, False)
        use = opened.any(axis=1)[sc]
        if not use.any():
            return none
        sa, sc, sv = sa[use], sc[use], sv[use]
        # which bundles may offer: bytes left, and an accepting intermediate for their rack
        racks = np.flatnonzero(np.bincount(sa, minlength=R))
        reach = np.zeros((R, R), dtype=bool)  # sa is sorted: OR the rows of each source rack
        reach[racks] = np.logical_or.reduceat(opened[sc], np.searchsorted(sa, racks))
        e, _ = _ragged(self.rack_ptr, racks)
        g = self.by_rack[e]
        g = np.sort(g[reach[self.ga[g], self.gc[g]] & (rem[bulk[g]] > self.tol_bytes)])
        if not g.size:
            return none
        # each host's NIC residual, split evenly over the member flows that offer on it
        sb, sh, sn, ptr = self._src_sorted()
        e, cnt = _ragged(ptr, g)
        load = np.bincount(sh[e], sn[e], minlength=N)
        capb = np.minimum.reduceat(res[sh[e]] / load[sh[e]], np.cumsum(cnt) - cnt)
        ok = capb > self.tol_rate
        g, capb = g[ok], capb[ok]
        if not g.size:
            return none
        # every (bundle, usable circuit of its rack) pair; usable circuits are sorted by source rack
        ka = np.bincount(sa, minlength=R)
        offs = np.cumsum(ka) - ka
        kg = ka[self.ga[g]]
        rep = np.repeat(np.arange(g.size), kg)
        j = np.arange(rep.size) - np.repeat(np.cumsum(kg) - kg, kg) + np.repeat(offs[self.ga[g]], kg)
        code = sc[j] * R + self.gc[g][rep]
        ok = opened.ravel()[code]
        rep, j, code = rep[ok], j[ok], code[ok]
        if not rep.size:
            return none
        acc = accept.ravel()[code] / tau
        wt = np.minimum(sv[j], acc)
        denom = np.bincount(rep, wt, minlength=g.size)
        p = self.m[g][rep] * capb[rep] * wt / denom[rep]
        P = np.bincount(j, p, minlength=sv.size)
        f1 = np.ones(sv.size)
        np.divide(sv, P, out=f1, where=P > sv)
        q = p * f1[j]
        total = np.bincount(code, q, minlength=R * R)
        x = q * np.minimum(1.0, acc / total[code])
        keep = x > 0
        if not keep.any():
            return none
        rep, code, x = rep[keep], code[keep], x[keep]
        per = np.bincount(rep, x, minlength=g.size)
        some = np.flatnonzero(per > 0)
        self._trip = (g[rep], code, x, g[some], per[some], self.keys[g[rep]])
        return g[some], per[some] / self.m[g[some]]

    @property
    def moving(self) -> bool:
        """Whether the last ``rates`` relays or drains anything."""
        return self._drain is not None or self._trip is not None

    def advance(self, t: float, dt: float, moved: np.ndarray, sent: np.ndarray, planned: np.ndarray) -> None:
        """Apply the step [t, t + dt): drains leave their queues, accepted bytes join theirs.
        ``moved``: the bulk bundles that sent bytes, ``sent`` of the ``planned`` bytes per member
        (short when a bundle ran out during the step)."""
        R, N = self.R, self.N
        if moved.size:
            self._sent.append((self.pair[moved], self.m[moved] * sent))
            if len(self._sent) > 256:
                self.left  # noqa: B018 (books them)
        if self._drain is not None:
            idx, dr, down = self._drain
            q0, x0 = self.held[idx], self.out[idx]
            gone = np.minimum(dr * dt, q0)
            self.held[idx] = q0 - gone
            self.out[idx] = x0 + gone
            empty = idx[self.held[idx] <= self.tol_bytes]
            self.held[empty] = 0.0
            self.out[empty] = self.inn[empty]
            # relayed bytes reach the hosts that wait for them, in proportion to their NIC residual
            arrived = np.bincount(idx % R, gone, minlength=R)
            hosts = np.flatnonzero(self.held_host > self.tol_bytes)
            if hosts.size:
                rk = self.rack_of[hosts]
                wt = down[hosts]
                tot = np.bincount(rk, wt, minlength=R)
                with np.errstate(divide="ignore", invalid="ignore"):
                    share = np.where(tot[rk] > 0, arrived[rk] * wt / tot[rk], 0.0)
                self.held_host[hosts] = np.maximum(self.held_host[hosts] - share, 0.0)
                still = self.held.reshape(R, R).sum(axis=0) > self.tol_bytes
                self.held_host[hosts[~still[rk]]] = 0.0
            for key, mk in self.marks.items():
                m = mk[idx]
                hit = (m > x0 + self.tol_bytes) & (m <= self.out[idx] + self.tol_bytes + 1e-9 * m)
                if hit.any():
                    at = t + np.minimum((m[hit] - x0[hit]) / dr[hit], dt)
                    self.done_at[key] = max(self.done_at.get(key, t), float(at.max()))
        if self._trip is not None:
            bund, code, x, ub, per, keys = self._trip
            frac = np.ones(self.nb)
            frac[moved] = np.where(planned > 0, sent / np.where(planned > 0, planned, 1.0), 0.0)
            xb = x * dt * frac[bund]
            add = np.bincount(code, xb, minlength=R * R)
            self.held += add
            self.inn += add
            # the bundles' relayed bytes head for their destination hosts, split by members
            db, dh, dn, ptr = self._dst_sorted()
            e, cnt = _ragged(ptr, ub)
            self.held_host += np.bincount(dh[e], np.repeat(per * dt * frac[ub] / self.m[ub], cnt) * dn[e],
                                          minlength=N)
            rounds = keys[:1] if (keys == keys[0]).all() else np.unique(keys)  # mostly one round
            for key in rounds.tolist():
                mk = self.marks.get(key)
                if mk is None:
                    mk = self.marks[key] = np.zeros(R * R)
                cs = code[(keys == key) & (xb > 0)]
                mk[cs] = self.inn[cs]


def _by_bundle(e: Entries, nb: int) -> tuple:
    """Entries sorted by bundle, and each bundle's first entry (bundle b: ptr[b]:ptr[b + 1])."""
    order = np.argsort(e[0], kind="stable")
    b, h, n = (x[order] for x in e)
    return b, h, n, np.searchsorted(b, np.arange(nb + 1))


def _ragged(ptr: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the entries of bundles ``g`` (each bundle's run ptr[b]:ptr[b + 1], in order),
    and how many each has."""
    cnt = ptr[g + 1] - ptr[g]
    return np.arange(int(cnt.sum())) + np.repeat(ptr[g] - (np.cumsum(cnt) - cnt), cnt), cnt


def _empty() -> Entries:
    e = np.zeros(0, dtype=np.int64)
    return e, e, np.zeros(0)


# ---- htsim's RotorLB planner, host by host, for the rounds of a ring all-reduce ----------------
HTSIM_PAYLOAD, HTSIM_HEADER = 1436, 64
"""htsim's RLB packet: payload and header bytes (``RlbModule``: ``_mss``, ``_hdr``)."""


def htsim_ring_round(net: OperaNetwork, flow_bytes: float, rounds: int = 3, accept_factor: int = 2) -> float:
    """Seconds per dependent round of a ring all-reduce (host h sends ``flow_bytes`` to h + 1, the
    next round when all have arrived) under htsim's RotorLB planner, on an otherwise idle network.

    The study's Opera htsim (usc-isi/STEAM-FlexFlow, branch 2024-euromlsys, ``ffsim-opera-v2/``;
    read, not copied) runs every flow on RotorLB (``-cutoff 0``). ``RlbSrc::startflow`` (rlb.cpp)
    puts a flow's packets at once into its host's queue for the destination host (one FIFO per
    destination: concurrent flows to it share it). ``RlbMaster::newMatching`` (rlbmodule.cpp)
    plans at every superslice boundary, for the rotor that just reconfigured, what each host of
    rack a sends to the rack c it is now connected to during that matching (``slot_time`` =
    (u-1) S + eps, each host at 1/u of its NIC: ``max_pkts`` packets): (1) relayed packets it
    holds for c's hosts, at most max_pkts/d per destination host; (2) its own packets for c's
    hosts; (3) proposals of its other own packets, same-rack destinations included (RotorLB has
    no intra-rack path); c's hosts accept per final destination up to 2 max_pkts/d minus what they
    hold for it (``phase2``, the "factor of two" its comment says may delay traffic by a cycle),
    within their receive capacity. Packets sent in a matching reach c during it, so they can only
    be relayed at a later matching of c with the destination rack. ``FFRingAllreduce``
    (ffapp.cpp, ``ar_finish_ring``) starts the next round when all N flows have finished.

    Emulated here in packet counts per superslice boundary (integer fair shares, the remainders to
    the first hosts where htsim draws them at random; a sender's packets spread evenly over its
    slot; the rotor schedule is ``net``'s). Returns the mean of rounds 2..``rounds`` (the first
    starts at a boundary on an idle network). ``accept_factor`` 1 drops the factor of two."""
    if not net.time_varying:
        raise ValueError("htsim_ring_round needs a time-varying Opera network (racks > uplinks)")
    if rounds < 2:
        raise ValueError(f"htsim_ring_round: rounds must be >= 2, got {rounds}")
    R, d, u = net.racks, net.hosts_per_rack, net.uplinks
    H, S = R * d, net.superslice
    slot = net.window
    pkt_rate = net.host_bandwidth * HTSIM_PAYLOAD / (HTSIM_PAYLOAD + HTSIM_HEADER) / HTSIM_PAYLOAD
    max_pkts = int(pkt_rate / u * slot)
    fixed, room_cap = max_pkts // d, accept_factor * max_pkts // d
    flow_pkts = max(1, math.ceil(flow_bytes / HTSIM_PAYLOAD))
    hosts = np.arange(H).reshape(R, d)
    succ = (np.arange(H) + 1) % H
    own = np.zeros(H, dtype=np.int64)  # packets queued at each host for its successor
    held = np.zeros((H, H), dtype=np.int64)  # relayed packets held at host i for final host l
    arriving: dict[int, list] = {}  # boundary -> (host, final, packets) reaching a queue by then
    ends, k, start = [], 0, 0.0
    while len(ends) < rounds:
        own[:] = flow_pkts
        left, last = H * flow_pkts, start
        k = max(k, math.ceil(start / S - 1e-9))
        while left:
            for i, l, n in arriving.pop(k, ()):
                np.add.at(held, (i, l), n)
            part = net.partner[net.matching_at(k % u, k)]
            ra = np.flatnonzero(part != np.arange(R))
            ha, hc = hosts[ra], hosts[part[ra]]  # (m, d): hosts of each rack a and of its new c
            t0 = k * S
            send = np.full(H, max_pkts, dtype=np.int64)
            recv = np.full(H, max_pkts, dtype=np.int64)
            sent = []
            # (1) relays held at a's hosts for c's hosts
            n1 = np.minimum(held[ha[:, :, None], hc[:, None, :]], fixed)
            held[ha[:, :, None], hc[:, None, :]] -= n1
            send[ha] -= n1.sum(2)
            recv[hc] -= n1.sum(1)
            sent.append(n1[n1 > 0])
            # (2) own packets for a host of c (the ring step that crosses into c)
            fa = succ[ha]
            direct = fa // d == part[ra][:, None]
            n2 = np.where(direct, np.minimum(np.minimum(own[ha], send[ha]), recv[fa]), 0)
            own[ha] -= n2
            send[ha] -= n2
            np.subtract.at(recv, fa[direct], n2[direct])
            sent.append(n2[n2 > 0])
            # (3) proposals, and c's hosts accept up to room_cap per final less what they hold
            prop = np.where(direct, 0, np.minimum(own[ha], send[ha]))
            mine = np.where(succ[hc][:, None, :] == fa[:, :, None], own[hc][:, None, :], 0)
            room = np.maximum(room_cap - held[hc[:, None, :], fa[:, :, None]] - mine, 0)
            acc = np.swapaxes(_fair(np.swapaxes(np.minimum(prop[:, :, None], room), 1, 2), recv[hc]), 1, 2)
            take = np.minimum(acc.sum(2), np.minimum(own[ha], send[ha]))
            n3 = _split(acc, take)
            own[ha] -= n3.sum(2)
            m, j, i = np.nonzero(n3)
            if m.size:  # packet q of a sender planned at rate acc reaches c at q slot / acc
                n, rate = n3[m, j, i], acc[m, j, i]
                src, dst = ha[m, j], hc[m, i]
                before = np.zeros_like(n)
                for q in range(u + 1):
                    upto = np.minimum(n, np.ceil((q + 1) * S * rate / slot - 1e-9).astype(np.int64))
                    new = upto - before
                    if new.any():
                        arriving.setdefault(k + 1 + q, []).append((dst[new > 0], succ[src][new > 0], new[new > 0]))
                    before = upto
            done = np.concatenate(sent)
            if done.size:  # delivered: a sender's last packet (n - 1) / n into its slot
                left -= int(done.sum())
                last = max(last, t0 + float((slot * (done - 1) / done).max()))
            k += 1
        start = last + 2 * net.hop_latency
        ends.append(start)
    return (ends[-1] - ends[0]) / (rounds - 1)


def _fair(demand: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Integer max-min shares of ``demand`` (..., n) under ``cap`` (...) by water-filling, the
    remainders one each to the first elements still short (htsim: ``fairshare1d`` with extra)."""
    out = np.zeros_like(demand)
    c = cap.astype(np.int64).copy()
    for _ in range(demand.shape[-1] + 1):
        short = demand > out
        na = short.sum(-1)
        give = np.where(short, np.minimum(demand - out, (c // np.maximum(na, 1))[..., None]), 0)
        if not give.any():
            break
        out += give
        c -= give.sum(-1)
    short = demand > out
    return out + (short & (np.cumsum(short, -1) <= c[..., None]))


def _split(acc: np.ndarray, take: np.ndarray) -> np.ndarray:
    """``take`` (...) packets split over the senders in proportion to their planned ``acc``
    (..., n), in integers (largest remainders first): htsim fills a commit queue by send time."""
    tot = acc.sum(-1)
    share = acc * (take / np.maximum(tot, 1))[..., None]
    out = np.floor(share).astype(np.int64)
    rank = np.argsort(np.argsort(out - share, axis=-1), axis=-1)  # largest remainder first
    return out + ((rank < (take - out.sum(-1))[..., None]) & (acc > out))
