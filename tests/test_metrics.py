import math

import pytest
import torch

from neo_train.train.metrics import auc, binary_metrics, log_loss, normalized_entropy


def _auc_bruteforce(s, y):
    pos = [a for a, l in zip(s, y) if l == 1]
    neg = [a for a, l in zip(s, y) if l == 0]
    tot = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return tot / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_matches_pairwise_definition_with_ties(seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, 6, (80,), generator=g).float()  # many ties
    y = torch.randint(0, 2, (80,), generator=g).float()
    assert auc(s, y) == pytest.approx(_auc_bruteforce(s.tolist(), y.tolist()), abs=1e-12)
    s2 = torch.randn(60, generator=g)
    y2 = torch.randint(0, 2, (60,), generator=g).float()
    assert auc(s2, y2) == pytest.approx(_auc_bruteforce(s2.tolist(), y2.tolist()), abs=1e-12)


def test_auc_extremes():
    y = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), y) == 1.0
    assert auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), y) == 0.0
    assert math.isnan(auc(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 1.0])))


def test_log_loss_and_ne():
    y = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    logits = torch.tensor([2.0, -1.0, 0.5, 0.0], dtype=torch.float64)
    p = torch.sigmoid(logits)
    expect = -float((y * p.log() + (1 - y) * (1 - p).log()).mean())
    assert log_loss(logits, y) == pytest.approx(expect, rel=1e-9)
    assert normalized_entropy(logits, y) == pytest.approx(expect / math.log(2), rel=1e-9)
    # predicting the base rate gives NE = 1
    base = torch.full((4,), 0.0)
    assert normalized_entropy(base, y) == pytest.approx(1.0, rel=1e-9)
    m = binary_metrics(logits, y)
    assert set(m) == {"auc", "ne", "log_loss", "ctr", "samples"} and m["samples"] == 4
