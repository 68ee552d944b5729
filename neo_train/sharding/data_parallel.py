"""Data-parallel embeddings: small tables replicated on every rank.

    input dist   none (no exchange): each rank looks up its own b samples
    lookup       one fused-kernel call over the replicas (no update in the forward)
    output dist  nothing
    backward     each rank sums its rows' gradients into a (rows, D) buffer per table and marks
                 the rows it touched; one all-reduce (sum) of gradients and marks; then every
                 replica applies the fused optimizer to the globally touched rows with the
                 globally summed gradient, identically, so the replicas never drift

The update is applied by replaying the kernel: a batch with one bag per touched row, backward
with that row's summed gradient. Every backend supports it through its public interface, and the
optimizer sees exactly the row gradients of the unsharded model.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..data.batch import SparseFeatures
from .common import EmbeddingSharding, GroupFeature, ShardingContext, build_kernel

__all__ = ["DataParallelSharding"]


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

    def input_sends(self, parts: dict, b: int) -> None:
        return None  # no exchange: each rank looks up its own b samples

    def local_input(self, parts: dict, b: int) -> SparseFeatures:
        return SparseFeatures.from_features({n: parts[n] for n in self.feature_names}, batch_size=b)

    def lookup(self, sparse: SparseFeatures) -> torch.Tensor:
        return _DataParallelLookup.apply(self._anchor, self, sparse.values, sparse.offsets(), sparse.weights)

    def output_dist(self, pooled: torch.Tensor, b: int) -> torch.Tensor:
        return pooled

    def apply_global_update(self, grad: torch.Tensor, values, offsets, weights) -> None:
        """All-reduce the row gradients and touched-row marks, then update every replica alike."""
        k = self.kernel
        F = len(self.features)
        b = grad.shape[0]
        psw = k.effective_weights(offsets, weights, values.numel())
        lengths = offsets[1:] - offsets[:-1]
        bag = torch.repeat_interleave(torch.arange(F * b, device=values.device), lengths, output_size=values.numel())
        feat = bag // b
        grads = [torch.zeros(s.rows, s.cols, device=grad.device) for _, _, s in self._shard_list]
        marks = [torch.zeros(s.rows, device=grad.device) for _, _, s in self._shard_list]
        for fi in range(F):
            sel = feat == fi
            ids = values[sel]
            rows = grad[bag[sel] - fi * b, self._col[fi] : self._col[fi + 1]]  # (n_f, D)
            if psw is not None:
                rows = rows * psw[sel].unsqueeze(1)
            t = self._table_of_feature[fi]
            grads[t].index_add_(0, ids, rows)
            marks[t][ids] = 1.0
        flat = torch.cat([g.reshape(-1) for g in grads] + marks)
        self.ctx.comm.all_reduce(flat, tag="dp_grad_allreduce")
        sizes = [g.numel() for g in grads] + [m.numel() for m in marks]
        parts = flat.split(sizes)
        T = len(grads)
        touched = [(parts[T + t] > 0).nonzero().flatten() for t in range(T)]
        summed = [parts[t].view_as(grads[t]) for t in range(T)]
        # replay: the first feature of each table carries one bag per touched row
        B = max(1, max(int(x.numel()) for x in touched))
        first = {t: self._table_of_feature.index(t) for t in range(T)}
        lens = torch.zeros(F, B, dtype=torch.int64, device=grad.device)
        vals, g_out = [], torch.zeros(B, self._col[-1], device=grad.device)
        for t in range(T):
            fi, n = first[t], int(touched[t].numel())
            lens[fi, :n] = 1
            vals.append(touched[t])
            g_out[:n, self._col[fi] : self._col[fi + 1]] = summed[t][touched[t]]
        order = sorted(range(T), key=lambda t: first[t])  # values follow feature order
        replay_vals = torch.cat([vals[t] for t in order]) if vals else values.new_zeros(0)
        replay_offs = torch.zeros(F * B + 1, dtype=torch.int64, device=grad.device)
        torch.cumsum(lens.reshape(-1), 0, out=replay_offs[1:])
        with torch.enable_grad():
            out = k(replay_vals, replay_offs, None)
            torch.autograd.backward(out, g_out)

    def local_shards(self):
        return [(t.name, s, self.kernel, i) for i, (_, t, s) in enumerate(self._shard_list)]
