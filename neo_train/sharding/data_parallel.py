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

When. The touched rows follow from the ids, so the forward finds them (sorted keys, or with no
more rows R than ids N a mark per row: no sort) and starts the counts exchange; the backward of
the lookup reads it, sums the ids' gradients into the touched rows and starts the chosen
exchange; its wait, the sum over ranks and the update run once the backward's graph is done
(an autograd-engine callback, after DDP's), so the rest of the backward overlaps the exchange.
Every rank issues the same collectives in the same order (counts in the forward, gradients in
the lookup's backward), from the thread that runs the forward and the backward.

The update is applied by replaying the kernel: a batch with one bag per row, backward with that
row's summed gradient (``FusedEmbeddingBag.apply_gradients``: no forward where the backend's
update can run on its own). Every backend supports it through its public interface, and the optimizer
sees exactly the row gradients of the unsharded model. The replay's sizes are upper bounds the
host already knows (sum_j of the ranks' counts per table), not the number of distinct rows (that
would be a second device-to-host copy): a row that several ranks sent is replayed once with its
sum and once more per extra sender with a gradient of exact zeros; the kernel sums a row's bags
before it updates the row (as for any id repeated in a batch), and g + 0 == g, so the update is
the same as with one bag per row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..data.batch import SparseFeatures
from .common import EmbeddingSharding, GroupFeature, ShardingContext, build_kernel, rows_of

__all__ = ["DataParallelSharding", "GRAD_SYNCS"]

GRAD_SYNCS = ("auto", "dense", "sparse")  # DataParallelSharding.grad_sync
_GATHER_CHUNK = 512  # ids whose gradients are gathered at once on a CPU (_touched_grads)


def _group_equal_keys(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Equal keys as one group each: (the keys sorted, whether each sorted key starts a group,
    each sorted key's group index, each input key's group index). Groups are numbered in key
    order; no device-to-host copy."""
    skey, order = torch.sort(key)
    first = torch.ones(key.numel(), dtype=torch.bool, device=key.device)
    first[1:] = skey[1:] != skey[:-1]
    seg = torch.cumsum(first, 0) - 1
    return skey, first, seg, torch.empty_like(seg).index_copy_(0, order, seg)


@dataclass
class _Touched:
    """This rank's touched rows of one batch, found in the forward (the ids are known there; only
    their gradients wait for the backward): each id's bag and effective weight, each id's row
    position ``pos`` among ``keys`` (M,) (the touched keys ascending, then key 0; M = the ids N,
    or the group's rows R when R <= N: ``dense``, each id's position is its key), the per-table
    counts (T,), and the counts exchange started for the backward's choice (None: dense)."""

    bag: torch.Tensor
    psw: torch.Tensor | None
    pos: torch.Tensor
    keys: torch.Tensor
    counts: torch.Tensor
    dense: bool
    counts_handle: Any = None


class _DataParallelLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, group, values, offsets, weights, touched):  # type: ignore[override]
        ctx.group, ctx.touched = group, touched
        with torch.no_grad():
            return group.kernel(values, offsets, weights)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.group.apply_global_update(grad, ctx.touched)
        ctx.touched = None
        return torch.zeros((), device=grad.device), None, None, None, None, None


