"""Feature interactions between the dense embedding and the pooled sparse embeddings.

    dot  pairwise dot products of the F+1 vectors (dense first), strict upper triangle,
         concatenated after the dense vector: out (B, D + (F+1)F/2). Needs every dim == D.
    cat  plain concatenation: out (B, D + sum_f D_f).
    dcn  DCNv2 cross network on the concatenation x0 (B, n):
         x_{l+1} = x0 * (W_l x_l + b_l) + x_l, W_l full (n, n) or low-rank U_l V_l.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["DotInteraction", "CatInteraction", "DCNInteraction", "make_interaction"]


class _PairwiseProducts(torch.autograd.Function):
    """The strict upper triangle of x x^T per sample, x (B, n, D) -> (B, n(n-1)/2), with its
    backward written out: the gradient of the products is copied into an (n, n) matrix per sample
    (not advanced indexing's accumulating scatter) and dx = (G + G^T) x, one bmm. About twice as
    fast as autograd's backward of the indexed form on CPU at the ``small`` preset's sizes."""

    @staticmethod
    def forward(ctx, x, flat):  # type: ignore[override]
        B, n, _ = x.shape
        ctx.save_for_backward(x, flat)
        return torch.bmm(x, x.transpose(1, 2)).view(B, n * n).index_select(1, flat)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, flat = ctx.saved_tensors
        B, n, _ = x.shape
        gz = grad.new_zeros(B, n * n).index_copy_(1, flat, grad).view(B, n, n)
        return torch.bmm(gz + gz.transpose(1, 2), x), None


class DotInteraction(nn.Module):
    def __init__(self, dense_dim: int, feature_dims: Sequence[int]) -> None:
        super().__init__()
        bad = [d for d in feature_dims if d != dense_dim]
        if bad:
            raise ValueError(f"dot interaction needs every embedding dim == {dense_dim}, got {sorted(set(bad))}")
        n = len(feature_dims) + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("_flat", rows * n + cols, persistent=False)  # strict upper triangle of (n, n)
        self.num_vectors = n
        self.out_features = dense_dim + n * (n - 1) // 2

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """dense (B, D), pooled (B, F*D) -> (B, D + (F+1)F/2)."""
        B, D = dense.shape
        x = torch.cat([dense, pooled], dim=1).view(B, self.num_vectors, D)  # waits for a pooled still in flight
        return torch.cat([dense, _PairwiseProducts.apply(x, self._flat)], dim=1)


class CatInteraction(nn.Module):
    def __init__(self, dense_dim: int, feature_dims: Sequence[int]) -> None:
        super().__init__()
        self.out_features = dense_dim + sum(feature_dims)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return torch.cat([dense, pooled], dim=1)  # (B, D + sum D_f)


class DCNInteraction(nn.Module):
    def __init__(self, dense_dim: int, feature_dims: Sequence[int], num_layers: int, low_rank: int = 0) -> None:
        super().__init__()
        n = dense_dim + sum(feature_dims)
        self.out_features = n
        if low_rank > 0:
            self.U = nn.ParameterList([nn.Parameter(torch.empty(n, low_rank)) for _ in range(num_layers)])
            self.V = nn.ParameterList([nn.Parameter(torch.empty(low_rank, n)) for _ in range(num_layers)])
            for p in [*self.U, *self.V]:
                nn.init.xavier_normal_(p)
            self.W = None
        else:
            self.W = nn.ParameterList([nn.Parameter(torch.empty(n, n)) for _ in range(num_layers)])
            for p in self.W:
                nn.init.xavier_normal_(p)
        self.b = nn.ParameterList([nn.Parameter(torch.zeros(n)) for _ in range(num_layers)])

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([dense, pooled], dim=1)  # (B, n)
        x = x0
        for i, b in enumerate(self.b):
            xw = x @ self.W[i].T if self.W is not None else (x @ self.V[i].T) @ self.U[i].T
            x = x0 * (xw + b) + x
        return x


def make_interaction(kind: str, dense_dim: int, feature_dims: Sequence[int], dcn_layers: int = 2, dcn_low_rank: int = 0) -> nn.Module:
    if kind == "dot":
        return DotInteraction(dense_dim, feature_dims)
    if kind == "cat":
        return CatInteraction(dense_dim, feature_dims)
    if kind == "dcn":
        return DCNInteraction(dense_dim, feature_dims, dcn_layers, dcn_low_rank)
    raise ValueError(f"unknown interaction {kind!r} (dot, cat, dcn)")
