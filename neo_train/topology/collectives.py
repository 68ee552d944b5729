"""Collectives as host-level flows for the simulator (``Comm`` phases of dependent ``Transfer`` rounds).

    all_to_all(M, name="fwd_a2a")                     # M[i, j] bytes host i -> j, one round
    all_to_all(M, name="a2a", algorithm="pairwise")   # N-1 rounds: i -> i+k in round k
    ring_all_reduce(16, 2.8e9, name="ar")             # 2(N-1) dependent ring steps of S/N
    dps_all_reduce(16, 2.8e9, name="ar")              # reduce-scatter + all-gather, one a2a each
    hierarchical_all_reduce(16, 2.8e9, devices_per_host=8, inner="ring", name="ar")

``hosts`` is a count (hosts 0..N-1) or the list of host ids taking part. Sizes are bytes.
Byte counts, per host: ring and DPS all-reduce both send 2(N-1)/N * S, in 2(N-1) rounds or in 2;
all-gather / reduce-scatter (ring) (N-1)/N * S in N-1 rounds. The hierarchical all-reduce reduces
inside each host first ((G-1) * S over its internal fabric: a ring reduce-scatter among G devices,
(G-1)/G * S per device), all-reduces S across hosts (the G per-device all-reduces of S/G share the
one NIC, so the NIC carries S), then all-gathers inside the host.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .simulator import Comm, Transfer

__all__ = [
    "all_to_all",
    "uniform_matrix",
    "ring_all_reduce",
    "dps_all_reduce",
    "hierarchical_all_reduce",
    "all_reduce",
    "ring_all_gather",
    "ALL_REDUCE_ALGORITHMS",
]

ALL_REDUCE_ALGORITHMS = ("ring", "dps", "hier_ring", "hier_dps")


def _hosts(hosts: int | Sequence[int]) -> np.ndarray:
    h = np.arange(hosts) if isinstance(hosts, (int, np.integer)) else np.asarray(list(hosts), dtype=np.int64)
    if h.size < 1 or len(set(h.tolist())) != h.size:
        raise ValueError(f"collective: need one or more distinct hosts, got {hosts!r}")
    return h


def uniform_matrix(hosts: int, bytes_per_pair: float, intra: float = 0.0) -> np.ndarray:
    """(N, N) all-to-all: ``bytes_per_pair`` between distinct hosts, ``intra`` on the diagonal."""
    M = np.full((hosts, hosts), float(bytes_per_pair))
    np.fill_diagonal(M, float(intra))
    return M


def all_to_all(matrix: np.ndarray, *, name: str, after: Sequence[str] = (), algorithm: str = "direct",
               hosts: Sequence[int] | None = None) -> Comm:
    """All-to-all(v) of ``matrix[i, j]`` bytes from the i-th to the j-th host of ``hosts``
    (default 0..N-1). ``direct``: every flow at once; ``pairwise``: N-1 dependent rounds, the i-th
    host sending to the (i+k)-th in round k (intra-host bytes ride in round 1)."""
    M = np.asarray(matrix, dtype=np.float64)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"all_to_all '{name}': need a square byte matrix, got shape {M.shape}")
    N = M.shape[0]
    h = np.arange(N) if hosts is None else _hosts(hosts)
    if h.size != N:
        raise ValueError(f"all_to_all '{name}': {h.size} hosts for a {N}x{N} matrix")
    if algorithm == "direct":
        i, j = np.nonzero(M)
        rounds = (Transfer(h[i], h[j], M[i, j]),)
    elif algorithm == "pairwise":
        i = np.arange(N)
        rounds = []
        for k in range(1, max(N, 2)):
            j = (i + k) % N
            src, dst, nb = h[i], h[j], M[i, j]
            if k == 1:
                src, dst, nb = np.concatenate([src, h]), np.concatenate([dst, h]), np.concatenate([nb, np.diag(M)])
            rounds.append(Transfer(src, dst, nb))
        rounds = tuple(rounds)
    else:
        raise ValueError(f"all_to_all '{name}': algorithm must be 'direct' or 'pairwise', got {algorithm!r}")
    return Comm(name, rounds, tuple(after), "all_to_all", algorithm, float(M.sum()))


def ring_all_reduce(hosts: int | Sequence[int], nbytes: float, *, name: str, after: Sequence[str] = ()) -> Comm:
    """Ring all-reduce of S = ``nbytes``: 2(N-1) dependent steps (N-1 reduce-scatter, N-1
    all-gather), in each every host sends S/N to the next. One Transfer object repeated, so the
    simulator prepares it once."""
    h = _hosts(hosts)
    N = h.size
    if N == 1 or nbytes <= 0:
        return Comm(name, (), tuple(after), "all_reduce", "ring", float(nbytes))
    step = Transfer(h, np.roll(h, -1), np.full(N, nbytes / N))
    return Comm(name, (step,) * (2 * (N - 1)), tuple(after), "all_reduce", "ring", float(nbytes))


def dps_all_reduce(hosts: int | Sequence[int], nbytes: float, *, name: str, after: Sequence[str] = ()) -> Comm:
    """Distributed parameter server: reduce-scatter as one all-to-all round (every host sends
    segment j, S/N bytes, to host j), then all-gather as another: two dependent steps."""
    h = _hosts(hosts)
    N = h.size
    if N == 1 or nbytes <= 0:
        return Comm(name, (), tuple(after), "all_reduce", "dps", float(nbytes))
    i, j = np.nonzero(~np.eye(N, dtype=bool))
    step = Transfer(h[i], h[j], np.full(i.size, nbytes / N))
    return Comm(name, (step, step), tuple(after), "all_reduce", "dps", float(nbytes))


def hierarchical_all_reduce(hosts: int | Sequence[int], nbytes: float, *, devices_per_host: int, name: str,
                            inner: str = "ring", after: Sequence[str] = ()) -> Comm:
    """Reduce-scatter inside each host, all-reduce S across hosts (``inner`` ring or dps),
    all-gather inside each host."""
    h = _hosts(hosts)
    G = devices_per_host
    inter = {"ring": ring_all_reduce, "dps": dps_all_reduce}
    if inner not in inter:
        raise ValueError(f"hierarchical all-reduce '{name}': inner must be ring or dps, got {inner!r}")
    rounds = inter[inner](h, nbytes, name=name).rounds
    if G > 1 and nbytes > 0:
        local = Transfer(h, h, np.full(h.size, (G - 1) * nbytes))
        rounds = (local,) + rounds + (local,)
    return Comm(name, rounds, tuple(after), "all_reduce", f"hier_{inner}", float(nbytes))


def all_reduce(algorithm: str, hosts: int | Sequence[int], nbytes: float, *, name: str, after: Sequence[str] = (),
               devices_per_host: int = 1) -> Comm:
    """One of ``ALL_REDUCE_ALGORITHMS`` by name."""
    if algorithm == "ring":
        return ring_all_reduce(hosts, nbytes, name=name, after=after)
    if algorithm == "dps":
        return dps_all_reduce(hosts, nbytes, name=name, after=after)
    if algorithm in ("hier_ring", "hier_dps"):
        return hierarchical_all_reduce(hosts, nbytes, devices_per_host=devices_per_host, name=name,
                                       inner=algorithm[5:], after=after)
    raise ValueError(f"all-reduce algorithm must be one of {ALL_REDUCE_ALGORITHMS}, got {algorithm!r}")


def ring_all_gather(hosts: int | Sequence[int], nbytes: float, *, name: str, after: Sequence[str] = (),
                    collective: str = "all_gather") -> Comm:
    """Ring all-gather (or reduce-scatter: the same traffic) of S = ``nbytes`` in total: N-1
    steps of S/N to the next host."""
    h = _hosts(hosts)
    N = h.size
    if N == 1 or nbytes <= 0:
        return Comm(name, (), tuple(after), collective, "ring", float(nbytes))
    step = Transfer(h, np.roll(h, -1), np.full(N, nbytes / N))
    return Comm(name, (step,) * (N - 1), tuple(after), collective, "ring", float(nbytes))
