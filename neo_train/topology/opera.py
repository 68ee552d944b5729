"""Opera (Mellette et al., NSDI'20): racks joined by rotor circuit switches whose matchings rotate.

    net = OperaNetwork.from_nodes(128)      # 32 racks x 4 hosts, k = 8: u = d = 4 rotors
    net.superslice, net.cycle, net.h_max, net.describe()

Structure (shared/notes/network-model.md):
- N_r racks (top-of-rack switches), each with u uplinks, one to each of u rotor switches, and d
  hosts. The complete graph on the racks, self-loops included, is split into N_r symmetric
  matchings (a random one-factorization, ``random_matchings``), so every rack pair, and every
  rack with itself, appears in exactly one matching. Self-loop slots carry no traffic. (Algebraic
  families such as a <-> (j - a) mod N_r or a <-> a XOR j are poor expanders: a few of them span
  only a ring or a subgroup.)
- Rotor b owns N_r/u matchings. It holds each for u-1 superslices and reconfigures in the next,
  rotors offset by one so exactly one reconfigures per superslice; a cycle is N_r superslices and
  gives every rack pair one direct circuit. The assignment of matchings to rotors is the best of
  ``tries`` random ones: smallest worst-case, then mean, hop count of the per-superslice expander
  (the u-1 rotors not reconfiguring). Found here: h_max 7 at 32 racks (u = 4: a degree-3
  expander), 4 at 128 racks (u = 8).
- Superslice S = eps + delta + r with r the reconfiguration delay, delta = t_L + t_pkt,
  eps = (h_max - 1)(t_L + q t_pkt) + (q - 1) t_pkt (``superslice_timing``).
- When N_r == u every rotor owns one matching and never reconfigures: a static full mesh.

Flow model (used by ``simulator``), per rotor epoch (two per superslice: the first r + delta with
the reconfiguring rotor down, the rest with all up; a circuit's window per cycle is therefore
(u-1) S + eps, the notes' W):
- bulk flows (bytes >= ``bulk_threshold``) go direct, over their rack pair's circuit, only while it
  is up. With ``vlb`` they also use RotorLB's two-hop paths, in one of two models (``rotorlb``):
  ``"slotted"`` (default; ``rotorlb.py``): epoch by epoch, what direct traffic leaves of the
  circuits that are up carries a rack's bulk bytes to the racks it is connected to now, in
  proportion to the spare capacity of each, accepted by an intermediate c for destination rack R
  only up to one window of c -> R minus what c already holds and still has of its own for R; the
  relayed bytes wait at c until c's circuit to R comes up. Bulk rounds start at superslice
  boundaries (RotorLB plans per slot). ``"fluid"``: a VLB byte costs its source rack's uplinks and
  its destination rack's downlinks 2 bytes each (its own hop plus, on average, another rack's
  transit hop: exact for symmetric load) on what direct traffic leaves, wherever the circuits
  are, and its last byte arrives ``vlb_delay`` = T_c/(u+1) late (the earliest of u intermediates'
  circuits, each uniform over a cycle). The two agree on uniform all-to-all traffic (no circuit
  has spare capacity, nothing is relayed); they differ for permutation-like traffic such as a
  ring step, where the fluid model spreads one flow over every spare uplink at once and charges
  a fixed average wait, while a relayed byte really waits for its intermediate's circuit (up to a
  cycle): a dependent ring step costs about a cycle in the slotted model. A static mesh
  (N_r == u) never waits for circuits: it always uses the fluid model;
- low-latency flows (bytes < ``bulk_threshold``) take the shortest path in the current
  superslice's expander, paying one circuit hop per rack-to-rack link (the bandwidth tax).
Links: one circuit per ordered rack pair (capacity B while up, else 0), plus per rack an uplink
pool U_a and a downlink pool D_a (B times the rack's non-self circuits up). Direct and multi-hop
flows load the pools too (the simulator derives them from the circuits' residuals when no
multi-hop flow is live), so fluid VLB sees only what they leave.
"""
from __future__ import annotations

import math
import random

import numpy as np

