"""Data-parallel embeddings: small tables replicated on every rank.

    input dist   none (no exchange): each rank looks up its own b samples
    lookup       one fused-kernel call over the replicas (no update in the forward)
    output dist  nothing
    backward     each rank sums its ids' gradients into one row per touched row (its "touched
                 rows": a few per table); the ranks sum those over ranks by the cheaper of two
                 exchanges, chosen alike on every rank from every rank's counts; then every
                 replica applies the fused optimizer to the globally touched rows with the
                 globally summed gradient, identically, so the replicas never drift

The two gradient exchanges (T tables of R_t x D_t in the group, D = max D_t, n_j = the rows
rank j touched over all tables, c = id columns: 1 (int32 ids) or 2 (int64)):

    dense   all_reduce of a (sum R_t D_t + sum R_t + W T) float32 buffer: every row's gradient,
            a touched mark per row, and every rank's (T,) counts (rank r fills row r of a (W, T)
            block). Wire bytes per rank (ring): 2 (W - 1) / W * 4 (sum R_t (D_t + 1) + W T)
    sparse  all_gather_v of the (T,) counts (``dp_grad_counts``), then all_gather_v of each
            rank's (n_j, D + c) float32 rows (gradient, id bits; ``dp_grad_sparse``), summed
            on every rank in rank order. Wire bytes per rank: (W - 1) * max_j n_j * 4 (D + c)
            (all_gather_v pads every block to the largest; the counts' 8 T W left out)

Every rank ends a step knowing every rank's counts, so all decide alike: after a sparse step (and
at the first) the next one exchanges the counts first and takes the cheaper exchange for its own
counts; after a dense step, the next one is dense at once, its counts riding in the all-reduce
(one collective a step while dense stays cheaper, as before this choice existed; a switch back to
sparse comes one step late, which costs bytes, never exactness). Either way the step reads the
counts to the host once: the only device-to-host copy in this backward (everything else has
sizes the host knows). The sparse sum is bit-identical on every rank: every rank sees the same
gathered rows and adds them in rank order, each rank's rows at distinct positions (a rank sends a
row once), so not even atomics can reorder it. Tags: ``dp_grad_counts``, ``dp_grad_sparse``,
``dp_grad_allreduce``.

The update is applied by replaying the kernel: a batch with one bag per row, backward with that
row's summed gradient. Every backend supports it through its public interface, and the optimizer
sees exactly the row gradients of the unsharded model. The replay's sizes are upper bounds the
host already knows (sum_j of the ranks' counts per table), not the number of distinct rows (that
would be a second device-to-host copy): a row that several ranks sent is replayed once with its
sum and once more per extra sender with a gradient of exact zeros; the kernel sums a row's bags
before it updates the row (as for any id repeated in a batch), and g + 0 == g, so the update is
the same as with one bag per row.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..data.batch import SparseFeatures
from .common import EmbeddingSharding, GroupFeature, ShardingContext, build_kernel

__all__ = ["DataParallelSharding", "GRAD_SYNCS"]

GRAD_SYNCS = ("auto", "dense", "sparse")  # DataParallelSharding.grad_sync


def _group_equal_keys(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Equal keys as one group each: (the keys sorted, whether each sorted key starts a group,
    each sorted key's group index, each input key's group index). Groups are numbered in key
    order; no device-to-host copy."""
    skey, order = torch.sort(key)
    first = torch.ones(key.numel(), dtype=torch.bool, device=key.device)
    first[1:] = skey[1:] != skey[:-1]
    seg = torch.cumsum(first, 0) - 1
    return skey, first, seg, torch.empty_like(seg).index_copy_(0, order, seg)


class _DataParallelLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, group, values, offsets, weights):  # type: ignore[override]
        ctx.group = group
        ctx.saved = (values, offsets, weights)
        with torch.no_grad():
            return group.kernel(values, offsets, weights)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.group.apply_global_update(grad, *ctx.saved)
        ctx.saved = None
        return torch.zeros((), device=grad.device), None, None, None, None


