"""Autograd-aware collectives: the backward of each is its mirror image.

    all_to_all_v      forward: rows to peers by in_splits     backward: all_to_all_v with splits swapped
    reduce_scatter_v  forward: sum of each rank's segment     backward: all_gather_v of the gradient
    all_gather_v      forward: concatenate every rank's rows  backward: reduce_scatter_v of the gradient

``fwd``/``bwd`` codecs quantize what crosses the wire in each direction (see codecs.py).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .awaitable import Pending
from .codecs import Codec
from .interface import Communicator

__all__ = ["all_to_all_v", "reduce_scatter_v", "all_gather_v", "all_to_all_v_async", "Pending"]

_ID = Codec()


def _a2a(comm: Communicator, x: torch.Tensor, ins, outs, codec: Codec, tag: str) -> torch.Tensor:
    return codec.decode(comm.all_to_all_v(codec.encode(x), ins, outs, tag=tag), x.dtype)


def _rs(comm: Communicator, x: torch.Tensor, splits, codec: Codec, tag: str) -> torch.Tensor:
    W, mine = comm.world_size, list(splits)[comm.rank]
    # all-to-all of the (encoded) segments, then the sum in float32 on the receiver
    parts = _a2a(comm, x, splits, [mine] * W, codec, tag).view(W, mine, *x.shape[1:])
    return parts.sum(dim=0)


def _ag(comm: Communicator, x: torch.Tensor, sizes, codec: Codec, tag: str) -> torch.Tensor:
    return codec.decode(comm.all_gather_v(codec.encode(x), sizes, tag=tag), x.dtype)


class _AllToAllV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, ins, outs, fwd, bwd, tag):  # type: ignore[override]
        ctx.comm, ctx.ins, ctx.outs, ctx.bwd, ctx.tag = comm, ins, outs, bwd, tag
        return _a2a(comm, x, ins, outs, fwd, tag)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return _a2a(ctx.comm, g.contiguous(), ctx.outs, ctx.ins, ctx.bwd, ctx.tag + "_bwd"), None, None, None, None, None, None


class _ReduceScatterV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, splits, fwd, bwd, tag):  # type: ignore[override]
        ctx.comm, ctx.splits, ctx.bwd, ctx.tag = comm, splits, bwd, tag
        return _rs(comm, x, splits, fwd, tag)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return _ag(ctx.comm, g.contiguous(), ctx.splits, ctx.bwd, ctx.tag + "_bwd"), None, None, None, None, None


class _AllGatherV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, sizes, fwd, bwd, tag):  # type: ignore[override]
        ctx.comm, ctx.sizes, ctx.bwd, ctx.tag = comm, sizes, bwd, tag
        return _ag(comm, x, sizes, fwd, tag)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return _rs(ctx.comm, g.contiguous(), ctx.sizes, ctx.bwd, ctx.tag + "_bwd"), None, None, None, None, None


def all_to_all_v(
    comm: Communicator, x: torch.Tensor, in_splits: Sequence[int], out_splits: Sequence[int],
    fwd: Codec = _ID, bwd: Codec = _ID, tag: str = "",
) -> torch.Tensor:
    """x (sum in_splits, *S) -> (sum out_splits, *S); differentiable."""
    return _AllToAllV.apply(x, comm, list(in_splits), list(out_splits), fwd, bwd, tag)


def reduce_scatter_v(
    comm: Communicator, x: torch.Tensor, splits: Sequence[int], fwd: Codec = _ID, bwd: Codec = _ID, tag: str = ""
) -> torch.Tensor:
    """x (sum splits, *S) on every rank -> (splits[rank], *S) summed over ranks; differentiable."""
    return _ReduceScatterV.apply(x, comm, list(splits), fwd, bwd, tag)


def all_gather_v(
    comm: Communicator, x: torch.Tensor, sizes: Sequence[int], fwd: Codec = _ID, bwd: Codec = _ID, tag: str = ""
) -> torch.Tensor:
    """x (sizes[rank], *S) -> (sum sizes, *S); differentiable."""
    return _AllGatherV.apply(x, comm, list(sizes), fwd, bwd, tag)


class _AllToAllVStart(torch.autograd.Function):
    """Launches the all-to-all asynchronously; returns an empty marker that _AllToAllVWait
    consumes, so autograd runs the wait's backward (the mirror exchange) before this one's."""

    @staticmethod
    def forward(ctx, x, comm, ins, outs, fwd, bwd, tag, box):  # type: ignore[override]
        box.update(comm=comm, ins=ins, outs=outs, fwd=fwd, bwd=bwd, tag=tag, dtype=x.dtype)
        box["handle"] = comm.all_to_all_v(fwd.encode(x).contiguous(), ins, outs, async_op=True, tag=tag)
        ctx.box = box
        return x.new_empty(0)

    @staticmethod
    def backward(ctx, _g):  # type: ignore[override]
        return ctx.box.pop("grad_x"), None, None, None, None, None, None, None


class _AllToAllVWait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, marker, box):  # type: ignore[override]
        ctx.box = box
        return box["fwd"].decode(box.pop("handle").wait(), box["dtype"])

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        b = ctx.box
        b["grad_x"] = _a2a(b["comm"], g.contiguous(), b["outs"], b["ins"], b["bwd"], b["tag"] + "_bwd")
        return g.new_zeros(0), None


def all_to_all_v_async(
    comm: Communicator, x: torch.Tensor, in_splits: Sequence[int], out_splits: Sequence[int],
    fwd: Codec = _ID, bwd: Codec = _ID, tag: str = "",
) -> Pending:
    """all_to_all_v started now, finished by ``wait()``: compute placed in between overlaps it.
    The backward (the mirror exchange) is synchronous, as in ``all_to_all_v``."""
    box: dict = {}
    marker = _AllToAllVStart.apply(x, comm, list(in_splits), list(out_splits), fwd, bwd, tag, box)
    return Pending(lambda: _AllToAllVWait.apply(marker, box))
