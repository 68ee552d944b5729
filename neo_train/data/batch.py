"""The sparse batch type: Neo's concatenated, lengths-not-offsets input format.

A batch of F sparse features over B samples is held feature-major:

    values  (N,)     ids of feature 0 for samples 0..B-1, then feature 1, ...
    lengths (F*B,)   lengths[f*B + b] = number of ids of feature f in sample b
    weights (N,)     optional per-id weights, laid out like ``values``

Offsets are derived on demand (an exclusive prefix sum of ``lengths``). This is the layout
torchrec's ``KeyedJaggedTensor`` uses too, so conversion is a relabelling, not a copy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

__all__ = ["SparseFeatures", "Batch"]


@dataclass(frozen=True)
class SparseFeatures:
    """F named sparse features for B samples, feature-major (see module docstring)."""

    keys: tuple[str, ...]
    values: torch.Tensor
    lengths: torch.Tensor
    weights: torch.Tensor | None = None
    # ids per feature, known on the host (from host lengths, or from the parts a batch was built
    # from): splitting by feature then needs no device-to-host copy of the lengths
    _counts: tuple[int, ...] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.keys))
        if self._counts is not None and (len(self._counts) != len(self.keys) or sum(self._counts) != self.values.numel()):
            raise ValueError(f"SparseFeatures: per-feature counts {list(self._counts)} do not match {self.values.numel()} values")
        if self.values.dim() != 1 or self.lengths.dim() != 1:
            raise ValueError("SparseFeatures: values and lengths must be 1-D tensors")
        if self.values.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"SparseFeatures: values must be int32/int64 ids, got {self.values.dtype}")
        if self.weights is not None and self.weights.shape != self.values.shape:
            raise ValueError(
                f"SparseFeatures: weights shape {tuple(self.weights.shape)} does not match "
                f"values shape {tuple(self.values.shape)}"
            )
        if len(self.keys) == 0:
            if self.lengths.numel() != 0 or self.values.numel() != 0:
                raise ValueError("SparseFeatures: no keys but non-empty values/lengths")
        elif self.lengths.numel() % len(self.keys) != 0:
            raise ValueError(
                f"SparseFeatures: {self.lengths.numel()} lengths is not a multiple of "
                f"{len(self.keys)} features"
            )

    # ---- shape ------------------------------------------------------------------------------
    @property
    def num_features(self) -> int:
        return len(self.keys)

    @property
    def batch_size(self) -> int:
        return self.lengths.numel() // max(1, len(self.keys))

    def lengths_2d(self) -> torch.Tensor:
        """Lengths as (F, B)."""
        return self.lengths.view(len(self.keys), self.batch_size)

    def offsets(self) -> torch.Tensor:
        """Exclusive prefix sum of lengths, (F*B + 1,), int64."""
        out = torch.zeros(self.lengths.numel() + 1, dtype=torch.int64, device=self.lengths.device)
        torch.cumsum(self.lengths.to(torch.int64), dim=0, out=out[1:])
        return out

    def feature_value_counts(self) -> list[int]:
        """Number of ids of each feature, (F,) as Python ints (remembered: computed once, on
        the host before a device copy when the batch came from the host)."""
        if not self.keys:
            return []
        if self._counts is None:
            object.__setattr__(self, "_counts", tuple(self.lengths_2d().sum(dim=1).tolist()))
        return list(self._counts)  # type: ignore[arg-type]

    def _run_start(self, keys: tuple[str, ...]) -> int | None:
        """Where ``keys`` starts as a run of consecutive features of this batch, else None."""
        if not keys or keys[0] not in self.keys:
            return None
        i = self.keys.index(keys[0])
        return i if self.keys[i : i + len(keys)] == keys else None

    def _contiguous(self) -> bool:
        return (
            self.values.is_contiguous()
            and self.lengths.is_contiguous()
            and (self.weights is None or self.weights.is_contiguous())
        )

    # ---- checks -----------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError naming the feature when lengths are negative or do not sum to values."""
        if self.lengths.numel() and int(self.lengths.min()) < 0:
            f = int((self.lengths < 0).nonzero()[0, 0]) // self.batch_size
            raise ValueError(f"feature '{self.keys[f]}': negative bag length {int(self.lengths.min())}")
        total = int(self.lengths.sum()) if self.lengths.numel() else 0
        if total != self.values.numel():
            raise ValueError(
                f"SparseFeatures{list(self.keys)}: lengths sum to {total} but there are "
                f"{self.values.numel()} values"
            )

    # ---- access -----------------------------------------------------------------------------
    def by_feature(self) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """{key: (values, lengths (B,), weights or None)} for each feature."""
        counts = self.feature_value_counts()
        vals = torch.split(self.values, counts)
        wts = torch.split(self.weights, counts) if self.weights is not None else [None] * len(counts)
        lens = self.lengths_2d()
        return {k: (vals[i], lens[i], wts[i]) for i, k in enumerate(self.keys)}

    def select(self, keys: Sequence[str]) -> "SparseFeatures":
        """The given features, in the given order."""
        keys = tuple(keys)
        if keys == self.keys and self._contiguous():
            # every feature in batch order (e.g. a sharding group serving every feature): this
            # batch itself, no copy (frozen; the concatenation below would rebuild it equal)
            return self
        run = self._run_start(keys)
        if run is not None and self._contiguous():
            # a run of consecutive features in batch order: views of this batch, no copy
            B, n = self.batch_size, len(keys)
            counts = self.feature_value_counts()
            v0 = sum(counts[:run])
            v1 = v0 + sum(counts[run : run + n])
            return SparseFeatures(
                keys,
                self.values[v0:v1],
                self.lengths[run * B : (run + n) * B],
                None if self.weights is None else self.weights[v0:v1],
                tuple(counts[run : run + n]),
            )
        parts = self.by_feature()
        missing = [k for k in keys if k not in parts]
        if missing:
            raise KeyError(f"features {missing} not in batch (has {list(self.keys)})")
        return SparseFeatures.from_features({k: parts[k] for k in keys}, batch_size=self.batch_size)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "SparseFeatures":
        # the per-feature counts travel as host metadata (taken now, while the lengths are here)
        counts = tuple(self.feature_value_counts()) if self.lengths.device.type == "cpu" else self._counts
        return SparseFeatures(
            self.keys,
            self.values.to(device, non_blocking=non_blocking),
            self.lengths.to(device, non_blocking=non_blocking),
            None if self.weights is None else self.weights.to(device, non_blocking=non_blocking),
            counts,
        )

    # ---- construction -----------------------------------------------------------------------
    @staticmethod
    def from_features(
        features: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
        batch_size: int | None = None,
    ) -> "SparseFeatures":
        """Build from {key: (values, lengths (B,), weights or None)}; weights all or none."""
        keys = tuple(features)
        if not keys:
            return SparseFeatures((), torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int32))
        vals = [features[k][0] for k in keys]
        lens = [features[k][1] for k in keys]
        wts = [features[k][2] for k in keys]
        sizes = {int(l.numel()) for l in lens}
        if len(sizes) != 1 or (batch_size is not None and sizes != {batch_size}):
            raise ValueError(f"features have different batch sizes: {dict(zip(keys, (l.numel() for l in lens)))}")
        have_w = [w is not None for w in wts]
        if any(have_w) and not all(have_w):
            raise ValueError("either every feature carries weights or none does")
        return SparseFeatures(
            keys,
            torch.cat(vals),
            torch.cat(lens),
            torch.cat(wts) if all(have_w) else None,
            tuple(int(v.numel()) for v in vals),
        )

    @staticmethod
    def concat_batches(parts: Sequence["SparseFeatures"]) -> "SparseFeatures":
        """Concatenate along the batch dimension (rank 0's samples first): the global batch."""
        keys = parts[0].keys
        if any(p.keys != keys for p in parts):
            raise ValueError("concat_batches: parts carry different feature keys")
        per = [p.by_feature() for p in parts]
        return SparseFeatures.from_features(
            {
                k: (
                    torch.cat([d[k][0] for d in per]),
                    torch.cat([d[k][1] for d in per]),
                    None if parts[0].weights is None else torch.cat([d[k][2] for d in per]),
                )
                for k in keys
            }
        )

    # ---- torchrec interop ---------------------------------------------------------------------
    def to_kjt(self):
        """A torchrec ``KeyedJaggedTensor`` with the same keys, values, lengths and weights."""
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        return KeyedJaggedTensor(
            keys=list(self.keys), values=self.values, lengths=self.lengths, weights=self.weights
        )

    @staticmethod
    def from_kjt(kjt) -> "SparseFeatures":
        """From a torchrec ``KeyedJaggedTensor`` (lossless: keys, values, lengths, weights)."""
        return SparseFeatures(
            tuple(kjt.keys()), kjt.values(), kjt.lengths(), kjt.weights_or_none()
        )


@dataclass(frozen=True)
class Batch:
    """One training batch: dense (B, n_dense) float, sparse features, labels (B,) float in {0,1}."""

    dense: torch.Tensor
    sparse: SparseFeatures
    labels: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.labels.numel())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
        )

    @staticmethod
    def concat(parts: Sequence["Batch"]) -> "Batch":
        """The global batch of several ranks' local batches, rank 0 first."""
        return Batch(
            torch.cat([p.dense for p in parts]),
            SparseFeatures.concat_batches([p.sparse for p in parts]),
            torch.cat([p.labels for p in parts]),
        )