def _after_backward(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the running backward's graph is done, after the engine callbacks queued so
    far have run (DDP's wait for its buckets; a tracer's bracket around that wait, which queues
    its closing callback from its first): a callback that queues ``fn``. Outside a backward, now."""
    engine = torch.autograd.Variable._execution_engine
    try:
        engine.queue_callback(lambda: engine.queue_callback(fn))
    except RuntimeError:  # no backward running (a direct call)
        fn()


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
        values, offsets, weights = sparse.values, sparse.offsets(), sparse.weights
        touched = self._touched(values, offsets, weights) if torch.is_grad_enabled() else None
        return _DataParallelLookup.apply(self._anchor, self, values, offsets, weights, touched)

    def output_dist(self, pooled: torch.Tensor, b: int) -> torch.Tensor:
        return pooled

    def scale_grad(self, x: torch.Tensor) -> torch.Tensor:
        """x as is: the convention's 1/W is applied by ``_touched_grads`` to the touched rows'
        summed gradients (far fewer values than the (b, sum D_f) gradient)."""
        return x

    # ---- the backward: sum the row gradients over ranks, update every replica alike ----------
    def _counts_first(self) -> bool:
        """Whether this step exchanges the counts before choosing (else dense, counts inside)."""
        if self.grad_sync not in GRAD_SYNCS:
            raise ValueError(f"data-parallel grad_sync must be one of {GRAD_SYNCS}, got {self.grad_sync!r}")
        # after a dense step (auto) the next is dense at once: its counts ride in its all-reduce
        return not (self.grad_sync == "dense" or (self.grad_sync == "auto" and self._dense_next))

    def apply_global_update(self, grad: torch.Tensor, touched: _Touched) -> None:
        """grad (b, sum D_f): sum the touched rows' gradients over ranks (dense or sparse, chosen
        alike on every rank), then update every replica alike. The exchange is started here and
        finished (summed, replayed) when the backward's graph is done, so the rest of the
        backward overlaps it; the counts exchange was started in the forward. One
        device-to-host copy."""
        W, T = self.ctx.world_size, len(self._rows)
        keys, counts = touched.keys, touched.counts
        every = None
        if touched.counts_handle is None:
            how = "dense"
            rows = self._touched_grads(grad, touched)
        else:
            every = touched.counts_handle.wait().view(W, T).tolist()
            how = "sparse" if self.grad_sync == "sparse" or self._sparse_cheaper(every) else "dense"
            mine = sum(every[self.ctx.rank])  # this rank's touched rows: the sums need no more
            rows, keys = self._touched_grads(grad, touched, mine), keys[:mine]
        finish = self._sparse_sum(keys, rows, every) if how == "sparse" else self._dense_sum(keys, rows, counts, every)

        def done() -> None:
            summed, every_ = finish()
            self.last_grad_sync = how
            self._dense_next = not self._sparse_cheaper(every_)
            if how == "sparse":
                self._replay(*summed)
            else:
                self._replay_rows(summed)

        _after_backward(done)

    def _sparse_cheaper(self, every: list[list[int]]) -> bool:
        """Whether the sparse exchange of these (W, T) counts moves no more wire bytes per rank
        than the dense all-reduce (the module docstring's formulas)."""
        W = self.ctx.world_size
        dense = 2 * (W - 1) / W * 4 * (sum(r * (d + 1) for r, d in zip(self._rows, self._dims)) + W * len(self._rows))
        sparse = (W - 1) * max(sum(c) for c in every) * 4 * (self._dmax + self._id_cols)
        return sparse <= dense

    def _touched(self, values: torch.Tensor, offsets: torch.Tensor, weights, dense: bool | None = None) -> _Touched:
        """The forward's half of the backward: which rows this batch touches (``_Touched``), and,
        when this step exchanges the counts first, that exchange started (its result is read in
        the backward). ``dense``: force the layout (tests; default: dense when R <= N). No
        device-to-host copy."""
        F, N = len(self.features), values.numel()
        b = (offsets.numel() - 1) // F
        dev = values.device
        psw = self.kernel.effective_weights(offsets, weights, N)
        lengths = offsets[1:] - offsets[:-1]
        bag = torch.repeat_interleave(torch.arange(F * b, device=dev), lengths, output_size=N)  # f * b + sample
        key = self._feature_key_base.repeat_interleave(b, output_size=F * b).index_select(0, bag) + values.to(torch.int64)
        R = self._row_off[-1]
        dense = R <= N if dense is None else dense
        if dense:  # few rows (hot-row replicas): no sort; a mark per row, each id's position its key
            marked = torch.zeros(R, dtype=torch.bool, device=dev).index_fill_(0, key, True)
            below = torch.cat([key.new_zeros(1), torch.cumsum(marked, 0)]).index_select(0, self._row_off_t)
            keys = torch.nonzero_static(marked, size=R, fill_value=0).flatten()
            pos = key
        else:
            skey, first, seg, pos = _group_equal_keys(key)  # pos: the row each id sums into
            keys = torch.zeros(N, dtype=torch.int64, device=dev).scatter_(0, seg, skey)
            # distinct keys below each table's first key: seg[i - 1] + 1, i = that key's sorted position
            below = torch.cat([seg.new_zeros(1), seg + 1]).index_select(0, torch.searchsorted(skey, self._row_off_t))
        counts = below.diff()
        handle = None
        if self._counts_first():
            W, T = self.ctx.world_size, len(self._rows)
            handle = self.ctx.comm.all_gather_v(counts, [T] * W, async_op=True, tag="dp_grad_counts")
        return _Touched(bag, psw, pos, keys, counts, dense, handle)

    def _touched_grads(self, grad: torch.Tensor, t: _Touched, rows: int | None = None) -> torch.Tensor:
        """(rows, D) float32: the summed gradient of each of the first ``rows`` of ``t.keys``
        (default all M; D = the largest dim; a narrower table's rows zero-padded), zeros past the
        touched rows; the convention's 1/W (``scale_grad``) applied. Each id's gradient is added
        in id order (both layouts: the same float sums); the 1/W scales the sums (the same
        values when W is a power of two), or, with per-id weights, rides on them."""
        F, b, D = len(self.features), grad.shape[0], self._dmax
        if self._uniform:  # grad (b, F*D) as rows of D (a view when it can): bag f*b+s is row s*per+f
            src, per = rows_of(grad, D)
            at = (t.bag % b) * per + t.bag // b
        else:
            src, at = grad.new_zeros(F, b, D), t.bag
            for fi, d in enumerate(self.dims):
                src[fi, :, :d] = grad[:, self._col[fi] : self._col[fi + 1]]
            src = src.view(F * b, D)
        W = self.ctx.world_size
        scale = 1.0 / W if W > 1 else None  # the 1/W the lookup's output left out (scale_grad)
        w = None
        if t.psw is not None:
            w, scale = (t.psw if scale is None else t.psw * scale), None
        M = t.keys.numel() if rows is None else rows
        out = torch.zeros(self._row_off[-1] if t.dense else M, D, device=grad.device)
        # each id's gradient gathered and added in id order; on a CPU a chunk at a time, so the
        # gathered rows are still in cache when they are added (the same sums, 1.7x faster)
        N = at.numel()
        step = _GATHER_CHUNK if grad.device.type == "cpu" else max(N, 1)
        for s in range(0, N, step):
            g = src.index_select(0, at[s : s + step]).float()
            if w is not None:
                g.mul_(w[s : s + step].unsqueeze(1))
            out.index_add_(0, t.pos[s : s + step], g)
        if t.dense:  # out holds every row: this rank's touched rows in key order, zeros past them
            real = torch.arange(M, device=grad.device) < t.counts.sum()
            out = out.index_select(0, t.keys[:M]).masked_fill_(~real.unsqueeze(1), 0.0)
        return out if scale is None else out.mul_(scale)

    def _sparse_sum(self, keys, rows, every: list[list[int]]) -> Callable[[], tuple[tuple, list[list[int]]]]:
        """Start the all_gather_v of every rank's touched rows (gradient and id bits, one float32
        tensor); the returned finish waits and sums them on every rank in rank order: ``_replay``'s
        arguments (``_sum_gathered``: N_t = sum_j every[j][t] ids per table, a row sent by several
        ranks once with its sum, then zeros), and ``every``."""
        W, D, c = self.ctx.world_size, self._dmax, self._id_cols
        n = [sum(x) for x in every]
        mine = n[self.ctx.rank]
        ids = keys[:mine].to(torch.int32 if c == 1 else torch.int64).view(torch.float32)
        # one flat float32 tensor: the rows, then their ids' bits, so the receiver's rows are contiguous
        flat = torch.cat([rows[:mine].reshape(-1), ids])
        handle = self.ctx.comm.all_gather_v(flat, [x * (D + c) for x in n], async_op=True, tag="dp_grad_sparse")
        return lambda: (self._sum_gathered(handle.wait(), n, every), every)

    def _sum_gathered(self, got: torch.Tensor, n: list[int], every: list[list[int]]):
        """The gathered flat float32 tensor (rank j's n[j] rows of D values, then their n[j] ids'
        bits, c columns each; rank after rank) summed per key in rank order, straight into the
        replay's layout (``_replay``): table t's m_t gathered keys ascending as
        m_t one-id bags of its first feature, a key's sum in the bag of its first occurrence and
        zeros in its repeats' (the fused kernel merges a row's bags). No device-to-host copy."""
        W, D, c, F = len(n), self._dmax, self._id_cols, len(self.features)
        grads, keys, off = [], [], 0
        for nj in n:
            grads.append(got[off : off + nj * D].view(nj, D))
            keys.append(got[off + nj * D : off + nj * (D + c)])
            off += nj * (D + c)
        gkey = torch.cat(keys).view(torch.int32 if c == 1 else torch.int64).to(torch.int64)
        M, dev = gkey.numel(), gkey.device
        m = [sum(x[t] for x in every) for t in range(len(self._rows))]
        B = max(1, max(m))
        # sorted keys come table by table (keys are offset by table); received row i is in group[i]
        skey, first, seg, group = _group_equal_keys(gkey)
        table = torch.repeat_interleave(torch.arange(len(m), device=dev), torch.tensor(m, device=dev), output_size=M)
        start = torch.tensor([0] + m[:-1], device=dev).cumsum(0)
        at = torch.arange(M, device=dev) - start.index_select(0, table)  # each sorted key's place in its table
        bag = at * F + torch.tensor(self._first, device=dev).index_select(0, table)
        # each group's bag: its first key's (the repeats' bags keep zeros)
        group_bag = torch.zeros_like(bag).index_add_(0, seg, torch.where(first, bag, 0))
        dest = group_bag.index_select(0, group)  # received row -> its bag
        acc = got.new_zeros(B * F, D)  # (B, F, D): bag-major, as the (B, sum D) gradient with uniform dims
        done = 0
        for j in range(W):  # rank order; a rank's keys are distinct, so each add is race-free
            acc.index_add_(0, dest[done : done + n[j]], grads[j])
            done += n[j]
        if self._uniform:
            g_out = acc.view(B, F * D)
        else:
            g_out, acc3 = acc.new_zeros(B, self._col[-1]), acc.view(B, F, D)
            for fi, d in zip(self._first, self._dims):
                g_out[:, self._col[fi] : self._col[fi] + d] = acc3[:, fi, :d]
        return skey - self._row_off_t.index_select(0, table), m, g_out

    def _dense_sum(self, keys, rows, counts, every: list[list[int]] | None = None
                   ) -> Callable[[], tuple[list, list[list[int]]]]:  # fmt: skip
        """Start the all_reduce of one float32 buffer: every table's (R_t, D_t) gradients, (R_t,)
        touched marks and the (W, T) counts (rank r fills row r); the returned finish waits and
        gives, per table, the touched rows (ids (N_t,), gradients (N_t, D_t)), N_t = min(R_t,
        sum_j every[j][t]) slots, the slots past the touched rows filled with the first touched
        row and zeros; and the counts (read from the buffer, the one device-to-host copy, unless
        ``every`` came from the counts exchange already)."""
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
        handle = self.ctx.comm.all_reduce(flat, async_op=True, tag="dp_grad_allreduce")
        return lambda: self._touched_of_sum(handle.wait(), keys, marks0, counts0, end, every)

    def _touched_of_sum(self, flat: torch.Tensor, keys, marks0: int, counts0: int, end: int, every):
        """The all-reduced buffer's touched rows per table, and the counts (``_dense_sum``)."""
        W, T = self.ctx.world_size, len(self._rows)
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

    def _replay(self, values: torch.Tensor, m: list[int], g_out: torch.Tensor) -> None:
        """Apply the fused update: table t's m[t] ids (``values``, table after table) as one-id
        bags of its first feature, the rest of the B = g_out.shape[0] bags empty; backward with
        g_out (B, sum D)."""
        F, B = len(self.features), g_out.shape[0]
        dev = self._anchor.device
        lens = torch.zeros(F, B, dtype=torch.int64, device=dev)
        for fi, mt in zip(self._first, m):
            lens[fi, :mt] = 1
        offsets = torch.zeros(F * B + 1, dtype=torch.int64, device=dev)
        torch.cumsum(lens.reshape(-1), 0, out=offsets[1:])
        self.kernel.apply_gradients(values, offsets, g_out)

    def _replay_rows(self, summed: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """``_replay`` of per-table (ids, summed gradients): each gradient row in its id's bag."""
        B = max(1, max(ids.numel() for ids, _ in summed))
        g_out = torch.zeros(B, self._col[-1], device=self._anchor.device)
        for fi, (ids, g) in zip(self._first, summed):
            g_out[: ids.numel(), self._col[fi] : self._col[fi + 1]] = g
        self._replay(torch.cat([ids for ids, _ in summed]), [ids.numel() for ids, _ in summed], g_out)

    def local_shards(self):
        return [(t.name, s, self.kernel, i) for i, (_, t, s) in enumerate(self._shard_list)]
