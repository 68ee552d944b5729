"""Unsharded EmbeddingBagCollection: every table of the model through one fused-kernel call."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..config import TableConfig
from ..data.batch import SparseFeatures
from ..kernels import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec, create_embedding_bag
from ..kernels.init import init_table

__all__ = ["EmbeddingBagCollection", "init_table"]


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
    ) -> None:
        super().__init__()
        self.tables = tuple(tables)
        self.feature_names: tuple[str, ...] = tuple(f for t in self.tables for f in t.feature_names)
        feature_table_map = [ti for ti, t in enumerate(self.tables) for _ in t.feature_names]
        self.feature_dims: tuple[int, ...] = tuple(self.tables[t].dim for t in feature_table_map)
        self.id_mode = id_mode
        self.kernel: FusedEmbeddingBag = create_embedding_bag(
            backend,
            [TableSpec(t.num_rows, t.dim, t.pooling, t.name) for t in self.tables],
            optimizer,
            feature_table_map=feature_table_map,
            feature_names=self.feature_names,
            device=device,
        )
        for ti, t in enumerate(self.tables):
            self.kernel.set_table(ti, init_table(seed, ti, t.num_rows, t.dim))
        self.register_buffer(
            "_rows_per_feature",
            torch.tensor([self.tables[t].num_rows for t in feature_table_map], dtype=torch.int64),
            persistent=False,
        )

    @property
    def backend_name(self) -> str:
        return self.kernel.backend_name

    def forward(self, sparse: SparseFeatures) -> torch.Tensor:
        if sparse.keys != self.feature_names:
            raise ValueError(
                f"sparse features {list(sparse.keys)} do not match the model's features "
                f"{list(self.feature_names)} (same names, same order)"
            )
        sparse.validate()
        values = sparse.values
        if self.id_mode == "modulo":
            rows = self._rows_per_feature.to(values.device).repeat_interleave(
                torch.tensor(sparse.feature_value_counts(), device=values.device), output_size=values.numel()
            )
            values = torch.remainder(values, rows)
        return self.kernel(values, sparse.offsets(), sparse.weights)  # (B, sum D_f)

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
