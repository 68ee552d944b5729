"""The one interface every fused embedding backend implements.

A backend holds every local table of a rank in one module and serves them in one call:

    forward(values (N,), offsets (F*B+1,), per_sample_weights (N,) | None) -> (B, sum_f D_f)

Feature f looks up table ``feature_table_map[f]``; its pooled vectors land in columns
``[feature_dim_offsets[f], feature_dim_offsets[f+1])`` of the output (torchrec's KeyedTensor
layout). Bags are feature-major: bag ``f*B + b`` holds ``values[offsets[f*B+b]:offsets[f*B+b+1]]``.

Mean pooling never reaches a backend, so a backend implements one thing: a weighted sum.
Without per-sample weights the backend sums and the mean features' output columns (and so their
gradients) are scaled by 1/L_bag afterwards (``mean_scale``: the backend keeps its unweighted
path); with per-sample weights, mean pooling is folded into them (w_i / L_bag,
``effective_weights``) before the backend sees the call. Its backward never materialises a
dense gradient: it groups the (row, grad) contributions by row, sums duplicates, and applies the
sparse optimizer to the touched rows in place.

Optimizer semantics (g = summed row gradient, plus weight_decay * w when weight_decay > 0):
    sgd              w -= lr * g
    adagrad          s += g*g (per element);       w -= lr * g / (sqrt(s) + eps)
    rowwise_adagrad  m += mean(g*g) (one per row);  w -= lr * g / (sqrt(m) + eps)
                     (fbgemm's EXACT_ROWWISE_ADAGRAD)
    adam             t += 1 once per backward call (global step);
                     for touched rows only: m1 = b1*m1 + (1-b1)*g; m2 = b2*m2 + (1-b2)*g*g
                     w -= lr * (m1/(1-b1^t)) / (sqrt(m2/(1-b2^t)) + eps)   (row-sparse Adam)
State names used by get_state/set_state: adagrad {"sum": (R, D)}, rowwise_adagrad
{"momentum": (R,)}, adam {"exp_avg": (R, D), "exp_avg_sq": (R, D)}; sgd has none. All
optimizer state is float32 whatever the weight dtype.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch
from torch import nn

__all__ = [
    "TableSpec",
    "SparseOptimizerSpec",
    "SPARSE_OPTIMIZERS",
    "FusedEmbeddingBag",
    "FusedLookupFunction",
    "state_shapes",
]

SPARSE_OPTIMIZERS: tuple[str, ...] = ("sgd", "adagrad", "rowwise_adagrad", "adam")
POOLINGS: tuple[str, ...] = ("sum", "mean")


@dataclass(frozen=True)
class TableSpec:
    """One (shard of a) table as a backend sees it."""

    rows: int
    dim: int
    pooling: str = "sum"
    name: str = ""

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"table '{self.name}': rows must be >= 1, got {self.rows}")
        if self.dim < 1:
            raise ValueError(f"table '{self.name}': dim must be >= 1, got {self.dim}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"table '{self.name}': pooling must be one of {POOLINGS}, got {self.pooling!r}")


@dataclass(frozen=True)
class SparseOptimizerSpec:
    """The sparse optimizer fused into the backward pass."""

    kind: str = "rowwise_adagrad"
    lr: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in SPARSE_OPTIMIZERS:
            raise ValueError(f"sparse optimizer must be one of {SPARSE_OPTIMIZERS}, got {self.kind!r}")
        if self.lr < 0 or self.eps <= 0:
            raise ValueError(f"sparse optimizer: lr must be >= 0 and eps > 0 (lr={self.lr}, eps={self.eps})")

    @classmethod
    def from_train(cls, train) -> "SparseOptimizerSpec":
        """The spec a training config asks for (``config.TrainConfig``: sparse_optimizer,
        sparse_lr, eps, weight_decay)."""
        return cls(kind=train.sparse_optimizer, lr=train.sparse_lr, eps=train.eps, weight_decay=train.weight_decay)


def state_shapes(kind: str, rows: int, dim: int) -> dict[str, tuple[int, ...]]:
    """Optimizer state tensors a table of (rows, dim) carries under ``kind``."""
    return {
        "sgd": {},
        "adagrad": {"sum": (rows, dim)},
        "rowwise_adagrad": {"momentum": (rows,)},
        "adam": {"exp_avg": (rows, dim), "exp_avg_sq": (rows, dim)},
    }[kind]


class FusedEmbeddingBag(nn.Module, ABC):
    """All local tables in one module; one lookup call; backward fused with the optimizer.

    Subclasses implement ``_lookup`` (returning a tensor whose backward applies the update) and
    the table/state accessors. Weights and state are buffers, never Parameters, so a dense
    optimizer built from ``model.parameters()`` never touches them.
    """

    backend_name: ClassVar[str] = "abstract"
    supported_optimizers: ClassVar[tuple[str, ...]] = SPARSE_OPTIMIZERS
    supported_weight_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32,)

    def __init__(
        self,
        tables: Sequence[TableSpec],
        optimizer: SparseOptimizerSpec,
        feature_table_map: Sequence[int] | None = None,
        feature_names: Sequence[str] | None = None,
        device: torch.device | str = "cpu",
        weight_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if not tables:
            raise ValueError(f"{type(self).__name__}: needs at least one table")
        if optimizer.kind not in self.supported_optimizers:
            raise ValueError(
                f"backend '{self.backend_name}' does not support sparse optimizer '{optimizer.kind}' "
                f"(supports {self.supported_optimizers})"
            )
        if weight_dtype not in self.supported_weight_dtypes:
            raise ValueError(
                f"backend '{self.backend_name}' does not support weight dtype {weight_dtype} "
                f"(supports {self.supported_weight_dtypes})"
            )
        self.tables: tuple[TableSpec, ...] = tuple(tables)
        self.optimizer_spec = optimizer
        self.lr = optimizer.lr
        self.device_ = torch.device(device)
        self.weight_dtype = weight_dtype
        ftm = list(range(len(self.tables))) if feature_table_map is None else list(feature_table_map)
        if any(not 0 <= t < len(self.tables) for t in ftm):
            raise ValueError(f"feature_table_map {ftm} names a table outside [0, {len(self.tables)})")
        self.feature_table_map: tuple[int, ...] = tuple(ftm)
        names = [f"f{i}" for i in range(len(ftm))] if feature_names is None else list(feature_names)
        if len(names) != len(ftm):
            raise ValueError(f"{len(names)} feature names for {len(ftm)} features")
        self.feature_names: tuple[str, ...] = tuple(names)
        dims = [self.tables[t].dim for t in ftm]
        self.feature_dims: tuple[int, ...] = tuple(dims)
        offs = [0]
        for d in dims:
            offs.append(offs[-1] + d)
        self.feature_dim_offsets: tuple[int, ...] = tuple(offs)
        self.total_dim = offs[-1]
        self.check_ids = True
        self.register_buffer(
            "_feature_rows",
            torch.tensor([self.tables[t].rows for t in ftm], dtype=torch.int64, device=self.device_),
            persistent=False,
        )
        self.register_buffer(
            "_feature_is_mean",
            torch.tensor([self.tables[t].pooling == "mean" for t in ftm], dtype=torch.bool, device=self.device_),
            persistent=False,
        )
        self._any_mean = any(self.tables[t].pooling == "mean" for t in ftm)
        self.register_buffer(
            "_feature_dims", torch.tensor(dims, dtype=torch.int64, device=self.device_), persistent=False
        )

    @property
    def num_features(self) -> int:
        return len(self.feature_table_map)

    # ---- the call ---------------------------------------------------------------------------
    def forward(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """values (N,) int, offsets (F*B+1,) int64, weights (N,) | None -> pooled (B, sum D)."""
        F = self.num_features
        if offsets.dim() != 1 or offsets.numel() < 1 or (offsets.numel() - 1) % F != 0:
            raise ValueError(
                f"{self.backend_name}: offsets has {offsets.numel()} entries; expected F*B+1 with F={F}"
            )
        if per_sample_weights is not None and per_sample_weights.shape != values.shape:
            raise ValueError("per_sample_weights must have the shape of values")
        if self.check_ids:
            self.validate_ids(values, offsets)
        if per_sample_weights is None and self._any_mean:
            # unweighted mean pooling: the backend sums (its unweighted fast path, no per-id
            # weights to build, read or differentiate) and the mean features' columns are
            # scaled by 1/L_bag afterwards (the scale's backward scales their gradient alike)
            return self._lookup(values, offsets, None) * self.mean_scale(offsets)
        psw = self.effective_weights(offsets, per_sample_weights, values.numel())
        return self._lookup(values, offsets, psw)

    def apply_gradients(self, values: torch.Tensor, offsets: torch.Tensor, grad_out: torch.Tensor) -> None:
        """Apply the fused update a backward of ``grad_out`` (B, total_dim) through the unweighted
        lookup of (values, offsets) applies, without needing its output: backends built on
        ``FusedLookupFunction`` (``_backward_update``) skip the forward; the others (fbgemm's own
        autograd) run it and then the backward. Used to replay a summed gradient (data-parallel
        tables' global update)."""
        direct = getattr(self, "_backward_update", None)
        if direct is None:
            with torch.enable_grad():
                torch.autograd.backward(self(values, offsets, None), grad_out)
            return
        if self.check_ids:
            self.validate_ids(values, offsets)
        if self._any_mean:  # as the unweighted forward: the sum's gradient is grad_out x 1/L_bag
            grad_out = grad_out * self.mean_scale(offsets)
        direct(grad_out.contiguous(), values, offsets, None)

    def mean_scale(self, offsets: torch.Tensor) -> torch.Tensor:
        """(B, total_dim) float32: 1/max(L_bag, 1) in the columns of mean-pooled features, 1 elsewhere."""
        F = self.num_features
        B = (offsets.numel() - 1) // F
        lengths = (offsets[1:] - offsets[:-1]).view(F, B).to(torch.float32)
        inv = torch.where(self._feature_is_mean.to(offsets.device)[:, None], 1.0 / lengths.clamp(min=1.0), 1.0)
        dims = self._feature_dims.to(offsets.device)
        return inv.t().repeat_interleave(dims, dim=1, output_size=self.total_dim)  # (B, total_dim)

    def validate_ids(self, values: torch.Tensor, offsets: torch.Tensor) -> None:
        """Raise ValueError naming the feature, table and id when an id is out of range.

        Also checks that offsets run from 0 to len(values) without decreasing: otherwise the
        per-id feature lookup below (and every backend) would misread the bags.
        """
        n = values.numel()
        if int(offsets[0]) != 0 or int(offsets[-1]) != n:
            raise ValueError(
                f"{self.backend_name}: offsets must run from 0 to len(values)={n}, "
                f"got {int(offsets[0])}..{int(offsets[-1])}"
            )
        if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
            raise ValueError(f"{self.backend_name}: offsets must be non-decreasing (a bag has negative length)")
        if n == 0:
            return
        B = (offsets.numel() - 1) // self.num_features
        counts = (offsets[B :: B] - offsets[0:-1:B]) if B > 0 else offsets.new_zeros(self.num_features)
        rows = self._feature_rows.repeat_interleave(counts.to(self._feature_rows.device), output_size=values.numel())
        bad = (values < 0) | (values >= rows)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            f = int(torch.searchsorted(torch.cumsum(counts, 0), torch.tensor(i, device=counts.device), right=True))
            t = self.feature_table_map[f]
            raise ValueError(
                f"feature '{self.feature_names[f]}' (table '{self.tables[t].name or t}', "
                f"{self.tables[t].rows} rows): id {int(values[i])} out of range [0, {self.tables[t].rows})"
            )

    def effective_weights(
        self, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None, n: int
    ) -> torch.Tensor | None:
        """Fold mean pooling into per-id weights: w_i / L_bag for ids of mean-pooled features."""
        if not self._any_mean:
            return per_sample_weights
        F = self.num_features
        B = (offsets.numel() - 1) // F
        lengths = (offsets[1:] - offsets[:-1]).to(torch.float32)
        is_mean = self._feature_is_mean.to(offsets.device).repeat_interleave(B)
        scale = torch.where(is_mean, 1.0 / lengths.clamp(min=1.0), torch.ones_like(lengths))
        w = scale.repeat_interleave((offsets[1:] - offsets[:-1]), output_size=n)
        return w if per_sample_weights is None else w * per_sample_weights.to(torch.float32)

    def set_learning_rate(self, lr: float) -> None:
        self.lr = float(lr)

    # ---- what a backend implements ----------------------------------------------------------
    @abstractmethod
    def _lookup(
        self, values: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        """Weighted-sum pooled (B, total_dim); its backward applies the fused optimizer."""

    @abstractmethod
    def get_table(self, t: int) -> torch.Tensor:
        """A float32 copy of table t, (rows, dim)."""

    @abstractmethod
    def set_table(self, t: int, weight: torch.Tensor) -> None:
        """Overwrite table t with weight (rows, dim)."""

    @abstractmethod
    def get_state(self, t: int) -> dict[str, torch.Tensor]:
        """Copies of table t's optimizer state (names in the module docstring)."""

    @abstractmethod
    def set_state(self, t: int, state: dict[str, torch.Tensor]) -> None:
        """Overwrite table t's optimizer state."""

    def rows_views(self, t: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Live views of table t: weights (rows, D) and {state name: (rows, D) or (rows,)}.

        Writes through the views change the table, so a wrapper (kernels/cache.py's row cache)
        can copy indexed rows in and out without round-tripping whole tables. Rows a pending
        backward does not touch may be written between its forward and backward. Optional:
        backends that cannot expose their storage raise NotImplementedError.
        """
        raise NotImplementedError(f"backend '{self.backend_name}' does not expose row views")

    @property
    @abstractmethod
    def optimizer_step(self) -> int:
        """How many fused updates have run (Adam's bias-correction step t)."""

    @abstractmethod
    def set_optimizer_step(self, step: int) -> None:
        """Set the fused-update counter (checkpoint restore)."""


class FusedLookupFunction(torch.autograd.Function):
    """Autograd glue for backends that implement ``_forward`` / ``_backward_update``.

    ``anchor`` is a 0-d tensor that requires grad, so autograd calls backward even though the
    weights are buffers; the backward updates the rows in place and returns no gradient for them.

    A backend may also implement ``_forward_with_plan`` -> (output, plan): the plan (whatever the
    forward derived from the ids: per-table rows, bag offsets, ...) is kept for the backward and
    handed to ``_backward_update(..., plan=plan)``, so the backward does not derive it again.
    """

    @staticmethod
    def forward(ctx, anchor, module, values, offsets, psw):  # type: ignore[override]
        ctx.module = module
        ctx.save_for_backward(values, offsets, psw if psw is not None else values.new_zeros(0))
        ctx.has_psw = psw is not None
        with_plan = getattr(module, "_forward_with_plan", None)
        if with_plan is None:
            ctx.plan = None
            return module._forward(values, offsets, psw)
        out, ctx.plan = with_plan(values, offsets, psw)
        return out

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        values, offsets, psw = ctx.saved_tensors
        psw = psw if ctx.has_psw else None
        if ctx.plan is None:
            ctx.module._backward_update(grad_output.contiguous(), values, offsets, psw)
        else:
            ctx.module._backward_update(grad_output.contiguous(), values, offsets, psw, plan=ctx.plan)
            ctx.plan = None  # the ids' derived tensors are not needed after this backward
        return torch.zeros((), device=grad_output.device), None, None, None, None
