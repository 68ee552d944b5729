"""What every sharding type shares: the context, lookup units, the input-dist transport, kernels
over a rank's shards, and the column permutation back to feature order.

Vocabulary (shape letters as everywhere: b local batch, W world size, D dims):
    unit   one (feature, shard) pair looked up on the shard's rank. TW: one unit per feature;
           CW: one per column shard; RW: one per row shard. A rank's kernel holds its shards as
           local tables and its units as local features.
    global batch order   the W*b bags a rank sees after input dist: source rank 0's b bags first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from contextlib import nullcontext
from typing import Any, Sequence

import torch
from torch import nn

from ..comm import Codec, Communicator, all_to_all_v, make_codec
from ..comm.autograd import Pending, all_to_all_v_async
from ..config import TableConfig
from ..kernels import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec, create_embedding_bag
from ..kernels.init import init_table
from .plan import Shard, TablePlan

__all__ = [
    "ShardingContext",
    "GroupFeature",
    "Unit",
    "Routed",
    "route_to_owners",
    "permute_segments",
    "build_kernel",
    "flat_exchange",
]


@dataclass
class ShardingContext:
    """What a sharding type needs from the job: communicators, optimizer, backend, codecs."""

    comm: Communicator
    local_world_size: int
    optimizer: SparseOptimizerSpec
    backend: str | None = "auto"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0
    fwd_codec: Codec = field(default_factory=Codec)
    bwd_codec: Codec = field(default_factory=Codec)
    timer: Any = None  # a PhaseTimer, or None: per-stage forward times
    input_comm: Communicator | None = None  # input dist's own group (pipelining); None: comm
    _node_comms: tuple[Communicator, Communicator] | None = None

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def in_comm(self) -> Communicator:
        """The communicator of the input dist: a group of its own, so the next batch's input
        dist can run in the background while this batch's collectives run on ``comm``."""
        return self.input_comm if self.input_comm is not None else self.comm

    def node_comms(self) -> tuple[Communicator, Communicator]:
        """(intra-node, cross-node) communicators; created once, collectively."""
        if self._node_comms is None:
            self._node_comms = self.comm.node_groups(self.local_world_size)  # type: ignore[attr-defined]
        return self._node_comms

    @staticmethod
    def codecs(fwd: str | None, bwd: str | None) -> tuple[Codec, Codec]:
        return make_codec(fwd), make_codec(bwd)


@dataclass(frozen=True)
class GroupFeature:
    """A feature served by a sharding group: its name, its table (index in the model) and plan."""

    name: str
    table_index: int
    table: TableConfig
    plan: TablePlan


@dataclass(frozen=True)
class Unit:
    feature: int  # index into the group's features
    shard: Shard

    @property
    def rank(self) -> int:
        return self.shard.rank


@dataclass
class Routed:
    """A rank's ids after input dist, in [unit][source rank][bag] order."""

    values: torch.Tensor  # (N,)
    lengths: torch.Tensor  # (U * W * b,)
    weights: torch.Tensor | None  # (N,) or None

    def offsets(self) -> torch.Tensor:
        out = torch.zeros(self.lengths.numel() + 1, dtype=torch.int64, device=self.lengths.device)
        torch.cumsum(self.lengths.to(torch.int64), 0, out=out[1:])
        return out


def permute_segments(values: torch.Tensor, seg_lengths: torch.Tensor) -> torch.Tensor:
    """Reorder segments laid out [a][c] (seg_lengths (A, C)) into [c][a] order.

    values holds A*C consecutive segments, segment (a, c) of seg_lengths[a, c] entries.
    """
    A, C = seg_lengths.shape
    flat = seg_lengths.reshape(-1).to(torch.int64)
    starts = torch.zeros_like(flat)
    if flat.numel() > 1:
        starts[1:] = torch.cumsum(flat, 0)[:-1]
    t_lens = seg_lengths.t().reshape(-1).to(torch.int64)  # target order (c, a)
    t_starts_src = starts.view(A, C).t().reshape(-1)
    t_starts_dst = torch.zeros_like(t_lens)
    if t_lens.numel() > 1:
        t_starts_dst[1:] = torch.cumsum(t_lens, 0)[:-1]
    total = int(t_lens.sum())
    idx = torch.arange(total, device=values.device) + torch.repeat_interleave(
        t_starts_src - t_starts_dst, t_lens, output_size=total
    )
    return values[idx]


