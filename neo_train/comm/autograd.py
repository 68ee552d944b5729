"""Autograd-aware collectives: the backward of each is its mirror image.

    all_to_all_v      forward: rows to peers by in_splits     backward: all_to_all_v with splits swapped
    reduce_scatter_v  forward: sum of each rank's segment     backward: all_gather_v of the gradient
    all_gather_v      forward: concatenate every rank's rows  backward: reduce_scatter_v of the gradient

``fwd``/``bwd`` codecs quantize what crosses the wire in each direction (see codecs.py). The
codecs see rows: x (n, *S) goes as (n, prod S). A flat all-to-all (1-D x, splits counted in
values) whose segments are rows of differing widths passes ``widths`` = (in, out) row width per
segment, so a row-scaled codec scales each row; without it a 1-D x is rows of one value.
reduce_scatter_v is the communicator's default one (``reduce_scatter_by_all_to_all``) with the
codec on its wire: encoded segments, decoded before the sum.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from .awaitable import Pending
from .codecs import Codec
from .interface import Communicator, reduce_scatter_by_all_to_all

__all__ = ["all_to_all_v", "reduce_scatter_v", "all_gather_v", "all_to_all_v_async", "Pending"]

_ID = Codec()
Widths = tuple[list[int], list[int]] | None  # (in, out) row width of each segment of a flat x


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x (n, *S) -> (n, prod S): what the codecs see."""
    return x.reshape(x.shape[0], math.prod(x.shape[1:]))


def _widths(widths: tuple[Sequence[int], Sequence[int]] | None) -> Widths:
    return None if widths is None else (list(widths[0]), list(widths[1]))


def _swap(widths: Widths) -> Widths:
    return None if widths is None else (widths[1], widths[0])


def _a2a_start(comm: Communicator, x: torch.Tensor, ins, outs, codec: Codec, tag: str, widths: Widths,
               async_op: bool) -> tuple[Any, Callable[[torch.Tensor], torch.Tensor]]:
    """Encode x and start its exchange: (the received wire, or its handle with ``async_op``; the
    decode of the received wire back to x's dtype and trailing shape)."""
    dtype, S = x.dtype, x.shape[1:]
    if widths is not None:
        wire = codec.encode_flat(x, ins, widths[0])
        got = comm.all_to_all_v(wire, codec.wire_splits(ins, widths[0]), codec.wire_splits(outs, widths[1]),
                                async_op=async_op, tag=tag)
        return got, lambda y: codec.decode_flat(y, outs, widths[1], dtype)
    got = comm.all_to_all_v(codec.encode(_rows(x)).contiguous(), ins, outs, async_op=async_op, tag=tag)
    return got, lambda y: codec.decode(y, dtype).view(y.shape[0], *S)


def _a2a(comm: Communicator, x: torch.Tensor, ins, outs, codec: Codec, tag: str, widths: Widths = None) -> torch.Tensor:
    got, decode = _a2a_start(comm, x, ins, outs, codec, tag, widths, async_op=False)
    return decode(got)


def _ag(comm: Communicator, x: torch.Tensor, sizes, codec: Codec, tag: str) -> torch.Tensor:
    y = comm.all_gather_v(codec.encode(_rows(x)), sizes, tag=tag)
    return codec.decode(y, x.dtype).view(y.shape[0], *x.shape[1:])


class _AllToAllV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, ins, outs, fwd, bwd, tag, widths):  # type: ignore[override]
        ctx.comm, ctx.ins, ctx.outs, ctx.bwd, ctx.tag, ctx.widths = comm, ins, outs, bwd, tag, widths
        return _a2a(comm, x, ins, outs, fwd, tag, widths)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        gx = _a2a(ctx.comm, g.contiguous(), ctx.outs, ctx.ins, ctx.bwd, ctx.tag + "_bwd", _swap(ctx.widths))
        return gx, None, None, None, None, None, None, None


class _ReduceScatterV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, splits, fwd, bwd, tag):  # type: ignore[override]
        ctx.comm, ctx.splits, ctx.bwd, ctx.tag = comm, splits, bwd, tag
        return reduce_scatter_by_all_to_all(comm, x, splits, tag=tag, codec=fwd)

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
        gx = reduce_scatter_by_all_to_all(ctx.comm, g.contiguous(), ctx.sizes, tag=ctx.tag + "_bwd", codec=ctx.bwd)
        return gx, None, None, None, None, None


def all_to_all_v(
    comm: Communicator, x: torch.Tensor, in_splits: Sequence[int], out_splits: Sequence[int],
    fwd: Codec = _ID, bwd: Codec = _ID, tag: str = "",
    widths: tuple[Sequence[int], Sequence[int]] | None = None,
) -> torch.Tensor:
    """x (sum in_splits, *S) -> (sum out_splits, *S); differentiable. ``widths``: for a flat x,
    the row width of each (in, out) segment (see the module docstring)."""
    return _AllToAllV.apply(x, comm, list(in_splits), list(out_splits), fwd, bwd, tag, _widths(widths))


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
    def forward(ctx, x, comm, ins, outs, fwd, bwd, tag, widths, box):  # type: ignore[override]
        box.update(comm=comm, ins=ins, outs=outs, bwd=bwd, tag=tag, widths=widths)
        box["handle"], box["decode"] = _a2a_start(comm, x, ins, outs, fwd, tag, widths, async_op=True)
        ctx.box = box
        return x.new_empty(0)

    @staticmethod
    def backward(ctx, _g):  # type: ignore[override]
        b = ctx.box
        got = b.pop("bwd_handle").wait()
        b.pop("bwd_sent")
        return b.pop("bwd_decode")(got), None, None, None, None, None, None, None, None


class _AllToAllVWait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, marker, box):  # type: ignore[override]
        ctx.box = box
        return box.pop("decode")(box.pop("handle").wait())

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        # the mirror exchange starts here and is waited for in the start's backward: autograd runs
        # the nodes recorded between the two (the bottom MLP's, from the forward's overlap) first
        b = ctx.box
        g = g.contiguous()
        b["bwd_handle"], b["bwd_decode"] = _a2a_start(b["comm"], g, b["outs"], b["ins"], b["bwd"], b["tag"] + "_bwd",
                                                      _swap(b["widths"]), async_op=True)  # fmt: skip
        b["bwd_sent"] = g  # alive until the exchange is done
        return g.new_zeros(0), None


def all_to_all_v_async(
    comm: Communicator, x: torch.Tensor, in_splits: Sequence[int], out_splits: Sequence[int],
    fwd: Codec = _ID, bwd: Codec = _ID, tag: str = "",
    widths: tuple[Sequence[int], Sequence[int]] | None = None,
) -> Pending:
    """all_to_all_v started now, finished by ``wait()``: compute placed in between overlaps it.
    The backward mirrors it: the reverse exchange starts in the wait's backward and is waited
    for in the start's, so the backward of what ran between them overlaps it too."""
    box: dict = {}
    marker = _AllToAllVStart.apply(x, comm, list(in_splits), list(out_splits), fwd, bwd, tag, _widths(widths), box)
    return Pending(lambda: _AllToAllVWait.apply(marker, box))
