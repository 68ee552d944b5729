"""Pure-PyTorch fused embedding backend: the semantic oracle every other backend is tested against.

Storage follows fbgemm's TBE: all tables live in ONE flat weight buffer (and one flat buffer per
optimizer state), with per-table offsets. Tables are laid out sorted by dim, so the tables of one
dim form a contiguous ``(R_g, D_g)`` block ("dim group" g): forward and backward then run one
vectorised pass per dim group instead of one per table, and no Python loop ever runs over ids or
bags.

    forward   per group: rows (n_g,) -> embedding_bag over the (R_g, D_g) block -> (k_g*B, D_g)
              -> scattered to the features' columns of the (B, sum D) output
    backward  per group: ids stably sorted by row -> embedding_bag over the (k_g*B, D_g) output
              gradient sums psw_i * grad_out[bag_i, cols] per touched row (U, D_g) in a fixed
              order -> optimizer update of the touched rows in place

Every reduction is an embedding_bag (one sequential sum per bag) or a per-row op, never an
atomic scatter, so results are bit-reproducible run to run (CPU tested; the CUDA kernels of
these ops are deterministic too).

All arithmetic is float32; float16/bfloat16 weights are read as float32 and rounded to nearest
on store (no stochastic rounding), so the reference stays deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch
import torch.nn.functional as F_nn

from .base import FusedEmbeddingBag, FusedLookupFunction, SparseOptimizerSpec, TableSpec, state_shapes
from .flat_storage import FlatStorageAccessors
from .huge_pages import huge_page_empty, huge_page_zeros
from .init import init_table

__all__ = ["ReferenceEmbeddingBag"]


@dataclass(frozen=True)
class _DimGroup:
    """Tables of one dim, stored as one contiguous (rows, dim) block of the flat buffers."""

    dim: int
    elem_begin: int  # first element of the block in the flat weight / per-element state buffers
    row_begin: int  # first row of the block in the flat rowwise state buffer
    rows: int
    features: tuple[int, ...]  # features served by this group, ascending
    feature_runs: tuple[tuple[int, int], ...]  # maximal runs [f0, f1) of consecutive features


@dataclass
class _GroupBatch:
    """One dim group's slice of a batch: its ids as block rows, bag offsets and weights."""

    rows: torch.Tensor  # (n_g,) int64 row inside the group's (R_g, D_g) block
    offsets: torch.Tensor  # (k_g*B + 1,) int64, bags ordered (feature in group, sample)
    lengths: torch.Tensor  # (k_g*B,) int64
    weights: torch.Tensor | None  # (n_g,) float32 or None


