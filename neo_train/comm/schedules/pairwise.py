"""Pairwise exchange (linear shift) all-to-all-v: in round k = 1..W-1 rank r sends its block for
r+k and receives the block of r-k (mod W); its own block is a local copy.

W-1 rounds of one message per rank, each block moved once: cost (W-1)·α + n·β (n = all a rank
sends). The steps of rank r depend only on row r and column r of the size matrix, so the executor
needs no split-size exchange; the rounds are independent of each other, so it runs them as one
batch (as gloo's own all-to-all does).
"""
from __future__ import annotations

from .registry import Algorithm, TopologyHint, prefix, register_algorithm
from .schedule import Schedule

__all__ = ["Pairwise"]


class Pairwise(Algorithm):
    ops = ("all_to_all_v",)
    local_sizes_only = True

    def build(self, op: str, world_size: int, rank_sizes, topology_hint: TopologyHint) -> Schedule:
        W, S = world_size, rank_sizes
        s = Schedule.new(op, W, S, self.name)
        send_off = [prefix(S[r]) for r in range(W)]
        recv_off = [prefix([S[i][r] for i in range(W)]) for r in range(W)]
        for k in range(1, W):
            for r in range(W):
                d = (r + k) % W
                s.send(k - 1, r, d, "in", send_off[r][d], "out", recv_off[d][r], S[r][d])
        last = max(W - 2, 0)
        for r in range(W):
            s.copy(last, r, "out", recv_off[r][r], "in", send_off[r][r], S[r][r])
        return s


register_algorithm("pairwise", Pairwise)
