"""Bruck all-to-all(-v): ceil(lg W) rounds; in round k every rank forwards, to rank r + 2^k, all
blocks whose remaining distance has bit k set, so each rank sends ONE message per round.

Cost lg W·α + (n/2)·lg W·β: fewer, larger messages than pairwise, each byte moved up to lg W
times. Uneven sizes: this implementation **carries the exact per-block sizes** (no padding to
the largest block): the builder knows the whole size matrix (the executor exchanges the split
rows once per call) and tracks where every (source, destination) block sits after each round, so
each round's message is exactly the blocks it forwards, packed back to back. Blocks land in a
scratch buffer per round (``r0``, ``r1``, ...) and go straight into ``out`` on their last hop;
the classic algorithm's two local rotations are thus folded into the addressing.
"""
from __future__ import annotations

from .registry import Algorithm, TopologyHint, prefix, register_algorithm
from .schedule import Schedule

__all__ = ["Bruck"]


class Bruck(Algorithm):
    ops = ("all_to_all_v",)

    def build(self, op: str, world_size: int, rank_sizes, topology_hint: TopologyHint) -> Schedule:
        W, S = world_size, rank_sizes
        s = Schedule.new(op, W, S, self.name)
        send_off = [prefix(S[r]) for r in range(W)]
        recv_off = [prefix([S[i][r] for i in range(W)]) for r in range(W)]
        # where each block (src, dst) sits now: (rank, buffer, offset)
        where = {(a, b): (a, "in", send_off[a][b]) for a in range(W) for b in range(W) if a != b and S[a][b]}
        for a in range(W):
            s.copy(0, a, "out", recv_off[a][a], "in", send_off[a][a], S[a][a])
        k = 0
        while (1 << k) < W:
            bit = 1 << k
            fill = [0] * W  # next free offset of r{k} on every rank
            moves = []
            for (a, b), (x, buf, off) in sorted(where.items()):
                p = (b - a) % W
                if not p & bit:
                    continue
                y = (x + bit) % W
                if p < 2 * bit:  # last hop: y == b
                    moves.append((a, b, x, buf, off, y, "out", recv_off[b][a]))
                else:
                    moves.append((a, b, x, buf, off, y, f"r{k}", fill[y]))
                    fill[y] += S[a][b]
            s.add_buffer(f"r{k}", fill)
            for a, b, x, buf, off, y, dbuf, doff in moves:
                s.send(k, x, y, buf, off, dbuf, doff, S[a][b])
                where[a, b] = (y, dbuf, doff)
            k += 1
        s.round(0)
        return s


register_algorithm("bruck", Bruck)
