"""Fused embedding backend over fbgemm_gpu's SplitTableBatchedEmbeddingBagsCodegen (TBE).

fbgemm_gpu is imported when a module is constructed, never when ``neo_train.kernels`` is imported,
so a CPU-only install without fbgemm still imports and runs the reference backend.

What fbgemm-gpu-cpu 1.8.0 does, measured here, and how this wrapper matches base.py:

* Optimizers on CPU: EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD. ADAM is CUDA-only (the CPU
  constructor asserts), so ``supported_optimizers`` is the CPU set; a CUDA module adds "adam".
* Weight decay: EXACT_ROWWISE_ADAGRAD with WeightDecayMode.L2 is base.py's rule (g' = g + wd*w,
  m += mean(g'^2), w -= lr*g'/(sqrt(m)+eps)) in fbgemm's CUDA kernel and its generic CPU loop,
  but the CPU fast path (float32 weights, table not shared) calls fbgemm's JIT rowwise AdaGrad
  with weight_decay=0 hard-coded: the decay is silently dropped. EXACT_SGD and EXACT_ADAGRAD
  have no weight decay, and fbgemm's ADAM decay is decoupled (AdamW). So weight_decay > 0 is
  allowed with rowwise_adagrad only: on CUDA, and on CPU where every table takes the generic
  loop (``cpu_update="generic"``, the default, float32 weights; below); anything else is refused
  rather than silently changed.
* Dims must be multiples of 4 (fbgemm asserts it). Padding would be exact for sgd/adagrad but not
  for rowwise_adagrad (its mean(g^2) would divide by the padded dim), so other dims are refused.
* Shared tables: the CPU rowwise-adagrad backward fails ("num of rows processed by adagrad: 0
  does not match c_block size") whenever feature_table_map is not non-decreasing, e.g. [0, 1, 0].
  This wrapper therefore hands fbgemm its features sorted by table and permutes the input bags
  and the output columns back; base.py's feature order is what the caller sees.
* Learning rate: fbgemm reads it when forward runs; ``set_learning_rate`` between a forward and
  its backward applies from the next forward (the reference reads it at backward). Training loops
  that change the rate between steps see no difference.
* Step counter: fbgemm's ``iter`` counts forward calls. ``optimizer_step`` here counts backward
  calls (base.py's Adam t); for Adam on CUDA, fbgemm's counter is set from it before each forward,
  so evaluation forwards do not advance the bias correction.
* float16 weights are supported (float32 math, round to nearest: stochastic rounding is off so
  runs are reproducible); bfloat16 is not implemented by the CPU kernels.
* The CPU rowwise-AdaGrad backward has two paths: fbgemm's JIT fast path (float32 weights, a table
  read by one feature: a JIT SpMDM sums each touched row's gradient, a JIT kernel updates it, 64
  rows per call) and its generic loop (any other table). Measured on a 2-vCPU Intel Xeon VM
  (``benchmarks/embedding.py --backends fbgemm,fbgemm:jit`` times both), the JIT path costs
  ~150 ns more per touched row: 87 ms against 36 ms for the backward of 13 tables of 1M x 64 at
  b = 1024 and pooling 20-40 (129k touched rows), 17 against 3.5 ms at 4 x 100k x 16.
  ``cpu_update="generic"`` (the default) takes the generic loop for every table by giving each single-feature table a *ghost*
  feature with empty bags (fbgemm then treats it as shared): the ghost's output columns are
  zeros and never leave this module, its offsets are the real feature's end repeated. Same
  update rule; the gradient of a row is summed in another order (float32 rounding only). The
  generic loop also applies rowwise AdaGrad's L2 weight decay, which the JIT path drops, so
  ``weight_decay`` is allowed with rowwise_adagrad there. ``cpu_update="jit"`` keeps fbgemm's
  choice; without the argument the environment variable ``NEO_TRAIN_FBGEMM_CPU_UPDATE`` (generic
  or jit) decides, so a benchmark can compare the two in whole runs.
"""
from __future__ import annotations

import os
from typing import Any, ClassVar, Sequence

import torch

