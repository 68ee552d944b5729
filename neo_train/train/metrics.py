"""Evaluation metrics for binary click prediction.

    log loss  L = -mean(y log p + (1-y) log(1-p))
    NE        normalized entropy = L / H(p_bar), H the entropy of the average label p_bar
              (He et al., "Practical lessons from predicting clicks on ads at Facebook"): 1.0 is
              no better than predicting the base rate; lower is better.
    AUC       probability that a random positive scores above a random negative (ties count
              one half), from the Mann-Whitney rank sum with average ranks for ties.
"""
from __future__ import annotations

import math

import torch

__all__ = ["auc", "log_loss", "normalized_entropy", "binary_metrics"]


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC of scores (N,) against {0,1} labels (N,); NaN when one class is absent."""
    s = scores.detach().double().flatten()
    y = labels.detach().flatten() > 0.5
    n1 = int(y.sum())
    n0 = y.numel() - n1
    if n1 == 0 or n0 == 0:
        return float("nan")
    order = torch.argsort(s)
    s_sorted = s[order]
    ranks = torch.empty_like(s)
    ranks[order] = torch.arange(1, s.numel() + 1, dtype=torch.float64)
    # average ranks over ties: each tie group gets the mean of its positions
    uniq, inverse, counts = torch.unique_consecutive(s_sorted, return_inverse=True, return_counts=True)
    if uniq.numel() != s.numel():
        ends = torch.cumsum(counts, 0).double()
        avg = ends - (counts.double() - 1) / 2.0
        ranks[order] = avg[inverse]
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def log_loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float(torch.nn.functional.binary_cross_entropy_with_logits(logits.double(), labels.double()))


def normalized_entropy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    p = float(labels.double().mean())
    if p <= 0.0 or p >= 1.0:
        return float("nan")
    h = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    return log_loss(logits, labels) / h


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """{'auc', 'ne', 'log_loss', 'ctr', 'samples'} over a whole evaluation set."""
    return {
        "auc": auc(logits, labels),
        "ne": normalized_entropy(logits, labels),
        "log_loss": log_loss(logits, labels),
        "ctr": float(labels.float().mean()),
        "samples": int(labels.numel()),
    }
