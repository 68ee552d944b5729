"""Ring collectives: reduce-scatter-v, all-gather-v, and all-reduce = reduce-scatter + all-gather.

Each of the W-1 rounds of a ring passes one block to the next rank (r -> r+1); every round
depends on the one before. All-reduce cost: 2(W-1)·α + 2((W-1)/W)·n·β + ((W-1)/W)·n·γ, bandwidth
optimal on a tree. Each block of an all-reduce is summed on exactly one rank and then copied
around, so every replica gets bit-identical floats.

``ring_reduce_scatter`` and ``ring_all_gather`` work on any group of ranks and any region of a
buffer; ``hierarchical`` composes them (inside nodes, then across).
"""
from __future__ import annotations

from typing import Sequence

from .registry import Algorithm, TopologyHint, near_equal, prefix, register_algorithm
from .schedule import Schedule

__all__ = ["Ring", "ring_reduce_scatter", "ring_all_gather"]


def ring_reduce_scatter(
    s: Schedule,
    start: int,
    group: Sequence[int],
    contrib: str,
    acc: str,
    out: str,
    base: int,
    seg: Sequence[int],
    out_offsets: Sequence[int],
) -> int:
    """Member i of ``group`` ends with the sum over the group of ``contrib[base + P(i) : +seg[i]]``
    at ``out[out_offsets[i]:]``; ``acc`` holds partial sums at the same coordinates as
    ``contrib``. Uses rounds ``start ..``; returns the first round after them."""
    m, P = len(group), prefix(seg)
    if m == 1:
        g = group[0]
        s.copy(start, g, out, out_offsets[0], contrib, base + P[0], seg[0])
        return start + 1
    for k in range(m - 1):
        for i in range(m):
            b, j = (i - k - 1) % m, (i + 1) % m  # block b travels i -> j, gaining j's contribution
            src_buf = contrib if k == 0 else acc
            if k == m - 2:  # last hop: b == j, the receiver's own block, straight into out
                s.send(start + k, group[i], group[j], src_buf, base + P[b], out, out_offsets[j], seg[b])
                s.reduce(start + k, group[j], out, out_offsets[j], contrib, base + P[b], seg[b])
            else:
                s.send(start + k, group[i], group[j], src_buf, base + P[b], acc, base + P[b], seg[b])
                s.reduce(start + k, group[j], acc, base + P[b], contrib, base + P[b], seg[b])
    return start + m - 1


def ring_all_gather(
    s: Schedule,
    start: int,
    group: Sequence[int],
    buf: str,
    base: int,
    seg: Sequence[int],
    own: tuple[str, Sequence[int]] | None = None,
) -> int:
    """Member i holds block i at ``buf[base + P(i)]`` (or, when ``own=(buffer, offsets)``, at
    ``buffer[offsets[i]]``, copied into place here); afterwards every member holds every block.
    Returns the first round after the ones used."""
    m, P = len(group), prefix(seg)
    if own is not None:
        obuf, ooff = own
        for i in range(m):
            s.copy(start, group[i], buf, base + P[i], obuf, ooff[i], seg[i])
    for k in range(m - 1):
        for i in range(m):
            b, j = (i - k) % m, (i + 1) % m
            if k == 0 and own is not None:
                s.send(start, group[i], group[j], own[0], own[1][i], buf, base + P[b], seg[b])
            else:
                s.send(start + k, group[i], group[j], buf, base + P[b], buf, base + P[b], seg[b])
    return start + max(m - 1, 1)


class Ring(Algorithm):
    ops = ("all_reduce", "reduce_scatter_v", "all_gather_v")

    def build(self, op: str, world_size: int, rank_sizes, topology_hint: TopologyHint) -> Schedule:
        W = world_size
        s = Schedule.new(op, W, rank_sizes, self.name)
        ranks = list(range(W))
        if op == "all_gather_v":
            ring_all_gather(s, 0, ranks, "out", 0, list(rank_sizes), own=("in", [0] * W))
        elif op == "reduce_scatter_v":
            seg = list(rank_sizes)
            s.add_buffer("acc", [sum(seg)] * W)
            ring_reduce_scatter(s, 0, ranks, "in", "acc", "out", 0, seg, [0] * W)
        else:
            n = rank_sizes[0]
            seg = near_equal(n, W)
            s.add_buffer("acc", [n] * W)
            nxt = ring_reduce_scatter(s, 0, ranks, "in", "acc", "out", 0, seg, prefix(seg))
            ring_all_gather(s, nxt, ranks, "out", 0, seg)
        return s


register_algorithm("ring", Ring)
