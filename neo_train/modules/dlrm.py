"""DLRM: bottom MLP over dense features -> interaction with pooled embeddings -> top MLP -> logit.

The model knows nothing about distribution: ``embeddings`` is any module mapping
``SparseFeatures`` to pooled vectors (B, sum_f D_f) in feature order, the unsharded
EmbeddingBagCollection here or a sharded collection (whose result may still be in flight: a
tensor-like object that waits on first use).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..config import ModelConfig
from ..data.batch import SparseFeatures
from .interaction import make_interaction
from .mlp import MLP

__all__ = ["DLRM"]


class DLRM(nn.Module):
    def __init__(self, cfg: ModelConfig, embeddings: nn.Module, feature_dims: Sequence[int] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_dense = cfg.num_dense_features
        dims = list(feature_dims) if feature_dims is not None else [t.dim for t in cfg.tables for _ in t.feature_names]
        self.feature_dims: tuple[int, ...] = tuple(dims)
        """Width of each feature's pooled embedding, in feature order (what the interaction expects)."""
        self.bottom = MLP(cfg.num_dense_features, cfg.bottom_mlp)
        self.embeddings = embeddings
        self.interaction = make_interaction(cfg.interaction, cfg.bottom_mlp[-1], dims, cfg.dcn_num_layers, cfg.dcn_low_rank)
        self.top = MLP(self.interaction.out_features, cfg.top_mlp)
        self.logit = nn.Linear(self.top.out_features, 1)

    def dense_parameters(self) -> list[nn.Parameter]:
        """Every trainable parameter outside the embeddings (tables are updated in the backward
        by the fused optimizer; a backend such as fbgemm may hold them as Parameters)."""
        return [p for n, p in self.named_parameters() if p.requires_grad and not n.startswith("embeddings.")]

    def forward(self, dense: torch.Tensor, sparse: SparseFeatures) -> torch.Tensor:
        """dense (B, num_dense), sparse (F features of B) -> logits (B,)."""
        if dense.dim() != 2 or dense.shape[1] != self.num_dense:
            raise ValueError(
                f"dense features have shape {tuple(dense.shape)}; the model expects (B, {self.num_dense})"
            )
        if sparse.batch_size != dense.shape[0]:
            raise ValueError(f"sparse batch size {sparse.batch_size} != dense batch size {dense.shape[0]}")
        # embeddings first: a sharded collection returns its result still in flight (a lazy
        # tensor), so its all-to-all overlaps the bottom MLP and the interaction waits for it
        pooled = self.embeddings(sparse)  # (B, sum D_f)
        x = self.bottom(dense)  # (B, D)
        z = self.interaction(x, pooled)
        return self.logit(self.top(z)).squeeze(1)
