"""``x[:, cols]`` for a fixed column selection, as copies of runs of consecutive columns.

Layouts of pooled embeddings move whole features (D columns at a time): the sharded collection
puts the received blocks back in feature order, table-row-wise sharding reorders its blocks, hot-row
replication drops the replicas' columns, and the fbgemm backend drops its ghost features' columns
(kernels/fbgemm_backend.py). Such a selection is a few runs of consecutive columns, so the
forward copies the runs and the backward copies the gradient's runs back (into zeros where columns
were dropped), instead of ``index_select``'s gather and its accumulating scatter (about 1 and 1.7 ms
a step at b = 512 x 1664 columns on CPU).
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["ColumnPermutation"]


def _column_runs(cols: Sequence[int]) -> list[tuple[int, int]]:
    """cols as (source start, length) runs of consecutive columns, in output order."""
    runs: list[tuple[int, int]] = []
    for c in cols:
        if runs and runs[-1][0] + runs[-1][1] == c:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((c, 1))
    return runs


class _SelectColumnRuns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sel):  # type: ignore[override]
        ctx.sel = sel
        return torch.cat([x.narrow(1, s, n) for s, n in sel.runs], dim=1)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        sel = ctx.sel
        if sel.inverse_runs is not None:  # a permutation: the inverse's runs
            return torch.cat([grad.narrow(1, s, n) for s, n in sel.inverse_runs], dim=1), None
        out = grad.new_zeros(grad.shape[0], sel.width)  # dropped columns get no gradient
        at = 0
        for s, n in sel.runs:
            out.narrow(1, s, n).copy_(grad.narrow(1, at, n))
            at += n
        return out, None


class ColumnPermutation:
    """``x[:, cols]`` for fixed distinct ``cols`` of x's ``width`` columns (default len(cols)).
    A permutation of all columns or a selection of some, in few runs: run copies (module
    docstring). The identity costs nothing. Repeated columns, or more than ``MAX_RUNS`` runs,
    use ``index_select``."""

    MAX_RUNS = 64  # more runs than this: one index_select beats that many slice copies

    def __init__(self, cols: Sequence[int], width: int | None = None) -> None:
        cols = [int(c) for c in cols]
        n = len(cols) if width is None else width
        self.width = n
        bijective = sorted(cols) == list(range(n))
        self.identity = bijective and cols == list(range(n))
        self.runs = _column_runs(cols)
        self.by_runs = len(set(cols)) == len(cols) and len(self.runs) <= self.MAX_RUNS
        self.inverse_runs: list[tuple[int, int]] | None = None
        if self.by_runs and bijective:
            inverse = [0] * n
            for c, src in enumerate(cols):
                inverse[src] = c
            self.inverse_runs = _column_runs(inverse)
        self.index = torch.tensor(cols, dtype=torch.int64)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return x
        if self.by_runs:
            return _SelectColumnRuns.apply(x, self)
        if self.index.device != x.device:
            self.index = self.index.to(x.device)
        return x.index_select(1, self.index)