def route_to_owners(
    comm: Communicator,
    per_dest: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
    units_on_me: int,
    b: int,
    weighted: bool,
    tag: str = "input_dist",
) -> Routed:
    """Input dist: send each destination its units' (lengths (U_j*b,), values, weights).

    Split sizes first (how many ids go to each peer), then lengths and values packed in one
    all-to-all, then weights if any. The result is in [unit][source][bag] order: unit u's bags for the whole global batch are
    contiguous, source rank 0's first.
    """
    W = comm.world_size
    n_send = [int(d[1].numel()) for d in per_dest]
    n_recv = comm.split_sizes(n_send, tag=tag)
    # one all-to-all carries each peer's lengths and ids together (int64), weights ride in a second
    payload = torch.cat([torch.cat([d[0].to(torch.int64), d[1].to(torch.int64)]) for d in per_dest])
    in_splits = [int(d[0].numel()) + n for d, n in zip(per_dest, n_send)]
    out_splits = [units_on_me * b + n for n in n_recv]
    recv = comm.all_to_all_v(payload, in_splits, out_splits, tag=tag)
    parts = recv.split(out_splits)
    lengths = torch.cat([p[: units_on_me * b] for p in parts]).to(torch.int32)
    values = torch.cat([p[units_on_me * b :] for p in parts])
    weights = None
    if weighted:
        w_send = torch.cat([d[2] for d in per_dest])  # type: ignore[misc]
        weights = comm.all_to_all_v(w_send, n_send, n_recv, tag=tag)
    if W == 1 or units_on_me == 0:
        return Routed(values, lengths, weights)
    l3 = lengths.view(W, units_on_me, b)
    seg = l3.sum(dim=2)  # (W, U): ids per (source, unit)
    values = permute_segments(values, seg)
    if weights is not None:
        weights = permute_segments(weights, seg)
    lengths = l3.permute(1, 0, 2).reshape(-1)
    return Routed(values, lengths, weights)


def build_kernel(
    ctx: ShardingContext,
    shards: Sequence[tuple[int, TableConfig, Shard]],
    feature_table_map: Sequence[int],
    feature_names: Sequence[str],
    pooling_in_kernel: bool = True,
) -> FusedEmbeddingBag | None:
    """A kernel over this rank's shards (table index, table config, shard), initialised from
    the logical tables' init (so a table starts identical however it is sharded)."""
    if not shards:
        return None
    specs = [
        TableSpec(s.rows, s.cols, t.pooling if pooling_in_kernel else "sum", f"{t.name}[{s.row_start}:{s.row_end},{s.col_start}:{s.col_end}]")
        for _, t, s in shards
    ]
    k = create_embedding_bag(
        ctx.backend, specs, ctx.optimizer, feature_table_map=list(feature_table_map),
        feature_names=list(feature_names), device=ctx.device,
    )
    k.check_ids = False  # the sharded collection checked the global ids (naming the rank) already
    full: dict[int, torch.Tensor] = {}
    for i, (ti, t, s) in enumerate(shards):
        if ti not in full:
            full[ti] = init_table(ctx.seed, ti, t.num_rows, t.dim)
        k.set_table(i, full[ti][s.row_start : s.row_end, s.col_start : s.col_end])
    return k


def flat_exchange(
    comm: Communicator, x: torch.Tensor, b: int, widths: Sequence[int], fwd: Codec, bwd: Codec, tag: str,
    async_op: bool = False,
):
    """Output dist of pooled blocks of differing widths: x (W*b, D_me), rows of source i at
    [i*b, (i+1)*b), goes back to source i; returns (b, sum widths) with peer j's block (width
    widths[j]) at its place in peer order (a ``Pending`` of it with ``async_op``).
    Differentiable (the backward is the mirror exchange).
    """
    W = comm.world_size
    me = widths[comm.rank]
    ins, outs = [b * me] * W, [b * w for w in widths]

    def unflatten(out: torch.Tensor) -> torch.Tensor:
        blocks = [blk.view(b, w) for blk, w in zip(out.split(outs), widths)]
        return torch.cat(blocks, dim=1) if blocks else out.view(b, 0)

    if async_op:
        pending = all_to_all_v_async(comm, x.reshape(-1), ins, outs, fwd, bwd, tag)
        return Pending(lambda: unflatten(pending.wait()))
    return unflatten(all_to_all_v(comm, x.reshape(-1), ins, outs, fwd, bwd, tag))


class ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale`` (the 1/W of the convention)."""

    @staticmethod
    def forward(ctx, x, scale):  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g * ctx.scale, None


class EmbeddingSharding(nn.Module):
    """One sharding type's share of the tables: ``input_dist`` -> ``lookup`` -> ``output_dist``.

    ``forward(sparse)`` takes the rank's local batch (only this group's features, in group
    order) and returns pooled (b, sum_f D_f) in group feature order.
    """

    def __init__(self, ctx: ShardingContext, features: Sequence[GroupFeature]) -> None:
        super().__init__()
        self.ctx = ctx
        self.features = list(features)
        self.feature_names = [f.name for f in self.features]
        self.dims = [f.table.dim for f in self.features]

    def forward(self, sparse) -> torch.Tensor:
        return self.compute(self.input_dist(sparse), sparse.batch_size)

    def compute_async(self, routed, b: int) -> Pending:
        """Lookup now, output dist in flight: the caller overlaps compute until ``wait()``.
        Default: synchronous (a type whose output dist can run asynchronously overrides it)."""
        out = self.compute(routed, b)
        return Pending(lambda: out)

    def compute(self, routed, b: int) -> torch.Tensor:
        """Lookup and output dist of an already distributed input (b local samples)."""
        t = self.ctx.timer or (lambda _phase: nullcontext())
        with t("lookup"):
            pooled = self.lookup(routed)
        with t("output_dist"):
            return self.output_dist(pooled, b)

    # each sharding type implements these three (and local_shards for export)
    def input_dist(self, sparse):  # pragma: no cover - abstract
        raise NotImplementedError

    def lookup(self, routed) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def output_dist(self, pooled: torch.Tensor, b: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def local_shards(self) -> list[tuple[str, Shard, FusedEmbeddingBag, int]]:
        """(table name, shard, kernel, local table index) for every shard this rank holds."""
        return []
