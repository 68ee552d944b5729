import numpy as np
import pytest
import torch

from neo_train.config import preset
from neo_train.data import Batch, SyntheticData
from neo_train.data.synthetic import bag_lengths, power_law_ids


def test_deterministic_per_seed_rank_step():
    cfg = preset("small")
    a = SyntheticData(cfg.model, cfg.data, 64, seed=3, rank=1, world_size=2)
    b = SyntheticData(cfg.model, cfg.data, 64, seed=3, rank=1, world_size=2)
    x, y = a.batch(5), b.batch(5)
    assert torch.equal(x.sparse.values, y.sparse.values) and torch.equal(x.dense, y.dense) and torch.equal(x.labels, y.labels)
    other = [SyntheticData(cfg.model, cfg.data, 64, seed=s, rank=r, world_size=2).batch(st) for s, r, st in ((4, 1, 5), (3, 0, 5), (3, 1, 6))]
    for o in other:
        assert not torch.equal(o.sparse.values[:50], x.sparse.values[:50])
    ev = SyntheticData(cfg.model, cfg.data, 64, seed=3, rank=1, world_size=2, stream="eval").batch(5)
    assert not torch.equal(ev.dense, x.dense)


def test_batches_are_valid_and_in_range():
    cfg = preset("small")
    batch = SyntheticData(cfg.model, cfg.data, 512, seed=0).batch(0)
    batch.sparse.validate()
    assert batch.sparse.keys == cfg.model.feature_names
    assert batch.dense.shape == (512, 13) and torch.isfinite(batch.dense).all()
    for t, (k, (vals, lens, _)) in zip(cfg.model.tables, batch.sparse.by_feature().items()):
        assert vals.numel() and int(vals.min()) >= 0 and int(vals.max()) < t.num_rows
        assert (lens == 0).any(), f"{k}: expected some empty bags"
        assert abs(float(lens.float().mean()) - t.pooling_factor) < 0.25 * t.pooling_factor + 0.1


def test_power_law_is_skewed_and_bounded():
    rng = np.random.default_rng(0)
    ids = power_law_ids(rng, 200_000, 10_000, 1.1, salt=5)
    assert ids.min() >= 0 and ids.max() < 10_000
    counts = np.sort(np.bincount(ids, minlength=10_000))[::-1]
    assert counts[:100].sum() > 0.3 * counts.sum()  # the top 1% of rows take a large share
    assert int(np.argmax(np.bincount(ids))) != 0  # the hottest row is scrambled away from row 0
    uniform = power_law_ids(rng, 100_000, 1000, 0.0, salt=0)
    assert np.bincount(uniform, minlength=1000).max() < 200
    assert (power_law_ids(rng, 10, 1, 1.1, salt=3) == 0).all()


def test_bag_lengths_mean_and_empties():
    rng = np.random.default_rng(1)
    for lf in (0.5, 1.0, 15.0):
        lens = bag_lengths(rng, 100_000, lf)
        assert abs(lens.mean() - lf) < 0.05 * lf + 0.01
        assert (lens == 0).any()


def test_ranks_concatenate_to_the_global_batch():
    cfg = preset("tiny")
    parts = [SyntheticData(cfg.model, cfg.data, 8, seed=0, rank=r, world_size=3).batch(2) for r in range(3)]
    whole = Batch.concat(parts)
    assert whole.batch_size == 24
    whole.sparse.validate()


def test_labels_depend_on_the_inputs():
    # The teacher must make labels predictable: the Bayes-style score (teacher logits) must rank
    # labels far better than chance, and labels must be balanced enough to learn from.
    from neo_train.train.metrics import auc

    cfg = preset("small")
    d = SyntheticData(cfg.model, cfg.data, 4096, seed=0)
    b = d.batch(0)
    assert 0.2 < float(b.labels.mean()) < 0.8
    # A crude predictor from dense features alone already beats chance by a margin.
    score = torch.from_numpy(d.teacher.v).float() @ ((b.dense - 1.5).T)
    assert auc(score, b.labels) > 0.55
