"""Hot-row replication (issue 13): a table's k hot rows replicated on every rank as a
data-parallel table; hot ids pooled locally, the cold ids through the table's plan.

Exactness: training with replication gives the per-step losses, tables and optimizer state of
training without it (float32 rounding apart: a bag's pooled row is summed as cold part + hot part,
and a hot row's gradient is all-reduced instead of summed by its owner), for SGD, row-wise
AdaGrad and Adam, table-wise / row-wise / table-row-wise, across a change of the hot sets (rows
and state written back to their owners, the new rows gathered from theirs).
"""
from __future__ import annotations

import zlib

import pytest
import torch

from neo_train.config import preset
from neo_train.parallel.model_parallel import DistributedModelParallel
from neo_train.sharding import ShardingPlan
from neo_train.sharding.collection import HOT_SUFFIX
from neo_train.testing import run_ranks
from neo_train.train.trainer import make_data, make_dense_optimizer

HOT = {"t0": 16, "t2": 24}  # tiny: t0 has 100 rows, t2 250 (t1 is mean-pooled, t3 has 1 row)
STEPS, SWITCH = 6, 3


def _train(comm, hot, sharding, optimizer, seed):
    cfg = preset("tiny")
    cfg = cfg.replace(train=cfg.train.replace(kernel_backend="reference", sparse_optimizer=optimizer, seed=seed))
    local = 2 if sharding == "table_row_wise" else None
    plan = ShardingPlan.uniform(cfg.model, sharding, comm.world_size, local)
    m = DistributedModelParallel(cfg, plan, comm, hot_rows=hot)
    opt = make_dense_optimizer(cfg.train, m.dense_parameters())
    data = make_data(cfg, "train", comm.rank, comm.world_size)
    losses, hot_ids_seen = [], 0
    gen = torch.Generator().manual_seed(seed)
    for step in range(STEPS):
        if hot and step == SWITCH:  # a new hot set: rows partly kept, partly promoted / demoted
            old = m.embeddings.hot_rows
            new = {}
            for t, k in hot.items():
                keep = old[t][: k // 2]
                rest = torch.tensor([i for i in torch.randperm(cfg.model.table(t).num_rows, generator=gen).tolist()
                                     if i not in set(keep.tolist())][: k - keep.numel()])  # fmt: skip
                new[t] = torch.cat([keep, rest])
            m.embeddings.set_hot_rows(new)
        b = next(data)
        if hot:
            for t in hot:
                ids = torch.cat([b.sparse.by_feature()[f][0] for f in cfg.model.table(t).feature_names])
                hot_ids_seen += int(torch.isin(ids, m.embeddings.hot_rows[t]).sum())
        out = m(b.dense, b.sparse)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(-1), b.labels.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        comm.all_reduce(t, op="avg", tag="test_loss")
        losses.append(t.item())
    return losses, m.gather_state_dict()["tables"], hot_ids_seen


CASES = [  # (optimizer, sharding, world size); the rest of the sweep under -m slow
    ("rowwise_adagrad", "table_wise", 2),
    ("adam", "row_wise", 3),
    ("sgd", "table_row_wise", 4),
]
SLOW = [(o, s, w) for o in ("sgd", "rowwise_adagrad", "adam") for s in ("table_wise", "row_wise")
        for w in (2, 3, 4) if (o, s, w) not in CASES]  # fmt: skip


@pytest.mark.parametrize("optimizer,sharding,W", CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW])
def test_replication_trains_like_no_replication(optimizer: str, sharding: str, W: int) -> None:
    seed = zlib.crc32(f"{optimizer}-{sharding}-{W}".encode()) % 1000
    base = run_ranks(_train, W, None, sharding, optimizer, seed)
    hot = run_ranks(_train, W, HOT, sharding, optimizer, seed)
    assert sum(h[2] for h in hot) > 50, "too few hot ids in the batches: the test would not exercise the split"
    torch.testing.assert_close(torch.tensor(hot[0][0]), torch.tensor(base[0][0]), rtol=1e-5, atol=1e-6)
    tables_a, tables_b = base[0][1], hot[0][1]
    assert set(tables_b) == set(tables_a) and not any(n.endswith(HOT_SUFFIX) for n in tables_b)
    for name, entry in tables_a.items():
        for key, value in entry.items():
            torch.testing.assert_close(tables_b[name][key], value, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"table {name} {key}: {m}")  # fmt: skip


def _refusals(comm):
    cfg = preset("tiny")
    cfg = cfg.replace(train=cfg.train.replace(kernel_backend="reference"))
    tw = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size)
    cw = tw.with_overrides(cfg.model, {"t2": "column_wise"})
    errors = []
    for plan, hot in ((tw, {"nope": 3}), (tw, {"t0": 100}), (tw, {"t0": 0}), (tw, {"t1": 4}), (cw, {"t2": 4})):
        try:
            DistributedModelParallel(cfg, plan, comm, hot_rows=hot)
            errors.append("")
        except ValueError as e:
            errors.append(str(e))
    m = DistributedModelParallel(cfg, tw, comm, hot_rows={"t0": 4})
    for bad in ({"t2": torch.arange(4)}, {"t0": torch.arange(3)}, {"t0": torch.tensor([0, 1, 2, 100])},
                {"t0": torch.tensor([0, 1, 1, 2])}):  # fmt: skip
        try:
            m.embeddings.set_hot_rows(bad)
            errors.append("")
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_bad_hot_row_settings_are_refused_naming_the_table() -> None:
    errors = run_ranks(_refusals, 2)[0]
    expected = [
        "unknown table 'nope'", "table 't0': k must be in [1, 100), got 100", "table 't0': k must be in [1, 100), got 0",
        "table 't1' uses mean pooling", "table 't2' is column_wise",
        "table 't2' has no hot-row replication", "table 't0' replicates 4 rows, got 3",
        "table 't0': hot ids must be in [0, 100)", "table 't0': hot ids must be distinct",
    ]  # fmt: skip
    assert len(errors) == len(expected)
    for got, want in zip(errors, expected):
        assert want in got, (want, got)
