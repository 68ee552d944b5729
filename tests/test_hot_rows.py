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


def _trainer_run(comm, hot_rows, ckpt_dir, steps, pipeline=True):
    from neo_train.train import Trainer

    cfg = preset("tiny")
    cfg = cfg.replace(
        train=cfg.train.replace(steps=steps, pipeline=pipeline, checkpoint_dir=ckpt_dir, checkpoint_every=4 if ckpt_dir else 0,
                                log_every=2),
        dist=cfg.dist.replace(hot_rows=hot_rows, hot_rows_window=3),
    )  # fmt: skip
    plan = ShardingPlan.uniform(cfg.model, "row_wise", comm.world_size)
    trainer = Trainer(cfg, comm=comm, plan=plan, progress=False)
    result = trainer.run()
    tables = trainer.gather_state_dict()["tables"]
    switches = trainer.hot.switches if trainer.hot is not None else 0
    return result.losses, tables, switches, result.comm_bytes_per_step


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "plain"])
def test_trainer_with_hot_rows_switching_every_window_trains_like_without(pipeline: bool) -> None:
    """The trainer end to end (``dist.hot_rows = K``): profiles its batches, switches the hot sets
    every 3 steps (the pipelined run with the next batch's ids already split by the old sets), and
    trains like the run without replication; the input dist carries fewer ids."""
    off = run_ranks(_trainer_run, 2, "off", "", 9, pipeline)
    on = run_ranks(_trainer_run, 2, "16", "", 9, pipeline)
    assert on[0][2] == 3 and off[0][2] == 0  # switched after steps 3, 6 and 9
    torch.testing.assert_close(torch.tensor(on[0][0]), torch.tensor(off[0][0]), rtol=1e-5, atol=1e-6)
    for name, entry in off[0][1].items():
        for key, value in entry.items():
            torch.testing.assert_close(on[0][1][name][key], value, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"table {name} {key}: {m}")  # fmt: skip
    assert on[0][3]["input_dist"] < off[0][3]["input_dist"], (on[0][3], off[0][3])


def test_resume_with_hot_rows_continues_like_an_uninterrupted_run(tmp_path) -> None:
    """A checkpoint holds no replica: the owners' rows are written back first, and a resumed run
    gathers the replicas from them again."""
    whole = run_ranks(_trainer_run, 2, "16", "", 8)
    ckpt = str(tmp_path / "ck")
    first = run_ranks(_trainer_run, 2, "16", ckpt, 4)  # checkpoint at step 4
    resumed = run_ranks(_trainer_run, 2, "16", ckpt, 8)  # resumes at step 4
    assert len(first[0][0]) == 4 and len(resumed[0][0]) == 8
    torch.testing.assert_close(torch.tensor(resumed[0][0]), torch.tensor(whole[0][0]), rtol=1e-5, atol=1e-6)
    for name, entry in whole[0][1].items():
        for key, value in entry.items():
            torch.testing.assert_close(resumed[0][1][name][key], value, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"table {name} {key}: {m}")  # fmt: skip


def test_zipf_coverage_matches_the_generator_and_auto_picks_the_best_k() -> None:
    """The cost model's coverage against the synthetic generator's ids; ``auto`` picks the k with
    the largest net saving (its neighbours save less), K applies to eligible tables only."""
    import numpy as np

    from neo_train.config import Config
    from neo_train.data.synthetic import power_law_ids
    from neo_train.sharding.hot_rows import choose_hot_rows, zipf_coverage

    rng = np.random.default_rng(zlib.crc32(b"zipf_coverage"))
    for rows, alpha, k in ((100_000, 1.05, 256), (5_000, 0.8, 64), (2_000_000, 1.2, 1024)):
        ids = torch.from_numpy(power_law_ids(rng, 400_000, rows, alpha, salt=7))
        counts = torch.bincount(ids, minlength=rows).sort(descending=True).values
        empirical = float(counts[:k].sum()) / ids.numel()
        assert abs(zipf_coverage(k, rows, alpha) - empirical) < 0.02, (rows, alpha, k, empirical)
    cfg = preset("small")
    with pytest.raises(ValueError, match="dist.hot_rows"):
        cfg.replace(dist=cfg.dist.replace(hot_rows="lots"))
    assert isinstance(cfg, Config)
    plan = ShardingPlan.uniform(cfg.model, "table_wise", 4).with_overrides(cfg.model, {cfg.model.tables[0].name: "data_parallel"})
    assert choose_hot_rows(cfg, plan, 4, "off") == {}
    fixed = choose_hot_rows(cfg, plan, 4, "8")
    eligible = {t.name for t in cfg.model.tables[1:] if t.pooling == "sum" and t.num_rows > 8}
    assert set(fixed) == eligible and all(c.k == 8 for c in fixed.values())
    auto = choose_hot_rows(cfg, plan, 4, "auto")
    assert auto and set(auto) <= eligible
    for name, c in auto.items():
        assert c.net_bytes > 0 and 0 < c.coverage < 1
        for other in (c.k // 2, c.k * 2):
            if 1 <= other < cfg.model.table(name).num_rows:
                assert choose_hot_rows(cfg, plan, 4, str(other))[name].net_bytes <= c.net_bytes


def test_plan_command_shows_the_hot_rows_it_would_replicate(capsys) -> None:
    """``neo-train plan --hot-rows auto|K``: k, coverage and bytes per table under the plan."""
    import argparse

    from neo_train.planning.plan_cli import add_plan_arguments, plan_command

    p = add_plan_arguments(argparse.ArgumentParser())
    base = ["--preset", "small", "--topology", "cpu_local", "--gpus-per-node", "4"]
    assert plan_command(p.parse_args(base)) == 0
    assert "hot rows" not in capsys.readouterr().out  # the preset's dist.hot_rows is off
    assert plan_command(p.parse_args(base + ["--hot-rows", "32"])) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "hot rows" in ln or " k " in ln]
    assert lines[0].startswith("hot rows    32: ") and "MB of ids kept local" in lines[0], lines
    assert all(" k       32 " in ln for ln in lines[1:]) and len(lines) > 1, lines
