"""Helpers for tests and benchmarks (never imported by neo_train itself): ``run_ranks`` and its
companions, re-exported from ``neo_train.comm.spawn`` where the runtime keeps them, and
``cpu_model`` (``neo_train.comm.probe``) for benchmark reports, and ``BackwardMark`` for tests of
what a backward overlaps.

    def body(comm, x):            # runs on every rank; comm is the world NativeCommunicator
        return comm.rank * x
    assert run_ranks(body, 3, 10) == [0, 10, 20]
"""
from __future__ import annotations

import torch

from .comm.probe import cpu_model
from .comm.spawn import RankFailed, free_port, run_ranks

__all__ = ["run_ranks", "free_port", "RankFailed", "cpu_model", "BackwardMark"]


class BackwardMark(torch.autograd.Function):
    """``BackwardMark.apply(x, log)``: x itself; its backward appends "mark" to ``log``, so a test
    sees where autograd ran it among the collective calls and waits it logs."""

    @staticmethod
    def forward(ctx, x, log):  # type: ignore[override]
        ctx.log = log
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        ctx.log.append("mark")
        return g, None
