"""The simulator's flow arithmetic: max-min fair rates, and transfers merged into bundles.

A *bundle* stands for m member flows of one round that carry equal bytes and stand in the same
relation to the topology (``Network.relation``). It has one rate, the rate of each member; on a
link it counts as many times as it has members crossing that link. Its *entries* (bundle, link,
coefficient) are what ``max_min_rates`` allocates over:

    ent       NIC up / NIC down per host (coefficient: members from / to that host), the host's
              internal fabric for same-host members, static routes (fat-tree pools)
    circ      Opera bulk bundles: their rack pair's circuit (capacity B while up, else 0)
    pools     the same bundles on the source rack's uplink pool and the destination's downlink pool
              (needed as constraints only beside multi-hop flows, which load pools hop by hop)
    vlb       their two-hop VLB sub-flows: the two pools with 2 m (see ``opera.py``)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .network import Network
from .opera import OperaNetwork

__all__ = ["max_min_rates", "Bundles", "prepare", "host_classes", "CLASS_SPLIT_LIMIT",
           "KIND_INTRA", "KIND_PLAIN", "KIND_BULK", "KIND_LOWLAT"]

KIND_INTRA, KIND_PLAIN, KIND_BULK, KIND_LOWLAT = 0, 1, 2, 3
Entries = tuple[np.ndarray, np.ndarray, np.ndarray]


def max_min_rates(n: int, flow: np.ndarray, link: np.ndarray, coef: np.ndarray,
                  cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max-min fair rates of ``n`` flows (bundles) by progressive filling.

    Entry i says flow ``flow[i]`` loads link ``link[i]`` with ``coef[i]`` times its rate (a bundle
    of m members crossing a link m times). All unfrozen rates rise together until a link fills;
    flows on it freeze at that level; repeat. Flows crossing a zero-capacity link get 0, and so
    does a flow without entries. Returns (rates (n,), residual capacity per link, 0 where full up
    to rounding).
    """
    rate = np.zeros(n)
    res = cap.astype(np.float64).copy()
    frozen = np.bincount(flow, weights=cap.take(link) <= 0, minlength=n) > 0
    keep = np.flatnonzero(~frozen.take(flow))  # integer takes: much faster than boolean masks
    if keep.size:
        fb, cf, lk = flow.take(keep), coef.take(keep), link.take(keep)
        mark = np.zeros(cap.shape[0], dtype=bool)
        mark[lk] = True
        links = np.flatnonzero(mark)  # work on the links in use only
        lk = (np.cumsum(mark) - 1).take(lk)
        r = res.take(links)
        level = 0.0
        while fb.size:
            load = np.bincount(lk, cf, minlength=links.size)
            used = np.flatnonzero(load)
            ratio = r[used] / load[used]
            inc = max(float(ratio.min()), 0.0)
            level += inc
            r[used] -= inc * load[used]
            full = np.zeros(links.size, dtype=bool)
            full[used[ratio <= inc * (1 + 1e-9) + 1e-300]] = True
            now = fb[full.take(lk)]
            rate[now] = level
            frozen[now] = True
            keep = np.flatnonzero(~frozen.take(fb))
            fb, lk, cf = fb.take(keep), lk.take(keep), cf.take(keep)
        res[links] = r
    res[res <= 1e-9 * cap] = 0.0  # full up to rounding: later stages see it full
    return rate, res


def empty() -> Entries:
    e = np.zeros(0, dtype=np.int64)
    return e, e, np.zeros(0)


def cat(parts: Sequence[Entries]) -> Entries:
    parts = [p for p in parts if p[0].size]
    if not parts:
        return empty()
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


def _counts(gid: np.ndarray, link: np.ndarray, L: int) -> Entries:
    """(bundle, link, count) for member entries (gid[i], link[i]), merged."""
    if gid.size == 0:
        return empty()
    code, cnt = np.unique(gid * L + link, return_counts=True)
    return code // L, code % L, cnt.astype(np.float64)


