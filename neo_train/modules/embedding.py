"""Unsharded EmbeddingBagCollection: every table of the model through one fused-kernel call."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from torch import nn

from ..config import StorageConfig, TableConfig, cache_factor
from ..data.batch import SparseFeatures
from ..kernels import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec
from ..kernels.init import init_table
from .storage import create_table_kernel, init_kernel_table

__all__ = ["EmbeddingBagCollection", "init_table", "check_sparse"]


def check_sparse(
    sparse: SparseFeatures,
    feature_names: Sequence[str],
    rows: Sequence[int],
    *,
    check: bool = True,
    id_mode: str = "strict",
    where: str = "",
) -> SparseFeatures:
    """The input checks of an embedding collection, on whatever device ``sparse`` is on.

    Always: the features are ``feature_names`` in that order. With ``check``: bag lengths are
    non-negative and sum to the number of ids, and every id of feature f lies in [0, rows[f])
    (``id_mode='strict'``). ``id_mode='modulo'`` maps ids into their table instead (id % rows).
    Errors are ValueErrors naming the feature, prefixed by ``where`` (e.g. "rank 1: ").
    """
    if sparse.keys != tuple(feature_names):
        raise ValueError(
            f"{where}sparse features {list(sparse.keys)} do not match the model's features "
            f"{list(feature_names)} (same names, same order)"
        )
    if not check and id_mode != "modulo":
        return sparse
    if check:
        sparse.validate()
    counts = sparse.feature_value_counts()
    n = sparse.values.numel()
    per_id = torch.repeat_interleave(torch.tensor(list(rows), dtype=torch.int64), torch.tensor(counts, dtype=torch.int64),
                                     output_size=n).to(sparse.values.device)
    if id_mode == "modulo":
        return dataclasses.replace(sparse, values=torch.remainder(sparse.values, per_id))
    bad = (sparse.values < 0) | (sparse.values >= per_id)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        f, end = 0, counts[0]
        while i >= end:
            f += 1
            end += counts[f]
        raise ValueError(f"{where}feature '{sparse.keys[f]}': id {int(sparse.values[i])} out of range [0, {rows[f]})")
    return sparse


class EmbeddingBagCollection(nn.Module):
    """All tables on one device; ``forward(sparse) -> (B, sum_f D_f)`` in feature order.

    Features must arrive in ``feature_names`` order (the model config's order). With
    ``id_mode='modulo'`` ids are hashed into their table (id mod rows) instead of rejected.
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        optimizer: SparseOptimizerSpec,
        backend: str | None = "auto",
        device: torch.device | str = "cpu",
        seed: int = 0,
        id_mode: str = "strict",
        storage: StorageConfig | None = None,
    ) -> None:
        super().__init__()
        self.tables = tuple(tables)
        self.feature_names: tuple[str, ...] = tuple(f for t in self.tables for f in t.feature_names)
        feature_table_map = [ti for ti, t in enumerate(self.tables) for _ in t.feature_names]
        self.feature_dims: tuple[int, ...] = tuple(self.tables[t].dim for t in feature_table_map)
        self.id_mode = id_mode
        self.kernel: FusedEmbeddingBag = create_table_kernel(
            backend,
            [TableSpec(t.num_rows, t.dim, t.pooling, t.name) for t in self.tables],
            optimizer,
            factors=[cache_factor(t, storage) for t in self.tables],
            storage=storage,
            store_name="rank0/tables",
            feature_table_map=feature_table_map,
            feature_names=self.feature_names,
            device=device,
            seed=seed,
        )
        if torch.device(device).type != "meta":  # on meta: shapes only (a model to be sharded)
            for ti, t in enumerate(self.tables):
                init_kernel_table(self.kernel, ti, seed, ti, t, 0, t.num_rows, 0, t.dim)
        self.kernel.check_ids = False  # validate() checks the ids, naming the feature
        self._rows = [self.tables[t].num_rows for t in feature_table_map]
        # False when the caller (the trainer) validates batches on the host before the device copy
        self.validate_in_forward = True

    @property
    def backend_name(self) -> str:
        return self.kernel.backend_name

    def validate(self, sparse: SparseFeatures, check: bool = True) -> SparseFeatures:
        """Feature names; with ``check`` lengths and id ranges; the modulo id mapping."""
        return check_sparse(sparse, self.feature_names, self._rows, check=check, id_mode=self.id_mode)

    def forward(self, sparse: SparseFeatures) -> torch.Tensor:
        if self.validate_in_forward:
            sparse = self.validate(sparse)
        return self.kernel(sparse.values, sparse.offsets(), sparse.weights)  # (B, sum D_f)

    def prefetch(self, sparse: SparseFeatures) -> None:
        """Bring a batch's rows into a cached kernel ahead of its lookup (nothing when resident)."""
        if hasattr(self.kernel, "prefetch"):
            self.kernel.prefetch(sparse.values, sparse.offsets())

    # ---- export ---------------------------------------------------------------------------
    def table(self, name: str) -> torch.Tensor:
        """A float32 copy of the named table, (rows, dim)."""
        return self.kernel.get_table(self._index(name))

    def table_state(self, name: str) -> dict[str, torch.Tensor]:
        return self.kernel.get_state(self._index(name))

    def _index(self, name: str) -> int:
        for i, t in enumerate(self.tables):
            if t.name == name:
                return i
        raise KeyError(f"no table named '{name}'")
