"""The algorithm registry: a name -> an ``Algorithm`` that builds a ``Schedule``.

Adding an algorithm is one small class and one line:

    class Linear(Algorithm):
        '''Every rank sends every block directly, all in one round.'''
        ops = ("all_to_all_v",)

        def build(self, op, world_size, rank_sizes, topology_hint):
            s = Schedule.new(op, world_size, rank_sizes, self.name)
            ...  # s.send(round, src, dst, "in", off, "out", off, n); s.copy(...); s.reduce(...)
            return s

    register_algorithm("linear", Linear)

then ``ScheduleCommunicator(comm, rules=[("all_to_all_v", None, "linear")])`` runs it, and
``validate(build_schedule("linear", ...))`` checks it.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Sequence

from .schedule import OPS, Schedule, normalize_sizes

__all__ = [
    "TopologyHint",
    "Algorithm",
    "register_algorithm",
    "get_algorithm",
    "algorithm_names",
    "build_schedule",
    "near_equal",
    "prefix",
]


@dataclass(frozen=True)
class TopologyHint:
    """What an algorithm may know about where the ranks sit. Every field is optional."""

    local_world_size: int | None = None
    """Ranks per node (hierarchical: intra-node first, then across nodes)."""
    hosts_per_rack: int | None = None
    """Ranks per rack (opera); defaults to ``local_world_size``, else 1."""
    bulk_threshold_bytes: int = 15_000_000
    """opera: a block of at least this many bytes waits for its rack pair's direct circuit; a
    smaller one takes a two-hop relay (the Opera paper's default cutoff is 15 MB; the ISI study
    sent everything as bulk, i.e. 0)."""
    elem_size: int = 4
    """Bytes per element (the executor fills it in from the tensor)."""
    matchings: tuple[tuple[int, ...], ...] | None = None
    """opera: the rotor cycle's matchings over racks (matchings[t][rack] = its partner in slot t);
    None: the circle-method cycle of ``opera.matching_cycle``."""

    def bulk_threshold_elems(self) -> int:
        return math.ceil(self.bulk_threshold_bytes / max(1, self.elem_size))


class Algorithm(ABC):
    """Builds schedules for the collectives in ``ops``."""

    name: ClassVar[str] = ""
    ops: ClassVar[tuple[str, ...]] = ()
    local_sizes_only: ClassVar[bool] = False
    """all_to_all_v only: True when the steps touching rank r (and the stage structure) depend on
    row r and column r of the size matrix alone. The executor then builds rank r's schedule from
    the matrix holding its own row and column (zeros elsewhere) and skips the split-size exchange."""

    @abstractmethod
    def build(self, op: str, world_size: int, rank_sizes, topology_hint: TopologyHint) -> Schedule:
        """A schedule for ``op`` on ``world_size`` ranks; ``rank_sizes`` in canonical form
        (``normalize_sizes``), in elements."""


_REGISTRY: dict[str, type[Algorithm]] = {}


def register_algorithm(name: str, cls: type[Algorithm]) -> type[Algorithm]:
    """Register ``cls`` under ``name`` (also sets ``cls.name``). 'native' is reserved."""
    if name == "native":
        raise ValueError("'native' is reserved for the inner communicator's own collectives")
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"{cls!r} is not an Algorithm subclass")
    bad = [op for op in cls.ops if op not in OPS]
    if not cls.ops or bad:
        raise ValueError(f"algorithm {name!r}: ops must be a non-empty subset of {OPS}, got {cls.ops}")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"algorithm {name!r} is already registered ({_REGISTRY[name].__name__})")
    cls.name = name
    _REGISTRY[name] = cls
    return cls


def get_algorithm(name: str) -> Algorithm:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown collective algorithm {name!r}; registered: {algorithm_names()} (or 'native')") from None


def algorithm_names(op: str | None = None) -> list[str]:
    """Registered algorithms (those that implement ``op`` when given), sorted."""
    return sorted(n for n, c in _REGISTRY.items() if op is None or op in c.ops)


def build_schedule(name: str, op: str, world_size: int, sizes, hint: TopologyHint | None = None) -> Schedule:
    """Build ``name``'s schedule for ``op`` (sizes in elements, any accepted form)."""
    alg = get_algorithm(name)
    if op not in alg.ops:
        raise ValueError(f"algorithm {name!r} does not implement {op} (it implements {list(alg.ops)})")
    return alg.build(op, world_size, normalize_sizes(op, world_size, sizes), hint or TopologyHint())


def near_equal(n: int, parts: int) -> list[int]:
    """``n`` split into ``parts`` sizes differing by at most one, larger first."""
    q, r = divmod(n, parts)
    return [q + (i < r) for i in range(parts)]


def prefix(sizes: Sequence[int]) -> list[int]:
    """Exclusive prefix sums: the offset of each block."""
    out, acc = [], 0
    for v in sizes:
        out.append(acc)
        acc += v
    return out
