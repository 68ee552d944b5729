"""Distributed bad input: each is an error naming what and where, never a hang."""
import os
import time

import pytest
import torch

from neo_train.comm import CollectiveError
from neo_train.config import preset
from neo_train.data import Batch, SparseFeatures
from neo_train.sharding import ShardingPlan
from neo_train.testing import RankFailed, run_ranks
from neo_train.train import Trainer


def _cfg(**train):
    cfg = preset("tiny")
    return cfg.replace(train=cfg.train.replace(kernel_backend="reference", **train))


def _different_config_body(comm):
    cfg = _cfg()
    if comm.rank == 1:  # rank 1 was given other table sizes
        tables = tuple(t.replace(num_rows=t.num_rows + 1) for t in cfg.model.tables)
        cfg = cfg.replace(model=cfg.model.replace(tables=tables))
    plan = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size)
    try:
        Trainer(cfg, comm=comm, plan=plan, progress=False)
    except ValueError as e:
        return str(e)
    return "no error"


def test_ranks_with_different_configs_are_detected_at_start():
    msgs = run_ranks(_different_config_body, 2)
    assert all("rank(s) [1]" in m and "different" in m for m in msgs), msgs


def _bad_id_body(comm):
    cfg = _cfg()
    t = Trainer(cfg, comm=comm, plan=ShardingPlan.uniform(cfg.model, "row_wise", comm.world_size), progress=False)
    batch = next(t.train_data)
    if comm.rank == 1:
        vals = batch.sparse.values.clone()
        vals[-1] = 10_000
        batch = Batch(batch.dense, SparseFeatures(batch.sparse.keys, vals, batch.sparse.lengths), batch.labels)
    try:
        t.train_step(batch, 0)
    except (ValueError, CollectiveError) as e:
        return type(e).__name__, str(e)
    return "none", ""


def test_out_of_range_id_on_one_rank():
    start = time.time()
    (k0, m0), (k1, m1) = run_ranks(_bad_id_body, 2, collective_timeout_s=3.0)
    assert k1 == "ValueError" and "rank 1" in m1 and "id 10000 out of range" in m1 and "feature 't3'" in m1
    assert k0 == "CollectiveError", m0  # the survivor errors within the timeout instead of hanging
    assert time.time() - start < 60


def _dying_peer_body(comm, path):
    cfg = _cfg()
    t = Trainer(cfg, comm=comm, plan=ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size), progress=False)
    t.train_step(next(t.train_data), 0)
    if comm.rank == 1:
        os._exit(3)  # dies mid-run without a word
    try:
        t.train_step(next(t.train_data), 1)
        msg = "no error"
    except CollectiveError as e:
        msg = str(e)
    with open(path, "w") as f:
        f.write(msg)
    return msg


def test_a_peer_dying_mid_step_is_an_error_on_the_survivors(tmp_path):
    path = tmp_path / "rank0.txt"
    start = time.time()
    with pytest.raises(RankFailed, match=r"ranks \[1\] exited \(codes \[3\]\)"):
        run_ranks(_dying_peer_body, 2, str(path), timeout_s=60, collective_timeout_s=3.0)
    assert time.time() - start < 45
    msg = path.read_text()
    # the survivor names the collective it was in, its rank and the timeout
    assert "on rank 0" in msg and "failed or timed out" in msg and "a peer may have died" in msg, msg


def test_plan_for_another_world_size_is_rejected():
    cfg = _cfg()
    plan = ShardingPlan.uniform(cfg.model, "row_wise", 4)
    with pytest.raises(ValueError, match="world size 4, but the job has 2 ranks"):
        plan.validate(cfg.model, 2)
