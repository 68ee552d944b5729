"""Table-wise sharding: each table whole on one rank.

    input dist   every rank sends each feature's ids (all b bags) to the table's rank:
                 split sizes, then lengths, values (and weights) in one all-to-all each
    lookup       one fused-kernel call over the rank's tables for the global batch (W*b bags)
    output dist  all-to-all of pooled vectors: rows of source i go back to rank i
    backward     the mirror all-to-all brings each source's gradient to the owner; the fused
                 optimizer updates the rows inside the kernel's backward

Column-wise sharding is the same machinery with one unit per column shard (column_wise.py).
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..comm.awaitable import Pending
from .common import EmbeddingSharding, GroupFeature, Routed, Sends, ShardingContext, Unit, build_kernel, flat_exchange

__all__ = ["TableWiseSharding"]


class TableWiseSharding(EmbeddingSharding):
    def __init__(self, ctx: ShardingContext, features: Sequence[GroupFeature]) -> None:
        super().__init__(ctx, features)
        W, r = ctx.world_size, ctx.rank
        units = self.make_units()
        # units grouped by owner rank; within a rank in (feature, column) order
        self.units_by_rank: list[list[Unit]] = [[u for u in units if u.rank == j] for j in range(W)]
        self.widths = [sum(u.shard.cols for u in us) for us in self.units_by_rank]
        mine = self.units_by_rank[r]
        # this rank's kernel: one local table per distinct (table, shard), one local feature per unit
        keys: list[tuple[int, int, int]] = []
        table_of_unit: list[int] = []
        for u in mine:
            f = self.features[u.feature]
            key = (f.table_index, u.shard.row_start, u.shard.col_start)
            if key not in keys:
                keys.append(key)
            table_of_unit.append(keys.index(key))
        shards = []
        for key in keys:
            u = next(u for u in mine if (self.features[u.feature].table_index, u.shard.row_start, u.shard.col_start) == key)
            f = self.features[u.feature]
            shards.append((f.table_index, f.table, u.shard))
        self._shard_list = shards
        self.kernel = build_kernel(ctx, shards, table_of_unit, [f"{self.features[u.feature].name}@{u.shard.col_start}" for u in mine])
        # column permutation: received layout [source rank][unit] -> group feature order,
        # a feature's column shards in column order
        unit_at: dict[tuple[int, int], tuple[int, int]] = {}  # (feature, col_start) -> (offset, width)
        off = 0
        for us in self.units_by_rank:
            for u in us:
                unit_at[(u.feature, u.shard.col_start)] = (off, u.shard.cols)
                off += u.shard.cols
        perm: list[int] = []
        for key in sorted(unit_at):
            o, w = unit_at[key]
            perm.extend(range(o, o + w))
        self.register_buffer("_perm", torch.tensor(perm, dtype=torch.int64), persistent=False)

    def make_units(self) -> list[Unit]:
        """TW: one unit per feature, the table's single shard."""
        return [Unit(i, f.plan.shards[0]) for i, f in enumerate(self.features)]

    def input_sends(self, parts: dict, b: int) -> Sends:
        any_part = next(iter(parts.values()))
        weighted = any_part[2] is not None
        per_dest = []
        for us in self.units_by_rank:
            got = [parts[self.features[u.feature].name] for u in us]
            per_dest.append((
                torch.cat([g[1] for g in got]) if got else any_part[1].new_zeros(0),
                torch.cat([g[0] for g in got]) if got else any_part[0].new_zeros(0),
                (torch.cat([g[2] for g in got]) if got else any_part[2].new_zeros(0)) if weighted else None,
            ))
        return Sends(per_dest, len(self.units_by_rank[self.ctx.rank]), weighted)

    def lookup(self, routed: Routed) -> torch.Tensor:
        if self.kernel is None:  # a rank that owns no table of this group: nothing to look up
            return torch.zeros(0, 0, device=self.ctx.device)
        return self.kernel(routed.values, routed.offsets(), routed.weights)  # (W*b, D_me)

    def compute_async(self, routed: Routed, b: int) -> Pending:
        """Lookup now; the pooled all-to-all runs while the caller computes (the bottom MLP)."""
        pooled = self._pooled_or_empty(self.scaled_lookup(routed), b)
        pending = flat_exchange(self.ctx.comm, pooled, b, self.widths, self.ctx.fwd_codec, self.ctx.bwd_codec,
                                "output_dist", async_op=True)

        def finish() -> torch.Tensor:
            with self.ctx.phase("output_dist"):
                return pending.wait().index_select(1, self._perm)

        return Pending(finish)

    def _pooled_or_empty(self, pooled: torch.Tensor, b: int) -> torch.Tensor:
        if self.kernel is None:
            # requires_grad so this rank still joins the mirror all-to-all in the backward
            return torch.zeros(self.ctx.world_size * b, 0, device=self.ctx.device, requires_grad=True)
        return pooled

    def output_dist(self, pooled: torch.Tensor, b: int) -> torch.Tensor:
        pooled = self._pooled_or_empty(pooled, b)
        out = flat_exchange(self.ctx.comm, pooled, b, self.widths, self.ctx.fwd_codec, self.ctx.bwd_codec, "output_dist")
        return out.index_select(1, self._perm)  # (b, sum D_f) in group order

    def local_shards(self):
        return [(t.name, s, self.kernel, i) for i, (_, t, s) in enumerate(self._shard_list)]
