"""Synthetic DLRM data: power-law ids, variable bags, labels from a fixed hidden teacher.

Every batch is a pure function of (seed, stream, rank, step): rank r's local batch at step s is
the same whichever process draws it, so W ranks' local batches concatenate to a well-defined
global batch that a single process can rebuild (the sharded-vs-unsharded parity tests rely on it).

Ids. Table t draws the popularity rank k of each id from a bounded power law on [1, R]
(P(k) ~ k^-alpha, sampled by inverting the continuous CDF) and maps it to a row with the
bijection id = (k * P + c_t) mod R (P prime, coprime with R), so hot rows are spread over the
table instead of sitting at row 0 (which would flatter row-wise sharding).

Bags. With pooling factor L >= 1: 5 % of bags are empty, the rest have 1 + Poisson(L/0.95 - 1)
ids (mean L). With L < 1: one id with probability L, else empty.

Teacher. A fixed function of the inputs, independent of the training seed:
    u_t(id)   uniform in [-1, 1] from a hash of (teacher_seed, t, id)      (per-id "taste")
    p_f(b)    mean of u_t over the ids of feature f in sample b (0 for an empty bag)
    logit(b)  = scale * (sum_f a_f p_f  +  sum_(f,g) c_fg p_f p_g  +  v . z(b)) + bias
with z the standardised dense features and a, c, v fixed random coefficients normalised so the
three terms have comparable variance. labels ~ Bernoulli(sigmoid(logit)). A model that learns
the hot ids' tastes and the dense weights reaches an AUC well above 0.5.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from ..config import DataConfig, ModelConfig
from .batch import Batch, SparseFeatures

__all__ = ["SyntheticData", "power_law_ids", "bag_lengths", "EMPTY_BAG_SHARE"]

EMPTY_BAG_SHARE = 0.05
"""With pooling factor L >= 1, the share of empty bags; the rest have 1 + Poisson(L / (1 - it) - 1)
ids, so the mean is L (``bag_lengths``; the hot-row chooser's ``all_hot_fraction`` uses the law)."""

_STREAMS = {"train": 0, "eval": 1}
_PRIMES = (2654435761, 2246822519, 3266489917, 668265263, 374761393)
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A 64-bit mixing hash (uint64 in, uint64 out); wraps modulo 2^64 by design."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _hash_uniform(seed: int, table: int, ids: np.ndarray) -> np.ndarray:
    """Deterministic uniform[-1, 1) per (seed, table, id)."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.uint64(seed) * np.uint64(1000003) + np.uint64(table))
        h = _splitmix64(ids.astype(np.uint64) ^ key)
    return (h >> np.uint64(11)).astype(np.float64) * (2.0 / float(1 << 53)) - 1.0


def power_law_ids(rng: np.random.Generator, n: int, rows: int, alpha: float, salt: int) -> np.ndarray:
    """n ids in [0, rows) whose popularity ranks follow P(k) ~ k^-alpha, scrambled over the rows."""
    u = rng.random(n)
    if rows == 1:
        return np.zeros(n, dtype=np.int64)
    if alpha == 0:
        k = np.floor(u * rows) + 1.0
    elif abs(alpha - 1.0) < 1e-9:
        k = np.floor(np.exp(u * np.log(rows)))
    else:
        e = 1.0 - alpha
        k = np.floor((1.0 + u * (rows**e - 1.0)) ** (1.0 / e))
    k = np.clip(k.astype(np.int64) - 1, 0, rows - 1)  # popularity rank 0 = hottest
    p = next(q for q in _PRIMES if rows % q != 0)
    return (k * (p % rows) + salt % rows) % rows


def bag_lengths(rng: np.random.Generator, batch_size: int, pooling_factor: float) -> np.ndarray:
    """(B,) bag lengths with mean ``pooling_factor``, including empty bags (module docstring)."""
    if pooling_factor < 1.0:
        return (rng.random(batch_size) < pooling_factor).astype(np.int64)
    extra = rng.poisson(max(pooling_factor / (1.0 - EMPTY_BAG_SHARE) - 1.0, 0.0), batch_size)
    return np.where(rng.random(batch_size) < EMPTY_BAG_SHARE, 0, 1 + extra).astype(np.int64)


class _Teacher:
    """The fixed hidden labeller (see module docstring)."""

    def __init__(self, model: ModelConfig, data: DataConfig) -> None:
        rng = np.random.default_rng([data.teacher_seed, 7])
        F = len(model.feature_names)
        self.seed = data.teacher_seed
        self.scale = data.teacher_scale
        self.a = rng.normal(size=F) / np.sqrt(F) * np.sqrt(3.0)  # u has variance 1/3
        n_pairs = min(F * (F - 1) // 2, 2 * F)
        pairs = [(i, j) for i in range(F) for j in range(i + 1, F)]
        pick = rng.choice(len(pairs), size=n_pairs, replace=False) if n_pairs else []
        self.pairs = [pairs[k] for k in pick]
        self.c = rng.normal(size=len(self.pairs)) * 3.0 / np.sqrt(max(1, len(self.pairs)))
        self.v = rng.normal(size=model.num_dense_features) / np.sqrt(model.num_dense_features)
        self.bias = -0.3

    def logits(self, dense: np.ndarray, pooled: np.ndarray) -> np.ndarray:
        """dense (B, 13) log-transformed, pooled (F, B) mean tastes -> (B,) logits."""
        z = (dense - 1.5) / 1.0  # dense ~ log1p(lognormal counts): centre and scale roughly
        lin = self.a @ pooled
        inter = sum(c * pooled[i] * pooled[j] for c, (i, j) in zip(self.c, self.pairs)) if self.pairs else 0.0
        return self.scale * (lin + inter + z @ self.v) + self.bias


class SyntheticData:
    """Deterministic synthetic batches for one rank: ``batch(step)`` or iterate from a step."""

    def __init__(
        self,
        model: ModelConfig,
        data: DataConfig,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        stream: str = "train",
    ) -> None:
        if stream not in _STREAMS:
            raise ValueError(f"stream must be one of {list(_STREAMS)}, got {stream!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        self.model, self.data = model, data
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.stream = _STREAMS[stream]
        self.teacher = _Teacher(model, data)
        # one entry per feature: (table index, table config)
        self._features = [(ti, t) for ti, t in enumerate(model.tables) for _ in t.feature_names]

    def batch(self, step: int) -> Batch:
        """Rank ``self.rank``'s local batch at ``step`` (B = batch_size)."""
        B = self.batch_size
        rng = np.random.default_rng([self.seed, self.stream, self.rank, step, 0x5EED])
        dense = np.log1p(np.floor(rng.lognormal(mean=1.5, sigma=1.2, size=(B, self.model.num_dense_features))))
        lengths, values, pooled = [], [], np.zeros((len(self._features), B))
        for f, (ti, t) in enumerate(self._features):
            lens = bag_lengths(rng, B, t.pooling_factor)
            alpha = self.data.zipf_alpha if t.zipf_alpha is None else t.zipf_alpha
            ids = power_law_ids(rng, int(lens.sum()), t.num_rows, alpha, salt=ti * 7919 + 13)
            taste = _hash_uniform(self.teacher.seed, ti, ids)
            bag = np.repeat(np.arange(B), lens)
            np.add.at(pooled[f], bag, taste)
            pooled[f] /= np.maximum(lens, 1)
            lengths.append(lens)
            values.append(ids)
        p = 1.0 / (1.0 + np.exp(-self.teacher.logits(dense, pooled)))
        labels = (rng.random(B) < p).astype(np.float32)
        sparse = SparseFeatures(
            self.model.feature_names,
            torch.from_numpy(np.concatenate(values) if values else np.zeros(0, np.int64)),
            torch.from_numpy(np.concatenate(lengths).astype(np.int32)),
        )
        return Batch(torch.from_numpy(dense.astype(np.float32)), sparse, torch.from_numpy(labels))

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate(0)

    def iterate(self, start_step: int = 0) -> Iterator[Batch]:
        step = start_step
        while True:
            yield self.batch(step)
            step += 1