def link_classes(ent: Entries, cap: np.ndarray, below: int) -> np.ndarray:
    """(below,) class id per link, -1 if unused: links with equal class carry the same bundles with
    the same coefficients and have equal capacity, so they are one constraint written twice (the
    NICs of a rack's hosts in a class-uniform pattern). Compared by two integer hashes of the column
    and its entry count: exact sums (integer weights, integer member counts)."""
    f, lk, c = ent
    low = lk < below
    f, lk, c = f[low], lk[low], c[low]
    w1 = (f * 2654435761 + 12345) % 1048573 + 1
    w2 = (f * 40503 + 977) % 1048559 + 1
    s1 = np.bincount(lk, c * w1, minlength=below)
    s2 = np.bincount(lk, c * w2, minlength=below)
    cnt = np.bincount(lk, minlength=below).astype(np.float64)
    out = np.full(below, -1, dtype=np.int64)
    used = np.flatnonzero(cnt)
    if used.size:
        keys = (s1[used], s2[used], cnt[used], cap[used])
        order = np.lexsort(keys)
        k = np.stack([x[order] for x in keys], axis=1)
        new = np.ones(used.size, dtype=bool)
        new[1:] = (k[1:] != k[:-1]).any(axis=1)
        out[used[order]] = np.cumsum(new) - 1
    return out


@dataclass
class Bundles:
    """A transfer's bundles on one network (bundle ids 0..n-1)."""

    n: int
    members: np.ndarray
    nbytes: np.ndarray
    """Bytes per member flow."""
    kind: np.ndarray
    a: np.ndarray
    """Source rack (Opera cross-rack bundles; -1 otherwise)."""
    c: np.ndarray
    latency: np.ndarray
    """Path latency of each bundle's flows, seconds."""
    ent: Entries
    circ: Entries
    pools: Entries
    vlb: Entries
    classes: np.ndarray
    """``link_classes`` of ``ent`` over the dedupable links."""
    bound: float
    """max over hosts of max(bytes out, bytes in) / NIC (intra-host bytes / internal fabric), s."""
    network_bytes: float


def host_classes(transfers: Sequence, net: Network) -> np.ndarray:
    """(N,) class per host: hosts play the same part in every transfer (the multiset of (bytes, path
    length, direction) of the flows they send and receive, per transfer) share a class. Bundles
    only merge flows whose ends are of equal classes, so that their members are symmetric even
    when different collectives overlap (a ring step leaves one host per rack a cross-rack flow,
    the others a local one: an all-to-all running beside it sees two kinds of host)."""
    sig = np.zeros(net.hosts, dtype=np.uint64)
    seen: set[int] = set()
    with np.errstate(over="ignore"):
        for tr in transfers:
            if id(tr) in seen or tr.src.size == 0:
                continue
            seen.add(id(tr))
            t = np.uint64(len(seen))
            h = (tr.nbytes.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                 + net.hops(tr.src, tr.dst).astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
                 + t * np.uint64(0x165667B19E3779F9))
            for direction, ends in ((1, tr.src), (2, tr.dst)):
                x = h + np.uint64(direction) * np.uint64(0xD6E8FEB86659FD93)
                x ^= x >> np.uint64(29)
                x *= np.uint64(0xBF58476D1CE4E5B9)
                x ^= x >> np.uint64(32)
                np.add.at(sig, ends, x)
    return np.unique(sig, return_inverse=True)[1].astype(np.int64)


CLASS_SPLIT_LIMIT = (4, 20_000)
"""Host classes split a transfer's bundles only while that leaves at most 4x as many bundles, or
at most 20,000: past both (a ring beside an all-to-all at 1024 hosts: 16k bundles x9) the bundles
stay whole, their members sharing the most loaded member's rate, and the simulation stays fast."""


