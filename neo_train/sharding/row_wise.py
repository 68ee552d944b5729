"""Row-wise sharding: a table's rows split into contiguous ranges, one per rank.

    input dist   bucketize: each id goes to the rank whose range holds it, as a local row
                 (id - range start); every bag is sent to every owner (possibly empty there).
                 Mean pooling is folded into per-id weights 1/L with L the *whole* bag's length,
                 so the owners' partial sums add up to the mean.
    lookup       one fused-kernel call over the rank's row shards for the global batch (W*b bags)
    output dist  reduce-scatter of partial sums: rank i receives, for its b samples, the sum
                 over owners of their partial pooled vectors
    backward     all-gather of the pooled gradient (the mirror of the reduce-scatter); each owner
                 updates its rows in the kernel's backward
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..comm import reduce_scatter_v
from ..comm.autograd import all_to_all_v_async
from ..comm.awaitable import Pending
from .common import EmbeddingSharding, GroupFeature, Routed, Sends, ShardingContext, Unit, build_kernel

__all__ = ["RowWiseSharding"]


class RowWiseSharding(EmbeddingSharding):
    def __init__(self, ctx: ShardingContext, features: Sequence[GroupFeature]) -> None:
        super().__init__(ctx, features)
        W, r = ctx.world_size, ctx.rank
        # per feature: shards sorted by row range, and their ends for bucketization
        self.shards = [sorted(f.plan.shards, key=lambda s: s.row_start) for f in self.features]
        self._ends = [torch.tensor([s.row_end for s in sh], dtype=torch.int64) for sh in self.shards]
        self._starts = [torch.tensor([s.row_start for s in sh], dtype=torch.int64) for sh in self.shards]
        units = [Unit(i, s) for i, sh in enumerate(self.shards) for s in sh]
        self.units_by_rank: list[list[Unit]] = [[u for u in units if u.rank == j] for j in range(W)]
        mine = self.units_by_rank[r]
        keys: list[tuple[int, int]] = []
        table_of_unit = []
        for u in mine:
            key = (self.features[u.feature].table_index, u.shard.row_start)
            if key not in keys:
                keys.append(key)
            table_of_unit.append(keys.index(key))
        shard_list = []
        for key in keys:
            u = next(u for u in mine if (self.features[u.feature].table_index, u.shard.row_start) == key)
            f = self.features[u.feature]
            shard_list.append((f.table_index, f.table, u.shard))
        self._shard_list = shard_list
        # pooling is applied here (weights 1/L of the whole bag), so shard tables sum
        self.kernel = build_kernel(
            ctx, shard_list, table_of_unit, [f"{self.features[u.feature].name}@{u.shard.row_start}" for u in mine],
            pooling_in_kernel=False,
        )
        self._mine = mine
        self._any_mean = any(f.table.pooling == "mean" for f in self.features)

    # ---- input dist ---------------------------------------------------------------------------
    def bucketize(self, parts: dict, b: int) -> tuple[list[list[tuple]], bool]:
        """Per feature, per shard: (lengths (b,), local ids, weights or None)."""
        weighted = next(iter(parts.values()))[2] is not None or self._any_mean
        keyed = []
        for fi, f in enumerate(self.features):
            vals, lens, w = parts[f.name]
            K = len(self.shards[fi])
            lens64 = lens.to(torch.int64)
            bag = torch.repeat_interleave(torch.arange(b, device=vals.device), lens64, output_size=vals.numel())
            k = torch.searchsorted(self._ends[fi].to(vals.device), vals, right=True)
            local = vals - self._starts[fi].to(vals.device)[k]
            wts = None
            if weighted:
                wts = torch.ones(vals.numel(), device=vals.device) if w is None else w.to(torch.float32)
                if f.table.pooling == "mean":
                    wts = wts / lens64.clamp(min=1).to(torch.float32)[bag]
            key = k * b + bag
            order = torch.argsort(key, stable=True)
            counts = torch.bincount(key, minlength=K * b).view(K, b)
            keyed.append((local[order], wts[order] if wts is not None else None, counts))
        # ids per (feature, shard) for the host-side split: one device-to-host copy for all features
        per_k = torch.cat([c.sum(dim=1) for _, _, c in keyed]).tolist() if keyed else []
        out, at = [], 0
        for (local, wts, counts), sh in zip(keyed, self.shards):
            sizes = per_k[at : at + len(sh)]
            at += len(sh)
            lv = local.split(sizes)
            lw = wts.split(sizes) if wts is not None else [None] * len(sh)
            out.append([(counts[j].to(torch.int32), lv[j], lw[j]) for j in range(len(sh))])
        return out, weighted

    def input_sends(self, parts: dict, b: int) -> Sends:
        buckets, weighted = self.bucketize(parts, b)
        per_dest = []
        index = {(fi, s.row_start): j for fi, sh in enumerate(self.shards) for j, s in enumerate(sh)}
        for us in self.units_by_rank:
            items = [buckets[u.feature][index[(u.feature, u.shard.row_start)]] for u in us]
            per_dest.append(([x[0] for x in items], [x[1] for x in items], [x[2] for x in items] if weighted else None))
        return Sends(per_dest, len(self._mine), weighted)

    # ---- lookup -------------------------------------------------------------------------------
    def lookup(self, routed: Routed) -> torch.Tensor:
        if self.kernel is None:
            return torch.zeros(0, 0, device=self.ctx.device)
        return self.kernel(routed.values, routed.offsets(), routed.weights)  # (W*b, sum D of my units)

    def partial_sums(self, pooled: torch.Tensor, rows: int, features: Sequence[int]) -> torch.Tensor:
        """(rows, sum_{f in features} D_f): this rank's partial sums at each feature's columns,
        zeros where it holds no shard of the feature's table."""
        cols = []
        off = 0
        at: dict[int, tuple[int, int]] = {}
        for u in self._mine:
            d = self.features[u.feature].table.dim
            at[u.feature] = (off, d)
            off += d
        for fi in features:
            if fi in at:
                o, d = at[fi]
                cols.append(pooled[:, o : o + d])
            else:
                cols.append(torch.zeros(rows, self.dims[fi], device=self.ctx.device))
        out = torch.cat(cols, dim=1) if cols else torch.zeros(rows, 0, device=self.ctx.device)
        if not out.requires_grad:
            # a rank with no shard still joins the mirror collective in the backward
            out.requires_grad_(True)
        return out

    # ---- output dist --------------------------------------------------------------------------
    def output_dist(self, pooled: torch.Tensor, b: int) -> torch.Tensor:
        W = self.ctx.world_size
        partial = self.partial_sums(pooled, W * b, range(len(self.features)))  # (W*b, sum D)
        return reduce_scatter_v(
            self.ctx.comm, partial, [b] * W, self.ctx.fwd_codec, self.ctx.bwd_codec, "output_dist"
        )  # (b, sum D) in group order

    def compute_async(self, routed: Routed, b: int) -> Pending:
        """Lookup now; the reduce-scatter (an all-to-all of the partial-sum segments, summed on
        arrival) runs while the caller computes. Types with another output dist (TWRW) keep the
        synchronous path."""
        if type(self).output_dist is not RowWiseSharding.output_dist:
            return super().compute_async(routed, b)
        W = self.ctx.world_size
        partial = self.partial_sums(self.scaled_lookup(routed), W * b, range(len(self.features)))
        D = partial.shape[1]
        pending = all_to_all_v_async(self.ctx.comm, partial, [b] * W, [b] * W,
                                     self.ctx.fwd_codec, self.ctx.bwd_codec, "output_dist")

        def finish() -> torch.Tensor:
            with self.ctx.phase("output_dist"):
                return pending.wait().view(W, b, D).sum(dim=0)  # sum over owners, in rank order

        return Pending(finish)

    def local_shards(self):
        return [(t.name, s, self.kernel, i) for i, (_, t, s) in enumerate(self._shard_list)]
