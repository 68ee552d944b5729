"""The simulator's schedule format and results: ``Transfer`` rounds of host-to-host flows inside
``Comm`` phases, ``Compute`` phases, and the ``SimResult`` timeline (``PhaseTiming`` per phase).

    step = Transfer(src=[0, 1], dst=[1, 0], nbytes=[1e6, 1e6])
    Comm("swap", (step, step), after=("fwd",))   # two dependent rounds, after phase "fwd"

See ``simulator`` for what the simulation does with them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

import numpy as np

__all__ = ["Transfer", "Comm", "Compute", "Phase", "PhaseTiming", "SimResult"]


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