class ReferenceEmbeddingBag(FlatStorageAccessors, FusedEmbeddingBag):
    """Every local table in one flat buffer; vectorised lookup; fused, deterministic sparse update."""

    backend_name: ClassVar[str] = "reference"
    supported_weight_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.float16, torch.bfloat16)

    def __init__(
        self,
        tables: Sequence[TableSpec],
        optimizer: SparseOptimizerSpec,
        feature_table_map: Sequence[int] | None = None,
        feature_names: Sequence[str] | None = None,
        device: torch.device | str = "cpu",
        weight_dtype: torch.dtype = torch.float32,
        *,
        seed: int = 0,
    ) -> None:
        super().__init__(tables, optimizer, feature_table_map, feature_names, device, weight_dtype)
        self._build_layout()
        n_elems = sum(t.rows * t.dim for t in self.tables)
        n_rows = sum(t.rows for t in self.tables)
        on_cpu = self.device_.type == "cpu"  # large CPU buffers on huge pages (kernels/huge_pages.py)
        self.register_buffer("weights", huge_page_empty(n_elems, weight_dtype) if on_cpu
                             else torch.empty(n_elems, dtype=weight_dtype, device=self.device_))  # fmt: skip
        # One flat float32 buffer per state, laid out like the weights (per element) or like the
        # rows (per row), so a dim group's state is a block view exactly like its weights.
        for name, shape in state_shapes(optimizer.kind, 1, 1).items():
            size = n_elems if len(shape) == 2 else n_rows
            self.register_buffer(f"state_{name}", huge_page_zeros(size, torch.float32) if on_cpu
                                 else torch.zeros(size, dtype=torch.float32, device=self.device_))  # fmt: skip
        self.register_buffer("step", torch.zeros((), dtype=torch.int64, device=self.device_))
        for t, spec in enumerate(self.tables):  # kernels/init.py: the same start on every backend
            self.set_table(t, init_table(seed, t, spec.rows, spec.dim))

    # ---- layout -----------------------------------------------------------------------------
    def _build_layout(self) -> None:
        """Place tables sorted by (dim, index); group tables of one dim into one block."""
        self._table_group: list[int] = [0] * len(self.tables)
        self._table_row_in_group: list[int] = [0] * len(self.tables)
        dims = sorted({spec.dim for spec in self.tables})
        groups: list[_DimGroup] = []
        elem, row = 0, 0
        for g, dim in enumerate(dims):
            g_rows = 0
            for t, spec in enumerate(self.tables):
                if spec.dim == dim:
                    self._table_group[t] = g
                    self._table_row_in_group[t] = g_rows
                    g_rows += spec.rows
            feats = tuple(f for f, t in enumerate(self.feature_table_map) if self.tables[t].dim == dim)
            groups.append(_DimGroup(dim, elem, row, g_rows, feats, _runs(feats)))
            elem += g_rows * dim
            row += g_rows
        self._groups: tuple[_DimGroup, ...] = tuple(groups)
        # Row offset of each feature's table inside its group's block: ids + base = block row.
        self.register_buffer(
            "_feature_row_base",
            torch.tensor([self._table_row_in_group[t] for t in self.feature_table_map], dtype=torch.int64,
                         device=self.device_),
            persistent=False,
        )

    def _block(self, flat: torch.Tensor, g: _DimGroup) -> torch.Tensor:
        """Group g's (R_g, D_g) view of a per-element flat buffer."""
        return flat[g.elem_begin : g.elem_begin + g.rows * g.dim].view(g.rows, g.dim)

    def _table_view(self, flat: torch.Tensor, t: int) -> torch.Tensor:
        g = self._groups[self._table_group[t]]
        r0 = self._table_row_in_group[t]
        return self._block(flat, g)[r0 : r0 + self.tables[t].rows]

    def _table_row_view(self, flat: torch.Tensor, t: int) -> torch.Tensor:
        g = self._groups[self._table_group[t]]
        r0 = g.row_begin + self._table_row_in_group[t]
        return flat[r0 : r0 + self.tables[t].rows]

    # ---- batch planning ---------------------------------------------------------------------
    def _plan(
        self, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None
    ) -> tuple[int, list[_GroupBatch | None]]:
        """Split a feature-major batch into per-dim-group batches (None for a group with no features)."""
        F = self.num_features
        B = (offsets.numel() - 1) // F
        offsets = offsets.to(torch.int64)
        lengths = offsets[1:] - offsets[:-1]  # (F*B,)
        bounds = offsets[:: B].tolist() if B > 0 else [int(offsets[0])] * (F + 1)  # (F+1,) per-feature id ranges
        counts = lengths.view(F, B).sum(1) if B > 0 else lengths.new_zeros(F)
        base = self._feature_row_base.repeat_interleave(counts, output_size=values.numel())
        rows_all = values.to(torch.int64) + base  # (N,) block row of every id
        w_all = None if psw is None else psw.to(torch.float32)
        lengths_fb = lengths.view(F, B)
        plans: list[_GroupBatch | None] = []
        for g in self._groups:
            if not g.features:
                plans.append(None)
                continue
            spans = [(bounds[f0], bounds[f1]) for f0, f1 in g.feature_runs]
            rows = _cat_spans(rows_all, spans)
            w = None if w_all is None else _cat_spans(w_all, spans)
            g_lengths = lengths_fb[list(g.features)].reshape(-1)  # (k_g*B,)
            g_offsets = torch.zeros(g_lengths.numel() + 1, dtype=torch.int64, device=values.device)
            torch.cumsum(g_lengths, 0, out=g_offsets[1:])
            plans.append(_GroupBatch(rows, g_offsets, g_lengths, w))
        return B, plans

    # ---- forward ----------------------------------------------------------------------------
    def _lookup(
        self, values: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        anchor = torch.zeros((), device=self.weights.device, requires_grad=True)
        return FusedLookupFunction.apply(anchor, self, values, offsets, per_sample_weights)

    def _forward(self, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None) -> torch.Tensor:
        """Weighted-sum pooling of every feature -> (B, total_dim) float32."""
        return self._forward_with_plan(values, offsets, psw)[0]

    def _forward_with_plan(
        self, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None
    ) -> tuple[torch.Tensor, tuple[int, list[_GroupBatch | None]]]:
        """``_forward`` and the per-group batch split it made (reused by the backward)."""
        plan = self._plan(values, offsets, psw)
        return self._pool(*plan), plan

    def _pool(self, B: int, plans: list[_GroupBatch | None]) -> torch.Tensor:
        pieces: list[torch.Tensor | None] = [None] * self.num_features
        for g, p in zip(self._groups, plans):
            if p is None:
                continue
            block = self._block(self.weights, g)
            if block.dtype == torch.float32:
                pooled = F_nn.embedding_bag(
                    p.rows, block, p.offsets, mode="sum", per_sample_weights=p.weights, include_last_offset=True
                )  # (k_g*B, D_g)
            else:
                # Half-precision rows are widened first, so the sum accumulates in float32.
                rows = block.index_select(0, p.rows).to(torch.float32)  # (n_g, D_g)
                ids = torch.arange(rows.shape[0], device=rows.device)
                pooled = F_nn.embedding_bag(
                    ids, rows, p.offsets, mode="sum", per_sample_weights=p.weights, include_last_offset=True
                )
            for j, f in enumerate(g.features):
                pieces[f] = pooled[j * B : (j + 1) * B]
        return torch.cat(pieces, dim=1)  # type: ignore[arg-type]

    # ---- backward + optimizer ---------------------------------------------------------------
    @torch.no_grad()
    def _backward_update(
        self, grad_out: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None,
        plan: tuple[int, list[_GroupBatch | None]] | None = None,
    ) -> None:
        """grad_out (B, total_dim): sum each touched row's gradient, apply the optimizer in place.
        ``plan``: the forward's ``_plan`` of these ids, when it kept it."""
        self.step += 1  # Adam's t counts backward calls, touched rows or not
        B, plans = plan if plan is not None else self._plan(values, offsets, psw)
        grad_cols = grad_out.to(torch.float32).split(list(self.feature_dims), dim=1)  # F x (B, D_f)
        for g, p in zip(self._groups, plans):
            if p is None or p.rows.numel() == 0:
                continue
            grad_bags = torch.cat([grad_cols[f] for f in g.features], dim=0)  # (k_g*B, D_g)
            # The backward of a bag lookup is a bag lookup of the transposed incidence: row u's
            # gradient sums psw_i * grad_bags[bag_i] over its ids i. A stable sort groups the ids
            # by row in a fixed order, so embedding_bag (one sequential sum per row, on CPU and
            # CUDA alike) gives a deterministic sum without materialising per-id (n_g, D_g) rows.
            sorted_rows, order = torch.sort(p.rows, stable=True)
            rows, counts = torch.unique_consecutive(sorted_rows, return_counts=True)  # (U,), (U,)
            row_offsets = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=rows.device)
            torch.cumsum(counts, 0, out=row_offsets[1:])
            grad_rows = F_nn.embedding_bag(
                _bag_of_id(p).index_select(0, order),
                grad_bags,
                row_offsets,
                mode="sum",
                per_sample_weights=None if p.weights is None else p.weights.index_select(0, order),
                include_last_offset=True,
            )  # (U, D_g), duplicates summed
            self._apply_optimizer(g, rows, grad_rows)

    def _apply_optimizer(self, g: _DimGroup, rows: torch.Tensor, grad: torch.Tensor) -> None:
        """Update rows (U,) of group g given their summed gradient (U, D); see base.py's docstring."""
        spec = self.optimizer_spec
        W = self._block(self.weights, g)
        w = W.index_select(0, rows).to(torch.float32)  # (U, D)
        if spec.weight_decay > 0:
            grad = grad + spec.weight_decay * w  # L2: decay joins the gradient, before any state
        lr, eps = self.lr, spec.eps
        if spec.kind == "sgd":
            w.add_(grad, alpha=-lr)
        elif spec.kind == "adagrad":
            S = self._block(self.state_sum, g)
            s = S.index_select(0, rows).addcmul_(grad, grad)
            S.index_copy_(0, rows, s)
            w.addcdiv_(grad, s.sqrt_().add_(eps), value=-lr)
        elif spec.kind == "rowwise_adagrad":
            M = self.state_momentum[g.row_begin : g.row_begin + g.rows]
            m = M.index_select(0, rows) + torch.linalg.vecdot(grad, grad) / g.dim  # (U,) += mean(g^2)
            M.index_copy_(0, rows, m)
            w.addcmul_(grad, (lr / (m.sqrt() + eps))[:, None], value=-1.0)
        elif spec.kind == "adam":
            t = int(self.step)
            b1, b2 = spec.beta1, spec.beta2
            M1, M2 = self._block(self.state_exp_avg, g), self._block(self.state_exp_avg_sq, g)
            m1 = b1 * M1.index_select(0, rows) + (1 - b1) * grad
            m2 = b2 * M2.index_select(0, rows) + (1 - b2) * grad * grad
            M1.index_copy_(0, rows, m1)
            M2.index_copy_(0, rows, m2)
            w -= lr * (m1 / (1 - b1**t)) / ((m2 / (1 - b2**t)).sqrt() + eps)
        else:  # pragma: no cover - SparseOptimizerSpec validates kind
            raise AssertionError(spec.kind)
        W.index_copy_(0, rows, w.to(W.dtype))  # rows are unique: no write order to depend on



def _runs(features: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Maximal runs of consecutive feature indices: (0, 1, 2, 5) -> ((0, 3), (5, 6))."""
    runs: list[tuple[int, int]] = []
    for f in features:
        if runs and runs[-1][1] == f:
            runs[-1] = (runs[-1][0], f + 1)
        else:
            runs.append((f, f + 1))
    return tuple(runs)


def _cat_spans(x: torch.Tensor, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Concatenate x[a:b] over spans; a single span is a view (no copy)."""
    if len(spans) == 1:
        return x[spans[0][0] : spans[0][1]]
    return torch.cat([x[a:b] for a, b in spans])


def _bag_of_id(p: _GroupBatch) -> torch.Tensor:
    """(n_g,) index of the bag (within the group's k_g*B bags) each id belongs to."""
    bags = torch.arange(p.lengths.numel(), device=p.lengths.device)
    return bags.repeat_interleave(p.lengths, output_size=p.rows.numel())
