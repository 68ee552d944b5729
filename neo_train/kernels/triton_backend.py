"""Triton fused embedding backend: one launch for the lookup of every local table, one for the
backward fused with the sparse optimizer (plus one small launch when hot rows need pre-summing).

    m = TritonEmbeddingBag(tables, SparseOptimizerSpec("rowwise_adagrad"), device="cuda")
    pooled = m(values, offsets)            # (B, sum_f D_f) float32, triton_forward.pool
    pooled.backward(grad)                  # rows updated in place, triton_backward.fused_update

Runs where Triton runs: on CUDA, or on CPU under Triton's interpreter (TRITON_INTERPRET=1 set
before triton is first imported; slow, for tests). ``triton_available()`` says whether this
process can run it; nothing here imports triton until a module is built, so ``import
neo_train.kernels`` works without it.

Storage (unlike the reference's dim-sorted blocks, tables sit in table order):
    weights  flat (sum_t rows_t*S_t,)   table t's row r at [E_t + r*S_t, E_t + r*S_t + D_t)
             S_t = D_t rounded up to 16 bytes (4 float32 / 8 half elements); the padding is 0
    state    per-element states (adagrad "sum", adam "exp_avg"/"exp_avg_sq") like the weights,
             rowwise "momentum" one float32 per global row R_t + r; all float32
    step     int64, Adam's global t (counts backward calls, like the reference)
Semantics are base.py's, including L2 weight decay for every optimizer; float16/bfloat16
weights are float32 math rounded to nearest on store, or stochastically with
``stochastic_rounding=True`` (reproducible: Philox keyed by (seed, step, element)).
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Any, ClassVar, Sequence

import torch

from .base import FusedEmbeddingBag, FusedLookupFunction, SparseOptimizerSpec, TableSpec, state_shapes
from .init import init_table
from .flat_storage import FlatStorageAccessors

__all__ = ["TritonEmbeddingBag", "triton_available", "triton_unavailable_reason"]

_STATE_SLOTS: dict[str, tuple[str, ...]] = {  # base.py state names -> kernel slots (st1, st2)
    "sgd": (),
    "adagrad": ("sum",),
    "rowwise_adagrad": ("momentum",),
    "adam": ("exp_avg", "exp_avg_sq"),
}


@functools.cache
def _triton_import_error() -> str:
    try:
        importlib.import_module("triton")
        importlib.import_module("triton.language")
    except Exception as e:  # noqa: BLE001 - a broken install raises more than ImportError
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        return f"triton failed to import ({type(e).__name__}: {first_line})"
    return ""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_unavailable_reason() -> str:
    """Why the triton backend cannot run in this process ("" when it can)."""
    err = _triton_import_error()
    if err:
        return err
    if torch.cuda.is_available() or _interpreting():
        return ""
    return "no CUDA device, and TRITON_INTERPRET=1 is not set (the interpreter runs the kernels on CPU, slowly)"


def triton_available() -> bool:
    """True on CUDA when triton imports; on CPU only under TRITON_INTERPRET=1."""
    return triton_unavailable_reason() == ""


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """The kernel modules, imported on first use (their @triton.jit reads TRITON_INTERPRET then)."""
    load = importlib.import_module
    return load(".triton_forward", __package__), load(".triton_backward", __package__)


class TritonEmbeddingBag(FlatStorageAccessors, FusedEmbeddingBag):
    """All local tables in one flat buffer; Triton lookup; Triton backward fused with the optimizer."""

    backend_name: ClassVar[str] = "triton"
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
        stochastic_rounding: bool = False,
        stochastic_rounding_seed: int | None = None,
        hot_row_threshold: int = 64,
        hot_row_chunk: int = 256,
    ) -> None:
        super().__init__(tables, optimizer, feature_table_map, feature_names, device, weight_dtype)
        reason = triton_unavailable_reason()
        if reason:
            raise ValueError(f"backend 'triton' is not available: {reason}")
        if self.device_.type != "cuda" and not _interpreting():
            raise ValueError(
                f"backend 'triton' runs on CUDA tensors, not {self.device_.type} "
                "(or on CPU with TRITON_INTERPRET=1 set before triton is imported)"
            )
        if stochastic_rounding and weight_dtype == torch.float32:
            raise ValueError("stochastic_rounding needs float16 or bfloat16 weights")
        if hot_row_threshold < 1 or hot_row_chunk < 1:
            raise ValueError("hot_row_threshold and hot_row_chunk must be >= 1")
        fwd, bwd = _kernels()
        self.stochastic_rounding = stochastic_rounding
        self.sr_seed = int(seed if stochastic_rounding_seed is None else stochastic_rounding_seed)
        self.hot_row_threshold = int(hot_row_threshold)  # rows with more ids are pre-summed
        self.hot_row_chunk = int(hot_row_chunk)  # smallest number of ids per partial sum
        self._build_layout(fwd, bwd)
        n_elems, n_rows = self._elem_base[-1], self._row_base[-1]
        self.register_buffer("weights", torch.zeros(n_elems, dtype=weight_dtype, device=self.device_))
        for name, shape in state_shapes(optimizer.kind, 1, 1).items():
            size = n_elems if len(shape) == 2 else n_rows
            self.register_buffer(f"state_{name}", torch.zeros(size, dtype=torch.float32, device=self.device_))
        self.register_buffer("step", torch.zeros((), dtype=torch.int64, device=self.device_))
        # the step's host copy: reading the buffer every backward would be a host sync per step
        self._host_step = 0
        self.register_load_state_dict_post_hook(lambda module, _keys: module._resync_host_step())
        self._fwd_work: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per batch size
        for t, spec in enumerate(self.tables):  # kernels/init.py: the same start on every backend
            self.set_table(t, init_table(seed, t, spec.rows, spec.dim))

    # ---- step counter (host copy of the ``step`` buffer) ----------------------------------------
    def _resync_host_step(self) -> None:
        self._host_step = int(self.step)

    @property
    def optimizer_step(self) -> int:
        return self._host_step

    def set_optimizer_step(self, step: int) -> None:
        self.step.fill_(int(step))
        self._host_step = int(step)

    # ---- layout -----------------------------------------------------------------------------
    def _build_layout(self, fwd: Any, bwd: Any) -> None:
        align = 16 // torch.empty((), dtype=self.weight_dtype).element_size()
        self._stride = [-(-spec.dim // align) * align for spec in self.tables]
        elem, row = [0], [0]
        for spec, s in zip(self.tables, self._stride):
            elem.append(elem[-1] + spec.rows * s)
            row.append(row[-1] + spec.rows)
        self._elem_base, self._row_base = elem, row
        self._tab_class = [fwd.dim_class(spec.dim) for spec in self.tables]
        tab_meta = [
            [elem[t], self._stride[t], spec.dim, self._tab_class[t], row[t], spec.rows,
             bwd.rows_per_program(self._tab_class[t]), 0]
            for t, spec in enumerate(self.tables)
        ]
        feat_meta = [
            [elem[t], self._stride[t], self.tables[t].dim, self.feature_dim_offsets[f], self._tab_class[t], row[t],
             self.tables[t].rows, fwd.bags_per_program(self._tab_class[t])]
            for f, t in enumerate(self.feature_table_map)
        ]  # fmt: skip
        self._feat_class = [self._tab_class[t] for t in self.feature_table_map]
        self._col_values = list(self.feature_dim_offsets[:-1]) + list(self.feature_dims)  # alignment hints
        self._max_dim = max(spec.dim for spec in self.tables)
        self._loop_top = self._max_dim > (fwd.MIN_COLS << (fwd.NUM_CLASSES - 1))
        i64 = dict(dtype=torch.int64, device=self.device_)
        self.register_buffer("_tab_meta", torch.tensor(tab_meta, **i64), persistent=False)
        self.register_buffer("_feat_meta", torch.tensor(feat_meta, **i64), persistent=False)
        self.register_buffer("_feat_col", self._feat_meta[:, 3].contiguous(), persistent=False)
        self.register_buffer("_feat_row_base", self._feat_meta[:, 5].contiguous(), persistent=False)
        self.register_buffer("_tab_row_base", torch.tensor(row, **i64), persistent=False)
        self.register_buffer("_tab_dim", self._tab_meta[:, 2].contiguous(), persistent=False)

    def _table_view(self, flat: torch.Tensor, t: int) -> torch.Tensor:
        """(rows, D) strided view of table t in a per-element flat buffer."""
        spec = self.tables[t]
        return flat[self._elem_base[t] : self._elem_base[t + 1]].view(spec.rows, self._stride[t])[:, : spec.dim]

    def _table_row_view(self, flat: torch.Tensor, t: int) -> torch.Tensor:
        return flat[self._row_base[t] : self._row_base[t + 1]]

    # ---- forward ----------------------------------------------------------------------------
    def _lookup(
        self, values: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        anchor = torch.zeros((), device=self.weights.device, requires_grad=True)
        return FusedLookupFunction.apply(anchor, self, values, offsets, per_sample_weights)

    def _forward(self, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None) -> torch.Tensor:
        """values (N,), offsets (F*B+1,), psw (N,) | None -> (B, total_dim) float32."""
        fwd, _ = _kernels()
        B = (offsets.numel() - 1) // self.num_features
        work = self._fwd_work.get(B)
        if work is None:
            work = self._fwd_work[B] = fwd.pool_work_list(self._feat_meta, self._feat_class, B)
        return fwd.pool(
            values.contiguous(), offsets.contiguous(), None if psw is None else psw.to(torch.float32).contiguous(),
            self.weights, self._feat_meta, work, B, self.total_dim,
            class_mask=sum(1 << c for c in set(self._feat_class)), loop_top=self._loop_top,
            col_values=self._col_values,
        )  # fmt: skip

    # ---- backward + optimizer ---------------------------------------------------------------
    @torch.no_grad()
    def _backward_update(
        self, grad_out: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None
    ) -> None:
        """grad_out (B, total_dim): sum each touched row's gradient, apply the optimizer in place."""
        _, bwd = _kernels()
        self.step += 1  # Adam's t counts backward calls, touched rows or not
        self._host_step += 1
        if values.numel() == 0:
            return
        B = (offsets.numel() - 1) // self.num_features
        assert self.num_features * B < 2**31, "bag index must fit int32"
        segments = bwd.plan_segments(
            values, offsets.to(torch.int64), None if psw is None else psw.to(torch.float32),
            B, self._feat_row_base, self._tab_row_base, self._tab_dim, self._row_base[-1],
            self.hot_row_threshold, self.hot_row_chunk,
        )  # fmt: skip
        spec = self.optimizer_spec
        slots = _STATE_SLOTS[spec.kind]
        state = tuple(getattr(self, f"state_{slots[i]}") if i < len(slots) else None for i in range(2))
        step = self._host_step
        bwd.fused_update(
            grad_out, segments, B, self._feat_col, self._col_values,
            self.weights, state, self._tab_meta, self._tab_class,
            self._max_dim, spec.kind, self.lr, spec.eps, spec.weight_decay, (spec.beta1, spec.beta2), step,
            sr_seed=(self.sr_seed * 1_000_003 + step) % 2**31 if self.stochastic_rounding else None,
        )  # fmt: skip

