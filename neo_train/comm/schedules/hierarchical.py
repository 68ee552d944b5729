"""Hierarchical (two-level) collectives over nodes of ``local_world_size`` ranks: inside the node
first, then across nodes, so fewer, larger messages cross the slower network.

all_reduce (G = ranks per node, N = nodes):
  1. ring reduce-scatter inside each node: local rank l ends with the node's sum of block l (n/G)
  2. ring all-reduce of block l across the N ranks with local index l (one per node)
  3. ring all-gather inside each node
  cost: intra reduce-scatter + inter all-reduce of n/G + intra all-gather.

all_to_all_v (blocks keep their exact sizes):
  1. intra-node pairwise exchange: rank (node n, local l) hands local peer (n, l') every block it
     has for ranks with local index l' (on any node): the blocks for (n, l') itself are final
  2. inter-node pairwise exchange among ranks with the same local index: (n, l') forwards to
     (m, l') everything from node n for (m, l'), in one message per peer node.
  Each inter-node message carries G blocks at once; a block crosses at most one intra and one
  inter link. Needs the whole size matrix (the executor exchanges split rows).

The node size comes from ``TopologyHint.local_world_size`` (W must be a multiple of it).
"""
from __future__ import annotations

from .registry import Algorithm, TopologyHint, near_equal, prefix, register_algorithm
from .ring import ring_all_gather, ring_reduce_scatter
from .schedule import Schedule

__all__ = ["Hierarchical"]


def _node_size(W: int, hint: TopologyHint) -> int:
    L = hint.local_world_size
    if L is None:
        raise ValueError("hierarchical: needs TopologyHint.local_world_size (ranks per node)")
    if L < 1 or W % L:
        raise ValueError(f"hierarchical: world size {W} is not a multiple of the node size {L}")
    return L


class Hierarchical(Algorithm):
    ops = ("all_to_all_v", "all_reduce")

    def build(self, op: str, world_size: int, rank_sizes, topology_hint: TopologyHint) -> Schedule:
        W = world_size
        L = _node_size(W, topology_hint)
        N = W // L
        s = Schedule.new(op, W, rank_sizes, self.name)
        if op == "all_reduce":
            self._all_reduce(s, L, N, rank_sizes[0])
        else:
            self._all_to_all(s, L, N, rank_sizes)
        s.round(0)
        return s

    @staticmethod
    def _all_reduce(s: Schedule, L: int, N: int, n: int) -> None:
        W = s.world_size
        seg = near_equal(n, L)
        P = prefix(seg)
        for name in ("acc", "part", "acc2"):
            s.add_buffer(name, [n] * W)
        nodes = [list(range(m * L, (m + 1) * L)) for m in range(N)]
        columns = [list(range(l, W, L)) for l in range(L)]
        r1 = r2 = r3 = 0
        for g in nodes:
            r1 = ring_reduce_scatter(s, 0, g, "in", "acc", "part", 0, seg, P)
        for l, g in enumerate(columns):
            sub = near_equal(seg[l], N)
            Q = prefix(sub)
            r2 = ring_reduce_scatter(s, r1, g, "part", "acc2", "out", P[l], sub, [P[l] + q for q in Q])
            r3 = ring_all_gather(s, r2, g, "out", P[l], sub)
        for g in nodes:
            ring_all_gather(s, r3, g, "out", 0, seg)

    @staticmethod
    def _all_to_all(s: Schedule, L: int, N: int, S) -> None:
        W = s.world_size
        send_off = [prefix(S[r]) for r in range(W)]
        recv_off = [prefix([S[i][r] for i in range(W)]) for r in range(W)]
        node, loc = (lambda r: r // L), (lambda r: r % L)
        for r in range(W):
            s.copy(0, r, "out", recv_off[r][r], "in", send_off[r][r], S[r][r])
        # step 1: inside the node; blocks bound elsewhere park in the receiver's 'stage' buffer
        fill = [0] * W
        parked: dict[tuple[int, int], tuple[int, int]] = {}  # (src, dst) -> (rank, offset) in 'stage'
        intra = []
        for k in range(1, L):
            for a in range(W):
                x = node(a) * L + (loc(a) + k) % L
                for b in range(loc(x), W, L):  # every rank with x's local index
                    if not S[a][b]:
                        continue
                    if b == x:
                        intra.append((k - 1, a, x, "out", recv_off[x][a], S[a][b], send_off[a][b]))
                    else:
                        intra.append((k - 1, a, x, "stage", fill[x], S[a][b], send_off[a][b]))
                        parked[a, b] = (x, fill[x])
                        fill[x] += S[a][b]
        s.add_buffer("stage", fill)
        for k, a, x, buf, off, n, src_off in intra:
            s.send(k, a, x, "in", src_off, buf, off, n)
        # step 2: across nodes, among ranks with the same local index
        base = L - 1
        for k in range(1, N):
            for x in range(W):
                y = ((node(x) + k) % N) * L + loc(x)
                for a in range(node(x) * L, node(x) * L + L):  # sources on x's node, in rank order
                    if not S[a][y]:
                        continue
                    if a == x:
                        s.send(base + k - 1, x, y, "in", send_off[x][y], "out", recv_off[y][a], S[a][y])
                    else:
                        holder, off = parked[a, y]
                        assert holder == x
                        s.send(base + k - 1, x, y, "stage", off, "out", recv_off[y][a], S[a][y])


register_algorithm("hierarchical", Hierarchical)
