"""Table-row-wise sharding: a table placed on one node, its rows split over that node's ranks
(Neo's "table-wise then row-wise"). Input dist and lookup are row-wise sharding's; the output
dist is hierarchical, so partial sums never cross the slow inter-node links:

    1. intra-node reduce-scatter: the node's ranks sum their partials; local rank l keeps the
       rows of the sources with local index l on every node (N*b rows)
    2. inter-node all-to-all among the ranks with the same local index: each node sends source
       n'L+l its b rows of the node's tables
    backward: the mirror all-to-all, then an intra-node all-gather of the gradient
"""
from __future__ import annotations

import torch

from ..comm import reduce_scatter_v
from .common import ColumnPermutation, flat_exchange
from .row_wise import RowWiseSharding

__all__ = ["TableRowWiseSharding"]


class TableRowWiseSharding(RowWiseSharding):
    def __init__(self, ctx, features) -> None:
        super().__init__(ctx, features)
        L = ctx.local_world_size
        N = ctx.world_size // L
        node_of = [f.plan.shards[0].rank // L for f in self.features]
        self.node_features = [[fi for fi in range(len(self.features)) if node_of[fi] == n] for n in range(N)]
        self.node_widths = [sum(self.dims[fi] for fi in fs) for fs in self.node_features]
        order = [fi for fs in self.node_features for fi in fs]  # received column order: node-major
        pos = {fi: i for i, fi in enumerate(order)}
        perm, starts, off = [], [], 0
        for fi in order:
            starts.append(off)
            off += self.dims[fi]
        for fi in range(len(self.features)):
            s = starts[pos[fi]]
            perm.extend(range(s, s + self.dims[fi]))
        self._perm = ColumnPermutation(perm)
        self.intra, self.cross = ctx.node_comms()

    def output_dist(self, pooled: torch.Tensor, b: int) -> torch.Tensor:
        W, L = self.ctx.world_size, self.ctx.local_world_size
        N = W // L
        node = self.ctx.rank // L
        mine = self.node_features[node]
        partial = self.partial_sums(pooled, W * b, mine)  # (W*b, D_node), rows by source rank
        D = partial.shape[1]
        # rows by source (n', l) -> by (l, n'): local rank l's segment is every node's source l
        by_local = partial.view(N, L, b, D).transpose(0, 1).reshape(W * b, D)
        summed = reduce_scatter_v(
            self.intra, by_local, [N * b] * L, self.ctx.fwd_codec, self.ctx.bwd_codec, "output_dist_intra"
        )  # (N*b, D_node): rows of sources (n', my local index) for n' = 0..N-1
        out = flat_exchange(
            self.cross, summed, b, self.node_widths, self.ctx.fwd_codec, self.ctx.bwd_codec, "output_dist_cross"
        )  # (b, sum over nodes D_node)
        return self._perm(out)