from .network import GBPS, Network

__all__ = ["OperaNetwork", "OPERA_PRESETS", "ROTORLB_MODELS", "superslice_timing", "random_matchings",
           "hop_distances"]

ROTORLB_MODELS = ("slotted", "fluid")

OPERA_PRESETS: dict[int, tuple[int, int]] = {16: (4, 8), 128: (32, 8), 1024: (128, 16)}
"""nodes -> (racks N_r, ToR ports k) of the ISI study; u = d = k/2."""


def superslice_timing(h_max: int, bandwidth: float, reconfig_delay: float = 10e-6, link_delay: float = 0.5e-6,
                      queue_packets: int = 8, packet_bytes: int = 1500) -> tuple[float, float, float]:
    """(S, eps, delta) in seconds; ``bandwidth`` in bytes/s (t_pkt = packet_bytes / bandwidth)."""
    t_pkt = packet_bytes / bandwidth
    delta = link_delay + t_pkt
    eps = (h_max - 1) * (link_delay + queue_packets * t_pkt) + (queue_packets - 1) * t_pkt
    return eps + delta + reconfig_delay, eps, delta


def random_matchings(n: int, rng: random.Random) -> np.ndarray:
    """(n, n) partners of n symmetric matchings of n racks in which every unordered pair {a, c},
    a == c included, lies in exactly one: a random colouring of the complete graph with self-loops
    by n colours, each rack meeting every colour once (a self-loop uses its colour at one rack).

    Even n: hill-climbing with the loops as edges, so self-loops land spread over many matchings
    (one matching of all self-loops would leave some superslices' expanders with too few links to
    be connected). Odd n: a random one-factorization of K_{n+1} whose extra vertex's partners
    become self-loops, one per matching (the loop walk stalls on odd n: every matching must hold
    exactly one loop). A stalled walk restarts.
    """
    if n == 1:
        return np.zeros((1, 1), dtype=np.int64)
    for _ in range(200):
        if n % 2 == 0:
            at = _hill_climb(n, rng, loops=True)
            if at is not None:
                return at
        else:
            at = _hill_climb(n + 1, rng, loops=False)
            if at is not None:
                a = np.arange(n)
                return np.where(at[:, :n] == n, a[None, :], at[:, :n])
    raise RuntimeError(f"opera: could not colour the complete graph on {n} racks")  # pragma: no cover


def _hill_climb(n: int, rng: random.Random, loops: bool) -> np.ndarray | None:
    """Dinitz and Stinson's hill-climbing for one-factorizations: pick a vertex x missing colour c
    and one of its uncoloured edges xy (with ``loops``, y == x is its self-loop); colour it c,
    first uncolouring y's c-edge if y has one. No step lowers the number of coloured edges; it
    converges in about n^2 log n steps, or stalls (None) after 20 n^2 steps without progress.
    Returns (colours, n) partners."""
    colors = n if loops else n - 1
    at = [[-1] * colors for _ in range(n)]  # at[x][c]: x's partner in colour c (x itself: its loop)
    miss = [list(range(colors)) for _ in range(n)]  # indexed sets: O(1) random pick and removal
    miss_pos = [list(range(colors)) for _ in range(n)]
    unc = [[y for y in range(n) if loops or y != x] for x in range(n)]
    unc_pos = [[0] * n for _ in range(n)]
    for x in range(n):
        for i, y in enumerate(unc[x]):
            unc_pos[x][y] = i

    def remove(lst: list[int], pos: list[int], v: int) -> None:
        i, last = pos[v], lst[-1]
        lst[i], pos[last] = last, i
        lst.pop()

    def add(lst: list[int], pos: list[int], v: int) -> None:
        pos[v] = len(lst)
        lst.append(v)

    uncoloured = n * (n + 1) // 2 if loops else n * (n - 1) // 2
    best, since, patience = uncoloured, 0, 20 * n * n + 10_000
    r = rng.random
    while uncoloured:
        since += 1
        if since > patience:
            return None
        x = int(r() * n)
        if not miss[x]:
            continue
        c = miss[x][int(r() * len(miss[x]))]
        y = unc[x][int(r() * len(unc[x]))]
        if y == x:  # colour x's loop
            at[x][c] = x
            remove(miss[x], miss_pos[x], c)
            remove(unc[x], unc_pos[x], x)
        else:
            z = at[y][c]
            if z == -1:
                remove(miss[y], miss_pos[y], c)
            elif z == y:  # y's loop had colour c
                add(unc[y], unc_pos[y], y)
                uncoloured += 1
            else:
                at[z][c] = -1
                add(miss[z], miss_pos[z], c)
                add(unc[y], unc_pos[y], z)
                add(unc[z], unc_pos[z], y)
                uncoloured += 1
            at[x][c], at[y][c] = y, x
            remove(miss[x], miss_pos[x], c)
            remove(unc[x], unc_pos[x], y)
            remove(unc[y], unc_pos[y], x)
        uncoloured -= 1
        if uncoloured < best:
            best, since = uncoloured, 0
    return np.array(at, dtype=np.int64).T


