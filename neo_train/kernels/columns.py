"""``x[:, cols]`` for a fixed column selection, as copies of runs of consecutive columns.

Layouts of pooled embeddings move whole features (D columns at a time): the sharded collection
puts the received blocks back in feature order, table-row-wise sharding reorders its blocks, hot-row
replication drops the replicas' columns, and the fbgemm backend drops its ghost features' columns
(kernels/fbgemm_backend.py). Such a selection is a few runs of consecutive columns, so the
forward copies the runs and the backward copies the gradient's runs back (into zeros where columns
were dropped), instead of ``index_select``'s gather and its accumulating scatter (about 1 and 1.7 ms
a step at b = 512 x 1664 columns on CPU).

``ColumnAssembly`` puts several inputs' columns into one output at once, adding where two inputs
land on the same columns (hot-row replication: a feature's cold pooled rows from its plan's group
plus its hot pooled rows from the replicas): one (b, width) output instead of concatenating the
inputs (twice as wide with replication), permuting and adding a gathered selection, whose
backward made two zero-filled copies of the wide tensor (a fresh 32 MB zero fill costs ~10 ms of
page faults on CPU).
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["ColumnAssembly", "ColumnPermutation"]


def _index_runs(cols: Sequence[int]) -> list[tuple[int, int, int]]:
    """The map i -> cols[i] as (i start, cols[i] start, length) runs where both go up by one."""
    runs: list[tuple[int, int, int]] = []
    for i, c in enumerate(cols):
        if runs and runs[-1][1] + runs[-1][2] == c:  # i goes up by one every time
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((i, c, 1))
    return runs


def _column_runs(cols: Sequence[int]) -> list[tuple[int, int]]:
    """cols as (source start, length) runs of consecutive columns, in output order."""
    return [(c, n) for _, c, n in _index_runs(cols)]


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


class _AssembleColumns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, asm, *xs):  # type: ignore[override]
        ctx.asm = asm
        if asm.onto_first:  # the first input already is the output's layout: add the others onto it
            out = xs[0]
            ctx.mark_dirty(out)
        else:
            out = xs[0].new_empty(xs[0].shape[0], asm.width)
            for i, s, d, n in asm.copies:
                out.narrow(1, d, n).copy_(xs[i].narrow(1, s, n))
        for i, s, d, n in asm.adds:
            out.narrow(1, d, n).add_(xs[i].narrow(1, s, n))
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        asm = ctx.asm
        grads = [
            None if not ctx.needs_input_grad[1 + i]
            else grad if i in asm.whole  # laid out like the output: its gradient is the output's
            else torch.cat([grad.narrow(1, d, n) for _, d, n in runs], dim=1) if runs
            else grad.new_zeros(grad.shape[0], 0)
            for i, runs in enumerate(asm.runs)
        ]
        return (None, *grads)


class ColumnAssembly:
    """out (b, width) from inputs x_i (b, widths[i]): input i's column c goes to output column
    ``dest[i][c]``, every output column is written by at least one input, the first in input
    order copies and any later one adds. Forward: one output allocation, a copy or add per run of
    consecutive columns; backward: each input's gradient is the output gradient's columns it went
    to (one concatenation of runs per input). A single input mapped onto itself in order costs
    nothing (the input is returned); a first input mapped onto every column in order is the
    output, the others added onto it in place; any input mapped onto every column in order gets
    the output's gradient itself, uncopied."""

    def __init__(self, widths: Sequence[int], dest: Sequence[Sequence[int]], width: int) -> None:
        if not dest:
            raise ValueError("ColumnAssembly: no inputs")
        if len(widths) != len(dest) or any(len(d) != w for d, w in zip(dest, widths)):
            raise ValueError(f"ColumnAssembly: destinations {[len(d) for d in dest]} do not match the input widths {list(widths)}")
        covered = [False] * width
        self.copies: list[tuple[int, int, int, int]] = []
        self.adds: list[tuple[int, int, int, int]] = []
        self.runs: list[list[tuple[int, int, int]]] = []
        for i, cols in enumerate(dest):
            cols = [int(c) for c in cols]
            if len(set(cols)) != len(cols) or any(not 0 <= c < width for c in cols):
                raise ValueError(f"ColumnAssembly: input {i}'s destinations must be distinct columns in [0, {width})")
            runs = _index_runs(cols)  # (source start, destination start, length)
            self.runs.append(runs)
            for s, d, n in runs:  # a run splits where it moves from first writes to adds
                at = 0
                while at < n:
                    first = not covered[d + at]
                    m = 1
                    while at + m < n and (not covered[d + at + m]) == first:
                        m += 1
                    (self.copies if first else self.adds).append((i, s + at, d + at, m))
                    at += m
                for c in range(d, d + n):
                    covered[c] = True
        if not all(covered):
            raise ValueError(f"ColumnAssembly: output columns {[c for c, v in enumerate(covered) if not v][:8]} ... come from no input")
        self.width = width
        self.whole = {i for i, d in enumerate(dest) if list(d) == list(range(width))}  # inputs laid out like the output
        # the first input in order and covering every column: the others are added onto it in
        # place (``in_place``), no output to allocate or copy into
        self.onto_first = 0 in self.whole
        self.identity = self.onto_first and len(dest) == 1
        self.in_place = True

    def __call__(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The assembled (b, width) output. When the first input is laid out like the output
        and ``in_place`` (the default: the caller's first input is a fresh tensor nothing else
        reads), the others are added into it and it is returned."""
        if self.identity:
            return xs[0]
        if self.onto_first and not self.in_place:
            xs = [xs[0].clone(), *xs[1:]]
        return _AssembleColumns.apply(self, *xs)
