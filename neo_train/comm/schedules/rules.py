"""Collective rules: which schedule algorithm runs a collective of a given size.

    parse_rules("all_to_all_v<=64KB:bruck, all_to_all_v:pairwise, all_reduce:ring")
    # [Rule('all_to_all_v', 65536.0, 'bruck'), Rule('all_to_all_v', inf, 'pairwise'), Rule('all_reduce', inf, 'ring')]

A rule is ``op[<=SIZE]:algorithm`` in a comma-separated string (SIZE in bytes, or with KB/MB/GB
= 2^10, 2^20, 2^30; op may be ``*``: every collective the algorithm implements), or a tuple
``(op, max_bytes or None, algorithm)``; ``native`` names the inner communicator's own collective.
Parsing checks each algorithm against the registry, so a bad rule is an error before anything
runs: ``DistConfig`` checks its ``collective_rules`` here, and ``ScheduleCommunicator``
(neo_train.comm.executor) applies them. Pure Python, like the rest of this package.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from .registry import get_algorithm
from .schedule import OPS

__all__ = ["Rule", "parse_rules", "format_rules", "parse_bytes"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class Rule:
    """Use ``algorithm`` for ``op`` (or ``*``) when the call's size is at most ``max_bytes``."""

    op: str
    max_bytes: float
    algorithm: str

    def __str__(self) -> str:
        return f"{self.op}{'' if math.isinf(self.max_bytes) else f'<={int(self.max_bytes)}'}:{self.algorithm}"


def parse_bytes(text: str) -> float:
    """Bytes in ``text``: a number, optionally with K/M/G (2^10, 2^20, 2^30) and a trailing B."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMG]?)B?\s*", text.upper())
    if not m:
        raise ValueError(f"collective rules: cannot read size {text!r} (e.g. 65536, 64KB, 1MB)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_rules(rules: "str | Sequence[Rule | tuple] | None") -> list[Rule]:
    """Rules from a string ``"op[<=SIZE]:alg, ..."`` or a sequence of Rule / (op, max_bytes, alg).

    Checks every algorithm exists and implements the collective it is given for."""
    if not rules:
        return []
    items: list[tuple] = []
    if isinstance(rules, str):
        for i, part in enumerate(p.strip() for p in rules.split(",")):
            if not part:
                continue
            if ":" not in part:
                raise ValueError(f"collective rules: entry {i} {part!r} is not 'op[<=SIZE]:algorithm'")
            lhs, alg = (v.strip() for v in part.rsplit(":", 1))
            op, _, size = (v.strip() for v in lhs.partition("<="))
            items.append((op, parse_bytes(size) if size else None, alg))
    else:
        items = [(r.op, r.max_bytes, r.algorithm) if isinstance(r, Rule) else tuple(r) for r in rules]
    out = []
    for i, item in enumerate(items):
        if len(item) != 3:
            raise ValueError(f"collective rules: entry {i} {item!r} is not (op, max_bytes, algorithm)")
        op, max_bytes, alg = item
        if op != "*" and op not in OPS:
            raise ValueError(f"collective rules: entry {i}: unknown collective {op!r} (one of {OPS} or '*')")
        if alg != "native":
            a = get_algorithm(alg)  # raises naming the registered ones
            if op != "*" and op not in a.ops:
                raise ValueError(f"collective rules: entry {i}: algorithm {alg!r} does not implement {op} (it does {list(a.ops)})")
        mb = math.inf if max_bytes is None else float(max_bytes)
        if mb < 0:
            raise ValueError(f"collective rules: entry {i}: negative size bound {max_bytes}")
        out.append(Rule(op, mb, alg))
    return out


def format_rules(rules: Sequence[Rule]) -> str:
    """The rules as ``parse_rules`` reads them back; 'native' when there are none."""
    return ", ".join(str(r) for r in rules) or "native"
