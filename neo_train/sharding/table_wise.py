"""Table-wise sharding: each table whole on one rank.

    input dist   every rank sends each feature's ids (all b bags) to the table's rank, in
                 the collection's one id exchange (lengths, values, weights: common.IdExchange)
    lookup       one fused-kernel call over the rank's tables for the global batch (W*b bags)
    output dist  all-to-all of pooled vectors: rows of source i go back to rank i
    backward     the mirror all-to-all brings each source's gradient to the owner; the fused
                 optimizer updates the rows inside the kernel's backward

Sparse output exchange (hot-row replication, notes/hot_rows.md). A feature whose table has
replicated hot rows sends its hot ids nowhere; a bag with no cold id pools to a row of zeros on
the owner, so its row skips the output exchange, forward and backward. Both sides know which
bags are skipped without any message: the owner from the cold lengths it received in the input
dist, the receiving rank from its own split of the batch before it. The exchange then carries
one row of D_u values per (unit, bag) sent, owner-side order [source][unit][bag] (a feature
without replication sends every bag), as chunks of g = gcd of the group's unit widths (one row
per chunk for the codecs; g = D when every table has the same dim); the receiver scatters them
into zeros, or adds them onto the replicas' pooled output when every feature is replicated (the
backward gathers the gradient rows of the sent bags, the owner scatters them into zeros). The
owner's lookup pools only the bags it sends, each unit's padded with empty bags to the most any
unit sends (the kernel wants one bag count per table). The split sizes and those bag counts
change per step: one device-to-host copy of them per step.

Column-wise sharding is the same machinery with one unit per column shard (column_wise.py).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ..comm.autograd import all_to_all_v_async
from ..comm.awaitable import Pending
from .common import (EmbeddingSharding, GroupFeature, ColumnPermutation, Routed, Sends, ShardingContext, Unit, build_kernel,
                     flat_exchange, positions_where, rows_of)

__all__ = ["TableWiseSharding"]


class _ScatterAddRows(torch.autograd.Function):
    """rows (n, g) added in place onto ``base`` (b, C g) at chunks ``at`` of its (b C, g) view,
    which is returned: a fresh zero tensor (the received cold rows at their places), or the
    replicas' pooled output when both are laid out like the collection's output (every feature
    of the plan replicated: a zero fill and a full-width add saved; the sums are the same, a + b
    == b + a). ``base`` must not be a view of another tensor (``zeros(b C, g)...view(b, C g)``
    would be): an in-place add onto the result (``ColumnAssembly``) would then make autograd copy
    the whole gradient back and forth (``CopySlices``). Backward: ``base`` gets the gradient
    itself, the rows their chunks' gradients."""

    @staticmethod
    def forward(ctx, base, rows, at):  # type: ignore[override]
        ctx.save_for_backward(at)
        ctx.g = g = rows.shape[1]
        base.view(-1, g).index_add_(0, at, rows)
        ctx.mark_dirty(base)
        return base

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (at,) = ctx.saved_tensors
        rows, per = rows_of(grad, ctx.g)  # a view of the interaction's gradient slice, no copy
        C = grad.shape[1] // ctx.g
        if per != C:
            at = (at // C) * per + at % C
        return grad if ctx.needs_input_grad[0] else None, rows.index_select(0, at), None


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
        self._unit_col: dict[tuple[int, int], int] = {}  # (feature, col_start) -> its column in group order
        for key in sorted(unit_at):
            o, w = unit_at[key]
            self._unit_col[key] = len(perm)
            perm.extend(range(o, o + w))
        self._perm = ColumnPermutation(perm)
        self.hot_features: frozenset[str] = frozenset()  # features split by hot-row replication
        self._sparse_index: dict[int, tuple[torch.Tensor, ...]] = {}  # b -> the sparse exchange's static indices
        self._not_hot: torch.Tensor | None = None

    # ---- the sparse output exchange (hot-row replication) ---------------------------------------
    def set_hot_features(self, names) -> None:
        """The group's features whose hot ids are replicated (fixed for the collection's life):
        their bags with no cold id skip the output exchange."""
        self.hot_features = frozenset(n for n in names if n in self.feature_names)
        self._sparse_index = {}
        self._not_hot = None

    @property
    def sparse_output(self) -> bool:
        return bool(self.hot_features)

    def local_out_mask(self, parts: dict, b: int) -> torch.Tensor:
        """(F, b) bool: the bags of this rank's batch whose pooled rows come back (F = the group's
        features): a replicated feature's bags with a cold id, every bag of the others."""
        rows = []
        for f in self.feature_names:
            lens = parts[f][1]
            rows.append(lens > 0 if f in self.hot_features else torch.ones(b, dtype=torch.bool, device=lens.device))
        return torch.stack(rows) if rows else torch.zeros(0, b, dtype=torch.bool)

    def _chunk(self) -> int:
        ws = [u.shard.cols for us in self.units_by_rank for u in us if u.shard.cols]
        return math.gcd(*ws) if ws else 1

    def _unit_not_hot(self) -> torch.Tensor:
        """(U_me,) bool: this rank's units whose feature has no replication (every bag is sent)."""
        if self._not_hot is None:
            self._not_hot = torch.tensor([self.features[u.feature].name not in self.hot_features
                                          for u in self.units_by_rank[self.ctx.rank]], dtype=torch.bool,
                                         device=self.ctx.device)  # fmt: skip
        return self._not_hot

    def _indices(self, b: int) -> tuple[torch.Tensor, ...]:
        """Static per local batch size b (g = the chunk width):
            send_col   (P,) chunk of its row of the owner's pooled output (the row: the bag's,
                       ``crow``), for each send position in [source][unit][bag][chunk] order
            send_mask  (P,) index of the position's (unit, source, bag) in the routed lengths
            send_peer  (P,) the position's destination (source rank)
            recv_at    (Q,) chunk of the (b, sum widths) output in group feature order, for
                       each receive position in [owner][unit][bag][chunk] order
            recv_mask  (Q,) index of the position's (feature, bag) in ``local_out_mask``
            recv_peer  (Q,) the position's owner rank"""
        got = self._sparse_index.get(b)
        if got is not None:
            return got
        W, r, g = self.ctx.world_size, self.ctx.rank, self._chunk()
        dev = self.ctx.device
        mine = self.units_by_rank[r]
        ar_b = torch.arange(b, dtype=torch.int64)
        send_col, send_mask, send_peer = [], [], []
        for s in range(W):
            off = 0
            for ui, u in enumerate(mine):
                n = u.shard.cols // g
                c = torch.arange(n, dtype=torch.int64)
                send_col.append((off // g + c).repeat(b))
                send_mask.append(((ui * W + s) * b + ar_b).repeat_interleave(n))
                send_peer.append(torch.full((b * n,), s, dtype=torch.int64))
                off += u.shard.cols
        C_tot = sum(self.widths) // g
        recv_at, recv_mask, recv_peer = [], [], []
        for j, us in enumerate(self.units_by_rank):
            for u in us:
                n = u.shard.cols // g
                c = torch.arange(n, dtype=torch.int64)
                col = self._unit_col[(u.feature, u.shard.col_start)]  # straight into group order: no permutation after
                recv_at.append((ar_b[:, None] * C_tot + col // g + c[None, :]).reshape(-1))
                recv_mask.append((u.feature * b + ar_b).repeat_interleave(n))
                recv_peer.append(torch.full((b * n,), j, dtype=torch.int64))
        cat = lambda xs: (torch.cat(xs) if xs else torch.zeros(0, dtype=torch.int64)).to(dev)  # noqa: E731
        got = tuple(cat(x) for x in (send_col, send_mask, send_peer, recv_at, recv_mask, recv_peer))
        self._sparse_index[b] = got
        return got

    def _sparse_exchange(self, routed: Routed, b: int, onto: Callable[[], torch.Tensor] | None = None) -> Pending:
        """Lookup and output dist of the rows of bags with a cold id only (module docstring).

        The lookup runs over those bags only: a replicated feature's bags without a cold id hold
        no ids, so dropping them from the lengths (the values stay as they are) gives each unit
        n_u bags; the kernel wants one bag count per table, so every unit is padded with empty
        bags to B' = max n_u (at Zipf 1.05 one-hot, about a quarter of the W b bags the full
        lookup pools, zero-fills and takes the gradient of). ``crow`` maps a routed bag to its
        row of the compacted output. ``onto``: gives a (b, C g) tensor in group order (the
        replicas' output) that the received rows are added onto, in place, instead of zeros."""
        W, r, g = self.ctx.world_size, self.ctx.rank, self._chunk()
        send_col, send_mask, send_peer, recv_at, recv_mask, recv_peer = self._indices(b)
        dev = self.ctx.device
        # the owner's mask, (U, W b) in routed order: a replicated feature's bags with a cold id
        U = len(self.units_by_rank[r])
        owner = (routed.lengths.view(U, W * b) > 0) | self._unit_not_hot()[:, None]
        sm = owner.view(-1).index_select(0, send_mask)
        local = routed.out_mask
        assert local is not None, "a sparse output exchange needs the receiving side's mask (local_out_mask)"
        rm = local.to(dev).reshape(-1).index_select(0, recv_mask)
        counts = torch.zeros(2 * W + U, dtype=torch.int64, device=dev)
        counts.index_add_(0, send_peer, sm.to(torch.int64))
        counts.index_add_(0, recv_peer + W, rm.to(torch.int64))
        counts[2 * W:] = owner.sum(1)
        n = counts.tolist()  # the one host sync: both sides' split sizes and the bags each unit looks up
        ins, outs = [x * g for x in n[:W]], [x * g for x in n[W:2 * W]]
        rows = max(n[2 * W:], default=0)
        crow = torch.cumsum(owner, 1).sub_(1)  # (U, W b) int64: the bag's row in the compacted lookup
        if U:
            rows = max(rows, 1)  # no kernel call with zero bags
            kept = positions_where(owner.view(-1), sum(n[2 * W:]))
            at_row = crow.view(-1).index_select(0, kept) + kept.div(W * b, rounding_mode="floor") * rows
            lengths = routed.lengths.new_zeros(U * rows).index_copy_(0, at_row, routed.lengths.index_select(0, kept))
            routed = Routed(routed.values, lengths, routed.weights, routed.out_mask)
        pooled = self._pooled_or_empty(self.scaled_lookup(routed, scale=False), rows)  # (rows, D_me)
        # the 1/W scales the gradients of the rows sent only (the rest are zeros)
        sent = positions_where(sm, sum(n[:W]))
        C_me = self.widths[r] // g
        at_send = crow.view(-1).index_select(0, send_mask.index_select(0, sent)) * C_me + send_col.index_select(0, sent)
        send = self.scale_grad(pooled.reshape(-1, g).index_select(0, at_send).reshape(-1))
        pending = all_to_all_v_async(self.ctx.comm, send, ins, outs, self.ctx.fwd_codec, self.ctx.bwd_codec,
                                     "output_dist", ([g] * W, [g] * W))  # fmt: skip
        at = recv_at.index_select(0, positions_where(rm, sum(n[W:2 * W])))
        C_tot = sum(self.widths) // g

        def finish() -> torch.Tensor:
            with self.ctx.phase("output_dist"):
                # at their places in group order (no permutation after), into zeros or onto ``onto``
                got = pending.wait().view(-1, g)
                base = got.new_zeros(b, C_tot * g) if onto is None else onto().contiguous()
                return _ScatterAddRows.apply(base, got, at)

        return Pending(finish)

    def make_units(self) -> list[Unit]:
        """TW: one unit per feature, the table's single shard."""
        return [Unit(i, f.plan.shards[0]) for i, f in enumerate(self.features)]

    def input_sends(self, parts: dict, b: int) -> Sends:
        any_part = next(iter(parts.values()))
        weighted = any_part[2] is not None
        per_dest = []
        for us in self.units_by_rank:
            got = [parts[self.features[u.feature].name] for u in us]
            per_dest.append(([g[1] for g in got], [g[0] for g in got], [g[2] for g in got] if weighted else None))
        mask = self.local_out_mask(parts, b) if self.sparse_output else None
        return Sends(per_dest, len(self.units_by_rank[self.ctx.rank]), weighted, mask)

    def lookup(self, routed: Routed) -> torch.Tensor:
        if self.kernel is None:  # a rank that owns no table of this group: nothing to look up
            return torch.zeros(0, 0, device=self.ctx.device)
        return self.kernel(routed.values, routed.offsets(), routed.weights)  # (W*b, D_me)

    def compute_async(self, routed: Routed, b: int, onto: Callable[[], torch.Tensor] | None = None) -> Pending:
        """Lookup now; the pooled all-to-all runs while the caller computes (the bottom MLP).
        ``onto`` (the sparse exchange only): the received rows are added onto what it gives."""
        if self.sparse_output:
            return self._sparse_exchange(routed, b, onto)
        assert onto is None, "only the sparse output exchange adds its rows onto another output"
        pooled = self._pooled_or_empty(self.scaled_lookup(routed), self.ctx.world_size * b)
        pending = flat_exchange(self.ctx.comm, pooled, b, self.widths, self.ctx.fwd_codec, self.ctx.bwd_codec,
                                "output_dist", async_op=True)

        def finish() -> torch.Tensor:
            with self.ctx.phase("output_dist"):
                return self._perm(pending.wait())

        return Pending(finish)

    def _pooled_or_empty(self, pooled: torch.Tensor, rows: int) -> torch.Tensor:
        if self.kernel is None:
            # requires_grad so this rank still joins the mirror all-to-all in the backward
            return torch.zeros(rows, 0, device=self.ctx.device, requires_grad=True)
        return pooled

    def output_dist(self, pooled: torch.Tensor, b: int) -> torch.Tensor:
        pooled = self._pooled_or_empty(pooled, self.ctx.world_size * b)
        out = flat_exchange(self.ctx.comm, pooled, b, self.widths, self.ctx.fwd_codec, self.ctx.bwd_codec, "output_dist")
        return self._perm(out)  # (b, sum D_f) in group order

    def local_shards(self):
        return [(t.name, s, self.kernel, i) for i, (_, t, s) in enumerate(self._shard_list)]