def _group(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(group id per flow, first flow of each group) for equal values in every column."""
    F = cols[0].size
    order = np.lexsort(cols)
    new = np.zeros(F, dtype=bool)
    new[:1] = True
    for col in cols:
        sc = col[order]
        new[1:] |= sc[1:] != sc[:-1]
    gid = np.empty(F, dtype=np.int64)
    gid[order] = np.cumsum(new) - 1
    return gid, order[new]


def prepare(tr, net: Network, aggregate: bool, classes: np.ndarray | None = None) -> Bundles:
    """Merge a ``Transfer``'s flows into bundles (each flow alone when not ``aggregate``): equal
    bytes, equal ``net.relation`` and, given ``classes`` (``host_classes``), equal classes of
    source and of destination (within ``CLASS_SPLIT_LIMIT``)."""
    N = net.hosts
    if tr.max_host >= N:
        raise ValueError(f"transfer names host {tr.max_host} but {net.name} has {N} hosts")
    src, dst, nb = tr.src, tr.dst, tr.nbytes
    F = src.size
    key = net.relation(src, dst).astype(np.int64)
    if not aggregate:
        gid = np.arange(F, dtype=np.int64)
        first = gid
    elif F == 0:
        gid, first = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    else:
        gid, first = _group([nb, key])
        if classes is not None:
            fine = _group([nb, key, classes[src], classes[dst]])
            if fine[1].size <= max(CLASS_SPLIT_LIMIT[0] * first.size, CLASS_SPLIT_LIMIT[1]):
                gid, first = fine
    n = int(first.size)
    members = np.bincount(gid, minlength=n).astype(np.float64)
    gkey, gbytes = key[first], nb[first]
    cap = net.capacity()
    L = int(cap.shape[0])
    intra = src == dst
    inter = ~intra
    ent = [
        _counts(gid[intra], 2 * N + src[intra], L),
        _counts(gid[inter], src[inter], L),
        _counts(gid[inter], N + dst[inter], L),
    ]
    kind = np.where(gkey == 0, KIND_INTRA, KIND_PLAIN).astype(np.int8)
    a = np.full(n, -1, dtype=np.int64)
    c = np.full(n, -1, dtype=np.int64)
    hops = net.hops(src[first], dst[first]).astype(np.float64)
    circ, pools, vlb = empty(), empty(), empty()
    if isinstance(net, OperaNetwork):
        pair = gkey >= 2
        a[pair], c[pair] = (gkey[pair] - 2) // net.racks, (gkey[pair] - 2) % net.racks
        cross = pair & (a != c)
        bulk = cross & (gbytes >= net.bulk_threshold)
        low = cross & ~bulk
        kind[bulk], kind[low] = KIND_BULK, KIND_LOWLAT
        g = np.flatnonzero(bulk)
        m = members[g]
        up, down = net.up_pool(a[g]), net.down_pool(c[g])
        circ = (g, net.circuit(a[g], c[g]), m)
        pools = (np.concatenate([g, g]), np.concatenate([up, down]), np.concatenate([m, m]))
        vlb = (np.concatenate([g, g]), np.concatenate([up, down]), np.concatenate([2 * m, 2 * m]))
        hops[low] = 2 + net.pair_hops[a[low], c[low]]
        below = net.first_net_link
    else:
        r = net.routes(src[inter], dst[inter])
        if r.member.size:
            ent.append(_counts(gid[inter][r.member], r.link, L))
        below = L
    ent3 = cat(ent)
    B = net.host_bandwidth
    out = np.bincount(src[inter], nb[inter], minlength=N)
    inn = np.bincount(dst[inter], nb[inter], minlength=N)
    own = np.bincount(src[intra], nb[intra], minlength=N)
    bound = max(float(max(out.max(initial=0), inn.max(initial=0))) / B, float(own.max(initial=0)) / net.intra_capacity)
    return Bundles(n, members, gbytes, kind, a, c, hops * net.hop_latency, ent3, circ, pools, vlb,
                   link_classes(ent3, cap, below), bound, float(nb[inter].sum()))