class DataParallelSharding(EmbeddingSharding):
    def __init__(self, ctx: ShardingContext, features: Sequence[GroupFeature]) -> None:
        super().__init__(ctx, features)
        tables: list[int] = []
        for f in self.features:
            if f.table_index not in tables:
                tables.append(f.table_index)
        self._tables = tables
        table_of_feature = [tables.index(f.table_index) for f in self.features]
        self._table_of_feature = table_of_feature
        shards = []
        for ti in tables:
            f = next(f for f in self.features if f.table_index == ti)
            shards.append((ti, f.table, next(s for s in f.plan.shards if s.rank == ctx.rank)))
        self._shard_list = shards
        self.kernel = build_kernel(ctx, shards, table_of_feature, self.feature_names, cacheable=False)
        # an input that requires grad, so autograd runs the backward (the global update); on the
        # kernel's device, so the backward never copies between devices
        self._anchor = torch.zeros((), device=ctx.device, requires_grad=True)
        offs = [0]
        for d in self.dims:
            offs.append(offs[-1] + d)
        self._col = offs
        # the gradient exchange's layout: table t's rows are the keys row_off[t] .. row_off[t+1]-1
        # of one key space, so one sort orders every table's rows, table by table
        self._rows = [s.rows for _, _, s in shards]
        self._dims = [s.cols for _, _, s in shards]
        self._dmax = max(self._dims)
        row_off = [0]
        for r in self._rows:
            row_off.append(row_off[-1] + r)
        self._row_off = row_off
        self._row_off_t = torch.tensor(row_off, dtype=torch.int64, device=ctx.device)
        self._feature_key_base = self._row_off_t[torch.tensor(table_of_feature, dtype=torch.int64, device=ctx.device)]
        self._id_cols = 1 if row_off[-1] < 2**31 else 2  # an int32 id is one float32 column of bits
        # the replay puts table t's rows in its first feature; tables are numbered in order of
        # their first feature, so the replay's values follow feature order when taken table by table
        self._first = [table_of_feature.index(t) for t in range(len(tables))]
        self._uniform = all(d == self._dmax for d in self._dims)
        self._dims_t = torch.tensor(self._dims, dtype=torch.int64, device=ctx.device)
        grad_off = [0]
        for r, d in zip(self._rows, self._dims):
            grad_off.append(grad_off[-1] + r * d)
        self._grad_off_t = torch.tensor(grad_off[:-1], dtype=torch.int64, device=ctx.device)  # table t's first value
        self.grad_sync = "auto"  # "dense" / "sparse" force one exchange (tests, benchmarks)
        self.last_grad_sync = ""  # the exchange the last backward used
        self._dense_next = False  # auto: the last step's counts chose dense (no counts exchange)

    def input_sends(self, parts: dict, b: int) -> None:
        return None  # no exchange: each rank looks up its own b samples

    def local_input(self, parts: dict, b: int) -> SparseFeatures:
        return SparseFeatures.from_features({n: parts[n] for n in self.feature_names}, batch_size=b)

    def lookup(self, sparse: SparseFeatures) -> torch.Tensor:
        return _DataParallelLookup.apply(self._anchor, self, sparse.values, sparse.offsets(), sparse.weights)

    def output_dist(self, pooled: torch.Tensor, b: int) -> torch.Tensor:
        return pooled

    # ---- the backward: sum the row gradients over ranks, update every replica alike ----------
    def apply_global_update(self, grad: torch.Tensor, values, offsets, weights) -> None:
        """grad (b, sum D_f): sum the touched rows' gradients over ranks (dense or sparse, chosen
        alike on every rank), then update every replica alike. One device-to-host copy."""
        if self.grad_sync not in GRAD_SYNCS:
            raise ValueError(f"data-parallel grad_sync must be one of {GRAD_SYNCS}, got {self.grad_sync!r}")
        comm, W, T = self.ctx.comm, self.ctx.world_size, len(self._rows)
        keys, rows, counts = self._local_rows(grad, values, offsets, weights)
        every = None
        if self.grad_sync == "dense" or (self.grad_sync == "auto" and self._dense_next):
            how = "dense"  # the last step's counts chose dense: this step's counts ride in its all-reduce
        else:
            every = comm.all_gather_v(counts, [T] * W, tag="dp_grad_counts").view(W, T).tolist()
            how = "sparse" if self.grad_sync == "sparse" or self._sparse_cheaper(every) else "dense"
        if how == "sparse":
            summed = self._sparse_sum(keys, rows, every)
        else:
            summed, every = self._dense_sum(keys, rows, counts, every)
        self.last_grad_sync = how
        self._dense_next = not self._sparse_cheaper(every)
        self._replay(summed)

    def _sparse_cheaper(self, every: list[list[int]]) -> bool:
        """Whether the sparse exchange of these (W, T) counts moves no more wire bytes per rank
        than the dense all-reduce (the module docstring's formulas)."""
        W = self.ctx.world_size
        dense = 2 * (W - 1) / W * 4 * (sum(r * (d + 1) for r, d in zip(self._rows, self._dims)) + W * len(self._rows))
        sparse = (W - 1) * max(sum(c) for c in every) * 4 * (self._dmax + self._id_cols)
        return sparse <= dense

    def _local_rows(self, grad: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor, weights):
        """This rank's touched rows, sorted by key (table by table, ascending ids), with their
        summed gradients: keys (M,) int64, rows (M, D) float32 (D = the largest dim; a narrower
        table's rows are zero-padded), and the per-table counts (T,) int64 on the device. Only the
        first sum(counts) entries are rows, the rest key 0 and zeros; M = the batch's ids N, or
        the group's rows R when R <= N (no device-to-host copy either way)."""
        F, b, N = len(self.features), grad.shape[0], values.numel()
        dev = grad.device
        psw = self.kernel.effective_weights(offsets, weights, N)
        lengths = offsets[1:] - offsets[:-1]
        bag = torch.repeat_interleave(torch.arange(F * b, device=dev), lengths, output_size=N)  # f * b + sample
        if self._uniform:  # grad (b, F*D) as (b*F, D): bag f*b+s is row s*F+f
            g = grad.reshape(b * F, self._dmax).index_select(0, (bag % b) * F + bag // b)
        else:
            pad = grad.new_zeros(F, b, self._dmax)
            for fi, d in enumerate(self.dims):
                pad[fi, :, :d] = grad[:, self._col[fi] : self._col[fi + 1]]
            g = pad.view(F * b, self._dmax).index_select(0, bag)
        g = g.float()
        if psw is not None:
            g = g * psw.unsqueeze(1)
        key = self._feature_key_base.repeat_interleave(b, output_size=F * b).index_select(0, bag) + values.to(torch.int64)
        if self._row_off[-1] <= N:  # few rows (hot-row replicas): sum straight into every row
            return self._local_rows_dense(key, g)
        return self._local_rows_sorted(key, g)

    def _local_rows_sorted(self, key: torch.Tensor, g: torch.Tensor):
        """``_local_rows`` by sorting the ids' keys: N = key.numel() entries."""
        N, dev = key.numel(), key.device
        skey, first, seg, pos = _group_equal_keys(key)  # pos: the row each id sums into
        keys = torch.zeros(N, dtype=torch.int64, device=dev).scatter_(0, seg, skey)
        rows = torch.zeros(N, self._dmax, device=dev).index_add_(0, pos, g)
        # distinct keys below each table's first key: seg[i - 1] + 1, i = that key's sorted position
        below = torch.cat([seg.new_zeros(1), seg + 1]).index_select(0, torch.searchsorted(skey, self._row_off_t))
        return keys, rows, below.diff()

    def _local_rows_dense(self, key: torch.Tensor, g: torch.Tensor):
        """``_local_rows`` when the group has no more rows R than the batch has ids (hot-row
        replicas): no sort; each id's gradient added into a (R, D) buffer of every row (in id
        order, as the sorted path adds them: the same sums), the touched rows read off a mark per
        row. R entries; past the touched rows, key 0 and zero rows (as the sorted path's tail)."""
        R, dev = self._row_off[-1], key.device
        every_row = torch.zeros(R, self._dmax, device=dev).index_add_(0, key, g)
        touched = torch.zeros(R, dtype=torch.bool, device=dev).index_fill_(0, key, True)
        below = torch.cat([key.new_zeros(1), torch.cumsum(touched, 0)]).index_select(0, self._row_off_t)
        keys = torch.nonzero_static(touched, size=R, fill_value=0).flatten()
        real = torch.arange(R, device=dev) < below[-1]
        rows = every_row.index_select(0, keys).masked_fill_(~real.unsqueeze(1), 0.0)
        return keys, rows, below.diff()

    def _sparse_sum(self, keys, rows, every: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """all_gather_v every rank's touched rows (gradient and id bits, one float32 tensor), then
        sum them on every rank in rank order. Per table: (ids (N_t,), gradients (N_t, D_t)),
        N_t = sum_j every[j][t], a row sent by several ranks once with its sum, then zeros."""
        W, D, c = self.ctx.world_size, self._dmax, self._id_cols
        n = [sum(x) for x in every]
        mine = n[self.ctx.rank]
        ids = keys[:mine].to(torch.int32 if c == 1 else torch.int64).view(torch.float32).view(mine, c)
        got = self.ctx.comm.all_gather_v(torch.cat([rows[:mine], ids], 1), n, tag="dp_grad_sparse")  # (M, D + c)
        gkey = got[:, D:].contiguous().view(torch.int32 if c == 1 else torch.int64).flatten().to(torch.int64)
        M = gkey.numel()
        skey, first, seg, pos = _group_equal_keys(gkey)  # received row i sums into pos[i]
        acc = got.new_zeros(M + 1, D)  # row M stays zero
        start = 0
        for j in range(W):  # rank order; a rank's positions are distinct, so each add is race-free
            acc.index_add_(0, pos[start : start + n[j]], got[start : start + n[j], :D])
            start += n[j]
        summed = acc.index_select(0, torch.where(first, seg, M))  # a repeated row: zeros
        out, start = [], 0
        for t, (off, d) in enumerate(zip(self._row_off, self._dims)):
            m = sum(x[t] for x in every)
            out.append((skey[start : start + m] - off, summed[start : start + m, :d]))
            start += m
        return out

    def _dense_sum(self, keys, rows, counts, every: list[list[int]] | None = None
                   ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[list[int]]]:  # fmt: skip
        """all_reduce one float32 buffer: every table's (R_t, D_t) gradients, (R_t,) touched marks
        and the (W, T) counts (rank r fills row r). Per table: the touched rows (ids (N_t,),
        gradients (N_t, D_t)), N_t = min(R_t, sum_j every[j][t]) slots, the slots past the touched
        rows filled with the first touched row and zeros; and the counts (read from the buffer,
        the one device-to-host copy, unless ``every`` came from the counts exchange already)."""
        W, T, rank = self.ctx.world_size, len(self._rows), self.ctx.rank
        marks0 = sum(r * d for r, d in zip(self._rows, self._dims))
        counts0 = marks0 + self._row_off[-1]
        end = counts0 + W * T
        # entries past this rank's rows have key 0 and zero rows: they add zeros to row 0 of table 0
        flat = rows.new_zeros(end + (0 if self._uniform else 1))  # + a slot for narrower tables' padding
        if self._uniform:
            flat[:marks0].view(self._row_off[-1], self._dmax).index_add_(0, keys, rows)
        else:
            t = torch.searchsorted(self._row_off_t[1:], keys, right=True)
            base = self._grad_off_t[t] + (keys - self._row_off_t[t]) * self._dims_t[t]  # a row's first value
            col = torch.arange(self._dmax, device=keys.device)
            at = torch.where(col < self._dims_t[t].unsqueeze(1), base.unsqueeze(1) + col, end)
            flat.index_add_(0, at.flatten(), rows.flatten())
        real = (torch.arange(keys.numel(), device=keys.device) < counts.sum()).to(flat.dtype)
        flat[marks0:counts0].index_add_(0, keys, real)
        flat[counts0 + rank * T : counts0 + (rank + 1) * T] = counts.to(flat.dtype)
        self.ctx.comm.all_reduce(flat, tag="dp_grad_allreduce")
        if every is None:
            every = flat[counts0:end].view(W, T).to(torch.int64).tolist()
        out, g_off = [], 0
        for t, (off, r, d) in enumerate(zip(self._row_off, self._rows, self._dims)):
            grads = flat[g_off : g_off + r * d].view(r, d)
            g_off += r * d
            m = min(r, sum(x[t] for x in every))
            if m == 0:
                out.append((keys.new_zeros(0), grads[:0]))
                continue
            slot = torch.nonzero_static(flat[marks0 + off : marks0 + off + r] > 0, size=m, fill_value=-1).flatten()
            real = slot >= 0
            slot = torch.where(real, slot, slot[0])  # m > 0: some rank touched a row, so slot[0] is one
            out.append((slot, torch.where(real.unsqueeze(1), grads.index_select(0, slot), 0.0)))
        return out, every

    def _replay(self, summed: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Apply the fused update: one bag per (row, gradient) entry, in the first feature of the
        row's table; backward with the summed gradients."""
        F = len(self.features)
        dev = self._anchor.device
        B = max(1, max(ids.numel() for ids, _ in summed))
        lens = torch.zeros(F, B, dtype=torch.int64, device=dev)
        g_out = torch.zeros(B, self._col[-1], device=dev)
        for t, (ids, g) in enumerate(summed):
            fi, m = self._first[t], ids.numel()
            lens[fi, :m] = 1
            g_out[:m, self._col[fi] : self._col[fi + 1]] = g
        values = torch.cat([ids for ids, _ in summed])  # tables in order of their first feature
        offsets = torch.zeros(F * B + 1, dtype=torch.int64, device=dev)
        torch.cumsum(lens.reshape(-1), 0, out=offsets[1:])
        with torch.enable_grad():
            out = self.kernel(values, offsets, None)
            torch.autograd.backward(out, g_out)

    def local_shards(self):
        return [(t.name, s, self.kernel, i) for i, (_, t, s) in enumerate(self._shard_list)]
