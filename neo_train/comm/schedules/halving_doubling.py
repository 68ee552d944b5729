"""Recursive halving reduce-scatter + recursive doubling all-gather all-reduce (Rabenseifner).

With p = 2^k ranks: lg p halving rounds (exchange half of the current range with the partner at
distance p/2, p/4, ..., 1 and sum the kept half), after which rank v holds the sum of block v;
then lg p doubling rounds (distance 1, 2, ..., p/2) gather the blocks. Cost
2·lg p·α + 2((p-1)/p)·n·β + ((p-1)/p)·n·γ.

W not a power of two (the standard pre/post step): with p the largest power of two <= W and
rem = W - p, each even rank r < 2·rem first sends its whole vector to r+1, which sums it and
takes part as rank r//2 of the p-rank algorithm (ranks >= 2·rem take part as r - rem); the even
ranks sit out and get the finished result from r+1 in a last round.
"""
from __future__ import annotations

from .registry import Algorithm, TopologyHint, near_equal, prefix, register_algorithm
from .schedule import Schedule

__all__ = ["HalvingDoubling"]


class HalvingDoubling(Algorithm):
    ops = ("all_reduce",)

    def build(self, op: str, world_size: int, rank_sizes, topology_hint: TopologyHint) -> Schedule:
        W, n = world_size, rank_sizes[0]
        s = Schedule.new(op, W, rank_sizes, self.name)
        p = 1 << (W.bit_length() - 1)
        rem = W - p
        seg = near_equal(n, p)
        P = prefix(seg) + [n]
        old = [2 * v + 1 if v < rem else v + rem for v in range(p)]  # newrank -> rank
        s.add_buffer("acc", [n] * W)
        s.add_buffer("rcv", [n] * W)
        # round 0: fold the extra ranks in; every active rank starts its partial sum
        for r in range(0, 2 * rem, 2):
            s.send(0, r, r + 1, "in", 0, "rcv", 0, n)
        for v in range(p):
            s.copy(0, old[v], "acc", 0, "in", 0, n)
            if v < rem:
                s.reduce(0, old[v], "acc", 0, "rcv", 0, n)
        k = 1
        rng = [(0, p)] * p  # block range [lo, hi) each newrank is responsible for
        d = p // 2
        while d >= 1:
            nxt = []
            for v in range(p):
                lo, hi = rng[v]
                mid = (lo + hi) // 2
                keep, give = ((lo, mid), (mid, hi)) if not v & d else ((mid, hi), (lo, mid))
                s.send(k, old[v], old[v ^ d], "acc", P[give[0]], "rcv", P[give[0]], P[give[1]] - P[give[0]])
                s.reduce(k, old[v], "acc", P[keep[0]], "rcv", P[keep[0]], P[keep[1]] - P[keep[0]])
                nxt.append(keep)
            rng, d, k = nxt, d // 2, k + 1
        for v in range(p):  # rank v now holds the full sum of block v
            s.copy(k - 1, old[v], "out", P[v], "acc", P[v], seg[v])
        d = 1
        while d < p:
            for v in range(p):
                lo = v & ~(d - 1)
                s.send(k, old[v], old[v ^ d], "out", P[lo], "out", P[lo], P[lo + d] - P[lo])
            d, k = d * 2, k + 1
        for r in range(0, 2 * rem, 2):
            s.send(k, r + 1, r, "out", 0, "out", 0, n)
        return s


register_algorithm("halving_doubling", HalvingDoubling)
