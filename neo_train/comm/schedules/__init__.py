"""Collective algorithms as data: schedules, their validator, and the algorithm registry.

    from neo_train.comm.schedules import build_schedule, validate
    s = build_schedule("bruck", "all_to_all_v", 5, sizes)   # sizes[i][j] elements i -> j
    validate(s)                                             # raises ScheduleError naming the step

Algorithms (one file each): pairwise, bruck (all-to-all-v); ring, halving_doubling, dps
(all-reduce; ring and dps also reduce-scatter-v and all-gather-v); hierarchical (all-to-all-v,
all-reduce over nodes); opera (all-to-all-v aligned to a rotor cycle). ``ScheduleCommunicator``
(neo_train.comm.executor) runs them on a process group.
"""
from . import bruck, dps, halving_doubling, hierarchical, opera, pairwise, ring  # noqa: F401  (register)
from .opera import matching_cycle
from .registry import (
    Algorithm,
    TopologyHint,
    algorithm_names,
    build_schedule,
    get_algorithm,
    near_equal,
    prefix,
    register_algorithm,
)
from .schedule import (
    OPS,
    REDUCING_OPS,
    Copy,
    LocalOp,
    Reduce,
    Round,
    Schedule,
    ScheduleError,
    Transfer,
    io_sizes,
    normalize_sizes,
    stages,
    validate,
)

__all__ = [
    "OPS",
    "REDUCING_OPS",
    "Transfer",
    "Copy",
    "Reduce",
    "LocalOp",
    "Round",
    "Schedule",
    "ScheduleError",
    "normalize_sizes",
    "io_sizes",
    "validate",
    "stages",
    "Algorithm",
    "TopologyHint",
    "register_algorithm",
    "get_algorithm",
    "algorithm_names",
    "build_schedule",
    "near_equal",
    "prefix",
    "matching_cycle",
]
