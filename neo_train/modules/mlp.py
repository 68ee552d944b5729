"""Multi-layer perceptron used by the bottom and top of the DLRM."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["MLP"]


class MLP(nn.Sequential):
    """Linear -> ReLU for every width in ``widths`` (in_features -> widths[0] -> ... -> widths[-1])."""

    def __init__(self, in_features: int, widths: Sequence[int]) -> None:
        layers: list[nn.Module] = []
        d = in_features
        for w in widths:
            layers += [nn.Linear(d, w), nn.ReLU()]
            d = w
        super().__init__(*layers)
        self.out_features = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in) -> (B, out)
        return super().forward(x)