def hop_distances(adj: np.ndarray) -> np.ndarray:
    """All-pairs hop counts of an undirected graph given as a boolean (n, n) adjacency (inf where
    unreachable), by breadth-first frontiers as boolean matrix products."""
    n = adj.shape[0]
    dist = np.full((n, n), np.inf)
    reach = np.eye(n, dtype=bool)
    dist[reach] = 0
    A = adj.astype(np.float32)
    for h in range(1, n):
        new = (reach.astype(np.float32) @ A > 0) & ~reach
        if not new.any():
            break
        dist[new] = h
        reach |= new
    return dist


class OperaNetwork(Network):
    name = "opera"

    def __init__(self, racks: int, hosts_per_rack: int, uplinks: int | None = None, *,
                 host_bandwidth: float = 100 * GBPS, hop_latency: float = 1e-6, devices_per_host: int = 1,
                 intra_bandwidth: float = 200 * GBPS, reconfig_delay: float = 10e-6, bulk_threshold: float = 15e6,
                 vlb: bool = True, link_delay: float = 0.5e-6, queue_packets: int = 8, packet_bytes: int = 1500,
                 seed: int = 0, tries: int | None = None, nodes: int | None = None,
                 rotorlb: str = "slotted") -> None:
        u = hosts_per_rack if uplinks is None else uplinks
        if tries is None:  # evaluating an assignment costs N_r all-pairs searches
            tries = 16 if racks <= 64 else 3
        for k, v in (("racks", racks), ("hosts_per_rack", hosts_per_rack), ("uplinks", u), ("tries", tries)):
            if not (isinstance(v, (int, np.integer)) and v >= 1):
                raise ValueError(f"opera: {k} must be an integer >= 1, got {v!r}")
        if u < 2:
            raise ValueError(f"opera: needs u >= 2 uplinks (rotor switches), got {u}")
        if racks % u:
            raise ValueError(f"opera: racks N_r = {racks} must be a multiple of the uplinks u = {u} "
                             f"(each rotor owns N_r/u matchings); try N_r = {racks + (-racks) % u}")
        if nodes is not None and nodes != racks * hosts_per_rack:
            raise ValueError(f"opera: {nodes} nodes do not fill {racks} racks x {hosts_per_rack} hosts "
                             f"= {racks * hosts_per_rack} evenly")
        if not (reconfig_delay >= 0 and bulk_threshold >= 0):
            raise ValueError("opera: reconfig_delay and bulk_threshold must be >= 0")
        if rotorlb not in ROTORLB_MODELS:
            raise ValueError(f"opera: rotorlb must be one of {ROTORLB_MODELS}, got {rotorlb!r}")
        self._init_host(racks * hosts_per_rack, host_bandwidth, hop_latency, devices_per_host, intra_bandwidth)
        self.racks, self.hosts_per_rack, self.uplinks = int(racks), int(hosts_per_rack), int(u)
        self.reconfig_delay, self.bulk_threshold, self.vlb = float(reconfig_delay), float(bulk_threshold), bool(vlb)
        self.rack_of = np.arange(self.hosts) // hosts_per_rack
        self.per_rotor = racks // u
        self.time_varying = self.per_rotor > 1
        self._pick_schedule(seed, tries)
        self.superslice, self.eps, self.delta = superslice_timing(
            int(self.h_max), host_bandwidth, reconfig_delay, link_delay, queue_packets, packet_bytes)
        self.cycle = racks * self.superslice
        self.down_time = reconfig_delay + self.delta  # the reconfiguring rotor's dead time per superslice
        self.window = u * self.superslice - self.down_time if self.time_varying else math.inf
        self.vlb_delay = self.cycle / (u + 1) if self.time_varying else 0.0
        self.rotorlb = rotorlb
        self._nh_cache: dict[int, np.ndarray] = {}
        self._up_cache: dict[int, np.ndarray] = {}

    @classmethod
    def from_nodes(cls, nodes: int, k: int | None = None, **kw) -> "OperaNetwork":
        """The study's layouts (16 -> 4 racks, k=8; 128 -> 32, k=8; 1024 -> 128, k=16), or any
        ``nodes`` with ToR ports ``k``: u = d = k/2, N_r = nodes/d."""
        if k is None:
            if nodes not in OPERA_PRESETS:
                raise ValueError(f"opera: no preset for {nodes} nodes (known: {sorted(OPERA_PRESETS)}); give k, "
                                 "the ToR ports (u = d = k/2; on the command line: --opera-option k=K)")
            racks, k = OPERA_PRESETS[nodes]
        if k < 4 or k % 2:
            raise ValueError(f"opera: k (ToR ports) must be even and >= 4, got {k}")
        d = k // 2
        if nodes % d:
            raise ValueError(f"opera: {nodes} nodes do not divide into racks of d = k/2 = {d} hosts")
        return cls(nodes // d, d, d, nodes=nodes, **kw)

    # ---- the rotor schedule -------------------------------------------------------------------
    def _pick_schedule(self, seed: int, tries: int) -> None:
        n, u = self.racks, self.uplinks
        partner = random_matchings(n, random.Random(seed))
        rng = np.random.default_rng(seed)
        best = None
        for _ in range(tries):
            rotor_m = rng.permutation(n).reshape(u, self.per_rotor)
            dists, h = [], 0.0
            for k in range(self.cycle_slices):
                dists.append(hop_distances(self._adjacency(partner, rotor_m, k)))
                h = max(h, float(dists[-1].max()))
                if best is not None and h > best[0][0]:
                    break  # worse than the best so far
            else:
                off = ~np.eye(n, dtype=bool)
                mean = float(np.mean([d[off].mean() for d in dists])) if n > 1 else 0.0
                if best is None or (h, mean) < best[0]:
                    best = ((h, mean), partner, rotor_m, dists)
        (h, mean), self.partner, self.rotor_matchings, dists = best
        if not math.isfinite(h):
            raise ValueError(f"opera: no connected expander found in {tries} tries for {n} racks, u = {u}")
        self.h_max, self.mean_hops = int(h), mean
        self._dists = dists
        self.pair_hops = np.mean(dists, axis=0)  # (n, n) mean hop count over the cycle's superslices
        rotor_of = np.empty(n, dtype=np.int64)
        pos_of = np.empty(n, dtype=np.int64)
        for b in range(u):
            for p, m in enumerate(self.rotor_matchings[b]):
                rotor_of[m], pos_of[m] = b, p
        a = np.arange(n)
        pair_m = np.empty((n, n), dtype=np.int64)
        for m in range(n):
            pair_m[a, self.partner[m]] = m
        self.pair_matching, self.rotor_of_matching, self.pos_of_matching = pair_m, rotor_of, pos_of

    @property
    def cycle_slices(self) -> int:
        return self.racks if self.time_varying else 1

    def reconfiguring(self, k: int) -> int:
        """The rotor reconfiguring in superslice k, or -1 (static mesh)."""
        return k % self.uplinks if self.per_rotor > 1 else -1

    def matching_at(self, b: int, k: int, rotor_m: np.ndarray | None = None) -> int:
        """Matching held by rotor b in superslice k (after its reconfiguration in that slice)."""
        rm = self.rotor_matchings if rotor_m is None else rotor_m
        return int(rm[b, ((k - b) // self.uplinks) % self.per_rotor])

    def _adjacency(self, partner: np.ndarray, rotor_m: np.ndarray, k: int) -> np.ndarray:
        """Expander of superslice k: circuits of the rotors not reconfiguring, self-loops dropped."""
        n = self.racks
        adj = np.zeros((n, n), dtype=bool)
        a = np.arange(n)
        for b in range(self.uplinks):
            if b == self.reconfiguring(k):
                continue
            adj[a, partner[self.matching_at(b, k, rotor_m)]] = True
        adj[a, a] = False
        return adj

    def up_window(self, a: int, c: int) -> tuple[float, float]:
        """[start, end) within the cycle when rack a's direct circuit to c is usable (may wrap);
        (0, inf) in a static mesh."""
        if not self.time_varying:
            return 0.0, math.inf
        m = self.pair_matching[a, c]
        k0 = (self.rotor_of_matching[m] + self.pos_of_matching[m] * self.uplinks) % self.racks
        start = k0 * self.superslice + self.down_time
        return start % self.cycle, (start + self.window) % self.cycle

    # ---- links --------------------------------------------------------------------------------
    def circuit(self, a: np.ndarray, c: np.ndarray) -> np.ndarray:
        return self.first_net_link + a * self.racks + c

    def up_pool(self, a: np.ndarray) -> np.ndarray:
        return self.first_net_link + self.racks**2 + a

    def down_pool(self, c: np.ndarray) -> np.ndarray:
        return self.first_net_link + self.racks**2 + self.racks + c

    def net_capacity(self) -> np.ndarray:
        return self.average_net_capacity()

    def epoch_of(self, t: float) -> tuple[int, float]:
        """(epoch index in [0, 2 N_r), its end time) for time t; a static mesh has one endless epoch."""
        if not self.time_varying:
            return 0, math.inf
        S, tiny = self.superslice, 1e-9 * self.superslice
        k = math.floor(t / S)
        if (k + 1) * S - t <= tiny:  # at a boundary up to rounding: the next superslice
            k += 1
        if t - k * S < self.down_time - tiny:
            return 2 * (k % self.racks), k * S + self.down_time
        return 2 * (k % self.racks) + 1, (k + 1) * S

    @property
    def slotted(self) -> bool:
        """Whether bulk traffic uses the slotted RotorLB model (``rotorlb.py``)."""
        return self.vlb and self.time_varying and self.rotorlb == "slotted"

    def up_circuits(self, e: int) -> np.ndarray:
        """Sorted flat indices a * N_r + c of the circuits up in epoch e (self-loops left out)."""
        hit = self._up_cache.get(e)
        if hit is None:
            n = self.racks
            k, first_half = divmod(e, 2)
            down = self.reconfiguring(k) if first_half == 0 else -1
            a = np.arange(n)
            idx = []
            for b in range(self.uplinks):
                if b != down:
                    p = self.partner[self.matching_at(b, k)]
                    idx.append((a * n + p)[p != a])
            hit = self._up_cache[e] = np.sort(np.concatenate(idx))
        return hit

    def epoch_net_capacity(self, e: int) -> np.ndarray:
        """Topology-link capacities in epoch e (circuits of rotors that are up, and the pools)."""
        n, B = self.racks, self.host_bandwidth
        cap = np.zeros(n * n + 2 * n)
        up = self.up_circuits(e)
        cap[up] = B
        count = np.bincount(up // n, minlength=n) * B
        cap[n * n:n * n + n] = count
        cap[n * n + n:] = count  # symmetric matchings: as many circuits in as out
        return cap

    def slot_start(self, t: float) -> float:
        """The first superslice boundary at or after t (RotorLB plans per slot)."""
        if not self.time_varying:
            return t
        S = self.superslice
        k = math.ceil(t / S - 1e-9)
        return max(t, k * S)

    def slot_index(self, t: float) -> int:
        """Superslice of the cycle that t (a superslice boundary) opens."""
        return round(t / self.superslice) % self.racks

    def average_net_capacity(self) -> np.ndarray:
        """Time-averaged capacities over a cycle: each circuit W/T_c of the time, the pools the
        sum of their circuits (in a static mesh: the capacities)."""
        n, B = self.racks, self.host_bandwidth
        frac = self.window / self.cycle if self.time_varying else 1.0
        cap = np.full((n, n), B * frac)
        np.fill_diagonal(cap, 0.0)
        pool = cap.sum(axis=1)
        return np.concatenate([cap.ravel(), pool, pool])

    def epoch_bounds(self, e: int) -> tuple[float, float]:
        """[start, end) of epoch e within the cycle."""
        k, half = divmod(e, 2)
        s = k * self.superslice
        return (s, s + self.down_time) if half == 0 else (s + self.down_time, s + self.superslice)

    # ---- routes -------------------------------------------------------------------------------
    def relation(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """0 within a host, else 2 + the rack pair (a * N_r + c): flows of different rack pairs
        see different circuits (and within a rack, hosts whose uplinks see different circuits)."""
        a, c = self.rack_of[src], self.rack_of[dst]
        return np.where(src == dst, 0, 2 + a * self.racks + c)

    def hops(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Direct path: host -> ToR -> circuit -> ToR -> host (3); 2 within a rack."""
        a, c = self.rack_of[src], self.rack_of[dst]
        return np.select([src == dst, a == c], [0, 2], 3)

    def next_hops(self, k: int) -> np.ndarray:
        """(n, n) next rack on the shortest path a -> c in superslice k's expander (lowest rack
        id among equals); -1 on the diagonal."""
        k %= self.cycle_slices
        if k not in self._nh_cache:
            n = self.racks
            dist = self._dists[k]
            a = np.arange(n)
            nbrs = []
            for b in range(self.uplinks):
                if b == self.reconfiguring(k):
                    continue
                nbrs.append(self.partner[self.matching_at(b, k)])
            nb = np.stack(nbrs, axis=1)  # (n, deg)
            nb = np.sort(nb, axis=1)
            d = dist[nb]  # (n, deg, n): distance from each neighbour to every c
            d = np.where((nb == a[:, None])[:, :, None], np.inf, d)
            nh = np.take_along_axis(nb, np.argmin(d, axis=1), axis=1)  # (n, n)
            nh[a, a] = -1
            self._nh_cache[k] = nh
        return self._nh_cache[k]

    def path_links(self, k: int, a: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(member, link) entries of the multi-hop path a -> c in superslice k: for every hop
        x -> y the circuit x->y, x's uplink pool and y's downlink pool."""
        nh = self.next_hops(k)
        member, links = [], []
        idx = np.arange(a.shape[0])
        cur = a.copy()
        live = cur != c
        while live.any():
            i, x = idx[live], cur[live]
            y = nh[x, c[live]]
            member += [i, i, i]
            links += [self.circuit(x, y), self.up_pool(x), self.down_pool(y)]
            cur[live] = y
            live = cur != c
        if not member:
            e = np.zeros(0, dtype=np.int64)
            return e, e
        return np.concatenate(member), np.concatenate(links)

    def describe(self) -> str:
        mode = (f"superslice {self.superslice * 1e6:.2f} us, cycle {self.cycle * 1e6:.1f} us, "
                f"direct window {self.window * 1e6:.2f} us" if self.time_varying else "static full mesh")
        return (f"opera: {self.racks} racks x {self.hosts_per_rack} hosts x {self.devices_per_host} devices, "
                f"u = {self.uplinks} rotors, NIC/uplink {self.host_bandwidth / GBPS:g} Gbps, h_max {self.h_max}, "
                f"{mode}, bulk >= {self.bulk_threshold / 1e6:g} MB"
                f"{(', RotorLB ' + ('slotted' if self.slotted else 'fluid VLB')) if self.vlb else ', direct only'}")