from . import huge_pages
from .base import SPARSE_OPTIMIZERS, FusedEmbeddingBag, SparseOptimizerSpec, TableSpec, state_shapes
from .columns import ColumnPermutation
from .init import init_table
from .flat_storage import check_shape as _check_shape

__all__ = ["CPU_UPDATES", "FbgemmEmbeddingBag"]

CPU_UPDATES = ("generic", "jit")  # FbgemmEmbeddingBag(cpu_update=...): see the module docstring

# base.py state name -> position in fbgemm's split_optimizer_states()[t]
_STATE_NAMES: dict[str, tuple[str, ...]] = {
    "sgd": (),
    "adagrad": ("sum",),
    "rowwise_adagrad": ("momentum",),
    "adam": ("exp_avg", "exp_avg_sq"),
}


class FbgemmEmbeddingBag(FusedEmbeddingBag):
    """All local tables in one fbgemm TBE module; fbgemm's autograd applies the fused update."""

    backend_name: ClassVar[str] = "fbgemm"
    supported_optimizers: ClassVar[tuple[str, ...]] = ("sgd", "adagrad", "rowwise_adagrad")
    supported_weight_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.float16)
    # Not part of base.py's interface: constraints a caller (or the tests) can read up front.
    dim_multiple: ClassVar[int] = 4
    weight_decay_optimizers: ClassVar[tuple[str, ...]] = ()

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
        cpu_update: str | None = None,
    ) -> None:
        if cpu_update is None:
            cpu_update = os.environ.get("NEO_TRAIN_FBGEMM_CPU_UPDATE", "generic")
        if cpu_update not in CPU_UPDATES:
            raise ValueError(f"backend 'fbgemm': cpu_update must be one of {CPU_UPDATES}, got {cpu_update!r}")
        on_cpu = torch.device(device).type == "cpu"
        # the module docstring: ghost features route rowwise AdaGrad to fbgemm's generic CPU loop
        self._ghosts = on_cpu and cpu_update == "generic" and optimizer.kind == "rowwise_adagrad" \
            and weight_dtype == torch.float32
        if self._ghosts:  # the generic loop applies L2 weight decay
            self.weight_decay_optimizers = ("rowwise_adagrad",)
        if torch.device(device).type == "cuda":
            # fbgemm's CUDA kernels add Adam and honour rowwise weight decay; the instance
            # attributes shadow the CPU ClassVars before base.__init__ checks them.
            self.supported_optimizers = SPARSE_OPTIMIZERS
            self.weight_decay_optimizers = ("rowwise_adagrad",)
        super().__init__(tables, optimizer, feature_table_map, feature_names, device, weight_dtype)
        for t, spec in enumerate(self.tables):
            if spec.dim % self.dim_multiple:
                raise ValueError(
                    f"backend 'fbgemm': table '{spec.name or t}' has dim {spec.dim}; fbgemm TBE needs "
                    f"dims that are multiples of {self.dim_multiple} (use the 'reference' backend)"
                )
        if optimizer.weight_decay > 0 and optimizer.kind not in self.weight_decay_optimizers:
            raise ValueError(
                f"backend 'fbgemm' on {self.device_.type}: weight_decay > 0 is not available with "
                f"'{optimizer.kind}' (available with: {self.weight_decay_optimizers or 'none'}; "
                f"fbgemm would drop or decouple the decay); use the 'reference' backend"
            )
        self._tbe = _make_tbe(self.tables, optimizer, self._internal_order(), self.device_, weight_dtype)
        if on_cpu:
            _rehome_on_huge_pages(self._tbe)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64, device=self.device_))
        for t, spec in enumerate(self.tables):  # kernels/init.py: the same start on every backend
            self.set_table(t, init_table(seed, t, spec.rows, spec.dim))

    # ---- feature order ----------------------------------------------------------------------
    def _internal_order(self) -> list[int]:
        """fbgemm's features: the caller's sorted by table (see module docstring), each
        single-feature table followed by its ghost when ``self._ghosts``. Returns fbgemm's
        feature_table_map and registers the input/output maps when they are not the identity."""
        order = sorted(range(self.num_features), key=lambda f: (self.feature_table_map[f], f))
        self._permuted = order != list(range(self.num_features))
        internal: list[tuple[int, int | None]] = []  # (table, caller feature or None: a ghost)
        for f in order:
            t = self.feature_table_map[f]
            internal.append((t, f))
            if self._ghosts and self.feature_table_map.count(t) == 1:
                internal.append((t, None))
        self._internal_features = len(internal)
        if self._permuted:
            # Input: fbgemm feature i reads caller feature order[i].
            self.register_buffer(
                "_feature_perm", torch.tensor(order, dtype=torch.int32, device=self.device_), persistent=False
            )
        if self._ghosts:
            # Input: the real features' rows among fbgemm's (the ghosts' bags stay empty).
            real = [i for i, (_, f) in enumerate(internal) if f is not None]
            self.register_buffer("_real_rows", torch.tensor(real, dtype=torch.int64, device=self.device_), persistent=False)
        self._reorders_output = self._permuted or self._ghosts
        if self._reorders_output:
            # Output: caller column c comes from internal column col_index[c].
            internal_offset = {}
            off = 0
            for t, f in internal:
                if f is not None:
                    internal_offset[f] = off
                off += self.tables[t].dim
            cols = [internal_offset[f] + d for f in range(self.num_features) for d in range(self.feature_dims[f])]
            self._out_cols = ColumnPermutation(cols, off)
        return [t for t, _ in internal]

    def _internal_input(
        self, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The caller's bags as fbgemm's features: sorted by table, ghosts' bags empty."""
        F = self.num_features
        B = (offsets.numel() - 1) // F
        lengths = (offsets[1:] - offsets[:-1]).view(F, B)
        if self._permuted:
            lengths, values, psw = torch.ops.fbgemm.permute_2D_sparse_data(
                self._feature_perm, lengths, values, psw, values.numel()
            )
        if self._ghosts:
            lengths = lengths.new_zeros(self._internal_features, B).index_copy_(0, self._real_rows, lengths)
        p_offsets = offsets.new_zeros(lengths.numel() + 1)
        torch.cumsum(lengths.reshape(-1), 0, out=p_offsets[1:])
        return values, p_offsets, psw

    # ---- forward ----------------------------------------------------------------------------
    def _lookup(
        self, values: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        values = values.to(torch.int64)
        offsets = offsets.to(torch.int64)
        psw = None if per_sample_weights is None else per_sample_weights.to(torch.float32)
        if self._reorders_output:
            values, offsets, psw = self._internal_input(values, offsets, psw)
        if self.optimizer_spec.kind == "adam" and torch.is_grad_enabled():
            # fbgemm adds 1 to iter in this forward and uses it as t: make that our step + 1.
            self._tbe.iter.fill_(int(self.step))
            self._tbe.iter_cpu.fill_(int(self.step))
        out = self._tbe(values, offsets, psw)  # (B, internal dims), features in internal order
        if self._reorders_output:
            out = self._out_cols(out)
        if out.requires_grad:
            out.register_hook(self._count_backward)
        return out

    def _count_backward(self, grad: torch.Tensor) -> None:
        self.step += 1

    def set_learning_rate(self, lr: float) -> None:
        super().set_learning_rate(lr)
        self._tbe.set_learning_rate(float(lr))

    # ---- accessors --------------------------------------------------------------------------
    def get_table(self, t: int) -> torch.Tensor:
        return self._tbe.split_embedding_weights()[t].to(torch.float32, copy=True)

    def set_table(self, t: int, weight: torch.Tensor) -> None:
        view = self._tbe.split_embedding_weights()[t]
        _check_shape(f"table {t}", weight, tuple(view.shape))
        view.copy_(weight)

    def _state_views(self, t: int) -> dict[str, torch.Tensor]:
        names = _STATE_NAMES[self.optimizer_spec.kind]
        if not names:
            return {}
        states = self._tbe.split_optimizer_states()[t]
        return dict(zip(names, states))

    def get_state(self, t: int) -> dict[str, torch.Tensor]:
        return {k: v.to(torch.float32, copy=True) for k, v in self._state_views(t).items()}

    def rows_views(self, t: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """base.py's row views, taken through ``.data``: fbgemm's autograd saves the whole weight
        buffer at forward and checks its version counter at backward, so a row cache filling
        other rows in between would otherwise fail the backward. The rows the backward updates
        are the batch's own (kept in place by the cache), so skipping that check is safe here."""
        spec = self.tables[t]
        shapes = state_shapes(self.optimizer_spec.kind, spec.rows, spec.dim)
        states = {k: v.data.view(shapes[k]) for k, v in self._state_views(t).items()}
        return self._tbe.split_embedding_weights()[t].data, states

    def set_state(self, t: int, state: dict[str, torch.Tensor]) -> None:
        spec = self.tables[t]
        expected = state_shapes(self.optimizer_spec.kind, spec.rows, spec.dim)
        if set(state) != set(expected):
            raise ValueError(f"table {t}: state keys {sorted(state)} != {sorted(expected)}")
        for name, view in self._state_views(t).items():
            _check_shape(f"table {t} state '{name}'", state[name], expected[name])
            view.copy_(state[name].reshape(view.shape))

    @property
    def optimizer_step(self) -> int:
        return int(self.step)

    def set_optimizer_step(self, step: int) -> None:
        self.step.fill_(int(step))


def _rehome_on_huge_pages(tbe: Any) -> None:
    """Give fbgemm's large host buffers (the weights, the optimizer state) huge-page memory
    (kernels/huge_pages.py). Each is freed before its replacement is allocated, so memory never
    holds two copies; the contents are zeros, as fbgemm made them (the caller writes every table
    next)."""
    for name in ("weights_host", "momentum1_host", "momentum2_host"):
        old = getattr(tbe, name, None)
        if old is None or old.numel() * old.element_size() < huge_pages.MIN_BYTES or not huge_pages.enabled():
            continue
        numel, dtype, is_param = old.numel(), old.dtype, isinstance(old, torch.nn.Parameter)
        del old
        setattr(tbe, name, torch.nn.Parameter(torch.empty(0, dtype=dtype)) if is_param else torch.empty(0, dtype=dtype))
        fresh = huge_pages.huge_page_zeros(numel, dtype)
        setattr(tbe, name, torch.nn.Parameter(fresh) if is_param else fresh)


def _make_tbe(
    tables: Sequence[TableSpec],
    optimizer: SparseOptimizerSpec,
    feature_table_map: list[int],
    device: torch.device,
    weight_dtype: torch.dtype,
) -> Any:
    """Build the fbgemm TBE module (the only place fbgemm_gpu is imported)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        BoundsCheckMode,
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
    from fbgemm_gpu.tbe.config.embedding_config import ComputeDevice
    from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode

    on_cuda = device.type == "cuda"
    location = EmbeddingLocation.DEVICE if on_cuda else EmbeddingLocation.HOST
    compute = ComputeDevice.CUDA if on_cuda else ComputeDevice.CPU
    optim = {
        "sgd": EmbOptimType.EXACT_SGD,
        "adagrad": EmbOptimType.EXACT_ADAGRAD,
        "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        "adam": EmbOptimType.ADAM,
    }[optimizer.kind]
    precision = {torch.float32: SparseType.FP32, torch.float16: SparseType.FP16}[weight_dtype]
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(spec.rows, spec.dim, location, compute) for spec in tables],
        feature_table_map=feature_table_map,
        optimizer=optim,
        weights_precision=precision,
        output_dtype=SparseType.FP32,
        stochastic_rounding=False,
        learning_rate=optimizer.lr,
        eps=optimizer.eps,
        beta1=optimizer.beta1,
        beta2=optimizer.beta2,
        weight_decay=optimizer.weight_decay,
        weight_decay_mode=WeightDecayMode.L2 if optimizer.weight_decay > 0 else WeightDecayMode.NONE,
        # Mean pooling arrives folded into per-sample weights (base.py), so fbgemm only sums.
        pooling_mode=PoolingMode.SUM,
        # base.py validates ids with a clear error; this is the memory-safety net when a caller
        # turns that off (FATAL raises instead of reading out of bounds).
        bounds_check_mode=BoundsCheckMode.FATAL,
        device=device,
    )

