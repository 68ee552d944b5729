"""Distributed parameter server (DPS): reduce-scatter and all-gather each as ONE all-to-all round.

Reduce-scatter: every rank sends segment j of its input straight to rank j, which sums the W
pieces in rank order (as the interface's default reduce_scatter_v does). All-gather: every rank
sends its block straight to every other rank. All-reduce = the two, so two dependent steps, each
a single round of W-1 messages per rank: what the ISI Opera/DLRM study ran on Opera, where an
all-to-all round rides the rotating direct circuits without multi-hop bandwidth tax.
"""
from __future__ import annotations

from typing import Sequence

from .registry import Algorithm, TopologyHint, near_equal, prefix, register_algorithm
from .schedule import Schedule

__all__ = ["DPS"]


def _reduce_scatter(s: Schedule, k: int, seg: Sequence[int], out_offsets: Sequence[int]) -> None:
    W, P = s.world_size, prefix(seg)
    s.add_buffer("rcv", [W * v for v in seg])
    for i in range(W):
        for j in range(W):
            if i != j:
                s.send(k, i, j, "in", P[j], "rcv", i * seg[j], seg[j])
    for j in range(W):  # sum in rank order: out = in_0 + in_1 + ... (piece i of j: rcv[i] or own in)
        pieces = [("in", P[j]) if i == j else ("rcv", i * seg[j]) for i in range(W)]
        s.copy(k, j, "out", out_offsets[j], *pieces[0], seg[j])
        for buf, off in pieces[1:]:
            s.reduce(k, j, "out", out_offsets[j], buf, off, seg[j])


def _all_gather(s: Schedule, k: int, seg: Sequence[int], src: str, src_offsets: Sequence[int]) -> None:
    W, P = s.world_size, prefix(seg)
    for i in range(W):
        for j in range(W):
            if i != j:
                s.send(k, i, j, src, src_offsets[i], "out", P[i], seg[i])


class DPS(Algorithm):
    ops = ("reduce_scatter_v", "all_gather_v", "all_reduce")

    def build(self, op: str, world_size: int, rank_sizes, topology_hint: TopologyHint) -> Schedule:
        W = world_size
        s = Schedule.new(op, W, rank_sizes, self.name)
        if op == "reduce_scatter_v":
            _reduce_scatter(s, 0, list(rank_sizes), [0] * W)
        elif op == "all_gather_v":
            seg = list(rank_sizes)
            _all_gather(s, 0, seg, "in", [0] * W)
            P = prefix(seg)
            for i in range(W):
                s.copy(0, i, "out", P[i], "in", 0, seg[i])
        else:
            seg = near_equal(rank_sizes[0], W)
            _reduce_scatter(s, 0, seg, prefix(seg))
            _all_gather(s, 1, seg, "out", prefix(seg))
        s.round(0)
        return s


register_algorithm("dps", DPS)
