"""Checkpoints: exact resume under the same plan, N -> M resharding, damage detection, refusal of
another model, and loading without unpickling."""
import json
import pickle
import random
import shutil

import numpy as np
import pytest
import torch

from neo_train.config import preset
from neo_train.sharding import ShardingPlan
from neo_train.testing import run_ranks
from neo_train.train import Trainer
from neo_train.train.checkpoint import (
    CheckpointError,
    check_resumable,
    checkpoint_dir,
    data_start_batch,
    find_latest,
    load_checkpoint,
    resume_from_latest,
    save_checkpoint,
    verify_checkpoint,
)
from neo_train.train.trainer import make_data

K, k = 6, 3  # steps in all; the step the interrupted run stops and saves at


def _cfg(sparse="rowwise_adagrad", dense="adagrad", **model):
    cfg = preset("tiny")
    cfg = cfg.replace(
        train=cfg.train.replace(steps=K, batch_size=8, kernel_backend="reference", sparse_optimizer=sparse,
                                dense_optimizer=dense, eval_batches=1),
    )
    if model:
        cfg = cfg.replace(model=cfg.model.replace(**model))
    return cfg


def _train(t: Trainer, start: int, stop: int) -> list[float]:
    return [t.train_step(next(t.train_data), s) for s in range(start, stop)]


def _resume(t: Trainer, directory) -> int:
    """Load, then restart the data stream where the checkpoint stopped (Trainer.run will do this)."""
    start = load_checkpoint(t, directory)
    t.train_data = make_data(t.cfg, "train", t.rank, t.world_size, start)
    return start


def _opt_state(t: Trainer) -> dict:
    """A copy of the dense optimizer's state tensors (state_dict() hands out the live ones)."""
    return {i: {k: v.clone() for k, v in st.items()} for i, st in t.optimizer.state_dict()["state"].items()}


def _assert_same_state(got, ref, exact=True):
    for name, v in ref["dense"].items():
        assert torch.equal(got["dense"][name], v), f"dense {name}"
    for table, entry in ref["tables"].items():
        for key, v in entry.items():
            g = got["tables"][table][key]
            if g.shape != v.shape and key == "momentum":  # column-wise on one side: one row per column shard
                g, v = torch.broadcast_tensors(g, v)
            assert torch.equal(g, v), f"{table}.{key}"


def _assert_same_optimizer(got: dict, ref: dict):
    assert got.keys() == ref.keys()
    for idx in ref:
        for key, v in ref[idx].items():
            assert torch.equal(got[idx][key], v), f"dense optimizer state {idx}.{key}"


# ---- (a) same plan: the resumed run continues exactly ---------------------------------------------
@pytest.mark.parametrize("sparse, dense", [("rowwise_adagrad", "adagrad"), ("adam", "adam"), ("adagrad", "sgd")])
def test_resume_single_process_is_exact(tmp_path, sparse, dense):
    cfg = _cfg(sparse, dense)
    full = Trainer(cfg, progress=False)
    ref_losses = _train(full, 0, K)

    first = Trainer(cfg, progress=False)
    losses = _train(first, 0, k)
    save_checkpoint(first, checkpoint_dir(tmp_path, k), k)
    draws = (torch.rand(3), np.random.rand(3), random.random())  # what the RNGs give after the save
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    resumed = Trainer(cfg, progress=False)
    assert _resume(resumed, find_latest(tmp_path)) == k
    assert torch.equal(torch.rand(3), draws[0]) and (np.random.rand(3) == draws[1]).all() and random.random() == draws[2]
    losses += _train(resumed, k, K)

    assert losses == ref_losses  # bit-identical
    _assert_same_state(resumed.gather_state_dict(), full.gather_state_dict())
    _assert_same_optimizer(_opt_state(resumed), _opt_state(full))
    assert resumed.model.embeddings.kernel.optimizer_step == full.model.embeddings.kernel.optimizer_step == K


def _resume_ranks(comm, cfg, plan_dict, root):
    plan = ShardingPlan.from_dict(plan_dict)
    full = Trainer(cfg, comm=comm, plan=plan, progress=False)
    ref_losses = _train(full, 0, K)
    ref = full.gather_state_dict()

    first = Trainer(cfg, comm=comm, plan=plan, progress=False)
    losses = _train(first, 0, k)
    save_checkpoint(first, checkpoint_dir(root, k), k)
    resumed = Trainer(cfg, comm=comm, plan=plan, progress=False)
    start, batch = resume_from_latest(resumed, root)  # what Trainer.run does
    assert start == batch == k
    resumed.train_data = make_data(cfg, "train", comm.rank, comm.world_size, batch)
    losses += _train(resumed, k, K)
    got = resumed.gather_state_dict()
    return ref_losses, losses, (ref, got) if comm.rank == 0 else None


def test_resume_two_ranks_is_exact(tmp_path):
    cfg = _cfg()
    # every kind of local shard a rank can hold: row shard, replica, column shard, whole table
    plan = ShardingPlan.uniform(cfg.model, "table_wise", 2, 2).with_overrides(
        cfg.model, {"t0": "row_wise", "t1": "data_parallel", "t2": "column_wise"}
    )
    out = run_ranks(_resume_ranks, 2, cfg, plan.to_dict(), str(tmp_path))
    for ref_losses, losses, _ in out:  # each rank's local losses
        assert losses == ref_losses
    ref, got = out[0][2]
    _assert_same_state(got, ref)


# ---- (b) N -> M resharding ------------------------------------------------------------------------
def _save_after(comm, cfg, plan_dict, root, steps, max_block_bytes):
    t = Trainer(cfg, comm=comm, plan=ShardingPlan.from_dict(plan_dict), progress=False)
    _train(t, 0, steps)
    save_checkpoint(t, checkpoint_dir(root, steps), steps, max_block_bytes=max_block_bytes)
    state, opt = t.gather_state_dict(), _opt_state(t)
    return (state, opt) if comm.rank == 0 else None


def _load_then_save(comm, cfg, plan_dict, src, root, more):
    """Load ``src``, report the loaded state, train ``more`` steps, save under ``root``."""
    t = Trainer(cfg, comm=comm, plan=ShardingPlan.from_dict(plan_dict), progress=False)
    start = _resume(t, src)
    loaded, opt = t.gather_state_dict(), _opt_state(t)
    saved = None
    if more:
        _train(t, start, start + more)
        save_checkpoint(t, checkpoint_dir(root, start + more), start + more)
        saved = t.gather_state_dict()
    return (start, loaded, opt, saved) if comm.rank == 0 else None


def _all_on_rank0(cfg, W, L):
    """Table-wise with every table on rank 0: the other ranks hold no table at all."""
    tps = tuple(ShardingPlan.table_plan("table_wise", t.name, t.num_rows, t.dim, W, L, slot=0) for t in cfg.model.tables)
    return ShardingPlan(W, L, tps)


def test_reshard_rw4_to_tw2_to_mixed3_to_single(tmp_path):
    cfg = _cfg()
    a, b, c = tmp_path / "rw4", tmp_path / "tw2", tmp_path / "mixed3"

    # 4 ranks row-wise on 2 fake nodes -> 2 ranks table-wise (rank 1 holds no table); the row
    # shards are saved as blocks of 8 rows (256 bytes), whose ends fall inside the new shards
    rw4 = ShardingPlan.uniform(cfg.model, "row_wise", 4, 2)
    saved, saved_opt = run_ranks(_save_after, 4, cfg, rw4.to_dict(), str(a), k, 256, local_world_size=2)[0]
    assert len(json.loads((find_latest(a) / "checkpoint.json").read_text())["tables"]["t2"]["blocks"]) == 4 * 8
    tw2 = _all_on_rank0(cfg, 2, 2)
    start, loaded, opt, saved2 = run_ranks(_load_then_save, 2, cfg, tw2.to_dict(), str(find_latest(a)), str(b), 1)[0]
    assert start == k
    _assert_same_state(loaded, saved)
    _assert_same_optimizer(opt, saved_opt)

    # 2 ranks table-wise -> 3 ranks mixed, with a column-wise table (its momentum copied per column shard)
    mixed3 = ShardingPlan.uniform(cfg.model, "row_wise", 3, 3).with_overrides(
        cfg.model, {"t1": "data_parallel", "t2": "table_row_wise", "t3": "column_wise"}
    )
    start, loaded, _, saved3 = run_ranks(_load_then_save, 3, cfg, mixed3.to_dict(), str(find_latest(b)), str(c), 1)[0]
    assert start == k + 1
    assert loaded["tables"]["t3"]["momentum"].shape == (2, 1)
    _assert_same_state(loaded, saved2)

    # 3 ranks with a column-wise table -> one process: the row momentum is the width-weighted mean
    # of the column shards' accumulators (here two shards of 4 columns: the plain mean)
    single = Trainer(cfg, progress=False)
    assert load_checkpoint(single, find_latest(c)) == k + 2
    got = single.gather_state_dict()
    m = saved3["tables"]["t3"]["momentum"]  # (2, R): the column shards' accumulators
    expected = (0.5 * m[0].double() + 0.5 * m[1].double()).float()
    assert torch.equal(got["tables"]["t3"]["momentum"], expected)
    del saved3["tables"]["t3"]["momentum"], got["tables"]["t3"]["momentum"]
    _assert_same_state(got, saved3)


def test_momentum_rule_when_the_column_split_changes():
    # old: two column shards [0, 4), [4, 8) of a 5-row table, rows cut in blocks [0, 3), [3, 5)
    from neo_train.planning.plan import Shard
    from neo_train.train.checkpoint.reshard import _assemble, _key, _LocalShard

    R, D = 5, 8
    w = torch.arange(R * D, dtype=torch.float32).view(R, D)
    m = {0: torch.rand(R), 4: torch.rand(R)}  # per column shard
    blocks, loaded = [], {}
    for c0, c1 in [(0, 4), (4, 8)]:
        for r0, r1 in [(0, 3), (3, 5)]:
            b = (r0, r1, c0, c1)
            blocks.append(b)
            loaded[_key("t", "weight", b)] = w[r0:r1, c0:c1]
            loaded[_key("t", "momentum", b)] = m[c0][r0:r1]
            loaded[_key("t", "fused_step", b)] = torch.tensor([7 if c0 else 6])

    def new(r0, r1, c0, c1):
        return _assemble(_LocalShard("t", Shard(0, r0, r1, c0, c1), None, 0), blocks, ["momentum"], loaded)

    weight, state, step = new(1, 5, 2, 8)  # overlaps 2 columns of the first shard, 4 of the second
    assert torch.equal(weight, w[1:5, 2:8]) and step == 7
    torch.testing.assert_close(state["momentum"], (2 / 6 * m[0] + 4 / 6 * m[4])[1:5], rtol=1e-6, atol=0)
    assert torch.equal(new(0, 5, 4, 8)[1]["momentum"], m[4])  # same column range: a copy
    assert torch.equal(new(0, 5, 0, 8)[1]["momentum"], (0.5 * m[0].double() + 0.5 * m[4].double()).float())


def test_data_position_follows_samples_when_global_batch_changes(tmp_path):
    t = Trainer(_cfg(), progress=False)
    _train(t, 0, 2)
    d = save_checkpoint(t, checkpoint_dir(tmp_path, 2), 2)
    assert data_start_batch(d, world_size=1, batch_size=8) == 2  # same global batch: the step
    assert data_start_batch(d, world_size=2, batch_size=8) == 1  # 16 samples seen, 16 per batch
    assert data_start_batch(d, world_size=3, batch_size=8) == 1  # the next whole global batch


# ---- (c) damage -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_single(tmp_path_factory):
    cfg = _cfg()
    root = tmp_path_factory.mktemp("ckpt")
    t = Trainer(cfg, progress=False)
    _train(t, 0, 2)
    return cfg, save_checkpoint(t, checkpoint_dir(root, 2), 2)


@pytest.mark.parametrize("name", ["__0_0.distcp", "dcp_metadata.json", "checkpoint.json", "rng/rank-00000.json", "manifest.json"])
@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_file_is_named(saved_single, tmp_path, name, damage):
    cfg, src = saved_single
    d = tmp_path / "copy"
    shutil.copytree(src, d)
    path = d / name
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(data)
    else:
        path.unlink()
    with pytest.raises(CheckpointError, match=f"'{name}'"):
        load_checkpoint(Trainer(cfg, progress=False), d)


def test_intact_copy_verifies(saved_single, tmp_path):
    _, src = saved_single
    shutil.copytree(src, tmp_path / "copy")
    verify_checkpoint(tmp_path / "copy")


# ---- (d) another model ----------------------------------------------------------------------------
def test_other_model_is_refused(saved_single):
    cfg, d = saved_single
    tables = list(cfg.model.tables)
    tables[2] = tables[2].replace(num_rows=300)
    with pytest.raises(CheckpointError, match=r"model\.tables\[2\]\.num_rows: checkpoint 250, this run 300"):
        load_checkpoint(Trainer(cfg.replace(model=cfg.model.replace(tables=tuple(tables))), progress=False), d)
    other = cfg.replace(train=cfg.train.replace(sparse_optimizer="adagrad"))
    with pytest.raises(CheckpointError, match="sparse_optimizer: checkpoint 'rowwise_adagrad', this run 'adagrad'"):
        load_checkpoint(Trainer(other, progress=False), d)
    # training settings may change on resume (more steps, other learning rates: this run's apply)
    longer = Trainer(cfg.replace(train=cfg.train.replace(steps=50, sparse_lr=0.01, dense_lr=0.02)), progress=False)
    assert load_checkpoint(longer, d) == 2
    assert longer.optimizer.param_groups[0]["lr"] == 0.02


# ---- (e) nothing is unpickled -----------------------------------------------------------------------
def test_load_never_unpickles(saved_single, monkeypatch):
    cfg, d = saved_single
    real_load = torch.load
    reads = []

    def forbidden(*args, **kwargs):
        raise AssertionError("checkpoint loading unpickled something")

    def weights_only_load(*args, **kwargs):
        if kwargs.get("weights_only") is not True:
            raise AssertionError("torch.load without weights_only=True")
        reads.append(1)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    monkeypatch.setattr(torch, "load", weights_only_load)
    t = Trainer(cfg, progress=False)
    assert load_checkpoint(t, d) == 2
    assert reads  # the tensors did come through torch.load(weights_only=True)


# ---- the latest pointer -----------------------------------------------------------------------------
def test_latest_pointer_and_crash_leftovers(tmp_path):
    cfg = _cfg()
    t = Trainer(cfg, progress=False)
    assert find_latest(tmp_path) is None and resume_from_latest(t, tmp_path) == (0, 0)
    _train(t, 0, 1)
    first = save_checkpoint(t, checkpoint_dir(tmp_path, 1), 1)
    _train(t, 1, 2)
    second = save_checkpoint(t, checkpoint_dir(tmp_path, 2), 2)
    assert find_latest(tmp_path) == second
    # a save that died half-way leaves only its temporary directory: ignored
    (tmp_path / "step_00000003.tmp-3").mkdir()
    assert find_latest(tmp_path) == second
    # a stale or damaged pointer: the newest complete checkpoint is found by scanning
    (tmp_path / "latest").write_text("{not json")
    assert find_latest(tmp_path) == second
    shutil.rmtree(second)
    assert find_latest(tmp_path) == first
    # saving the same step again replaces it
    again = save_checkpoint(t, checkpoint_dir(tmp_path, 1), 1)
    verify_checkpoint(again)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000001", "step_00000003.tmp-3"]


def test_latest_naming_a_damaged_or_outside_checkpoint_is_an_error(tmp_path):
    cfg = _cfg()
    t = Trainer(cfg, progress=False)
    _train(t, 0, 1)
    first = save_checkpoint(t, checkpoint_dir(tmp_path, 1), 1)
    (first / "manifest.json").unlink()  # latest still names it: no silent restart from step 0
    with pytest.raises(CheckpointError, match="has no manifest.json"):
        find_latest(tmp_path)
    (tmp_path / "latest").write_text(json.dumps({"checkpoint": "../elsewhere", "step": 1}))
    with pytest.raises(CheckpointError, match="not a checkpoint directory inside"):
        find_latest(tmp_path)



def test_a_damaged_newest_checkpoint_names_the_older_complete_one(tmp_path):
    """Resuming from a newest checkpoint whose file is damaged fails (hashes are checked on load;
    sizes already before launch, ``check_resumable``) and says which older checkpoint is complete
    and what to do; doing just that (removing the damaged one) resumes from it. With no older one
    the message says how to start afresh."""
    cfg = _cfg()
    t = Trainer(cfg, progress=False)
    _train(t, 0, 1)
    save_checkpoint(t, checkpoint_dir(tmp_path, 1), 1)
    _train(t, 1, 2)
    second = save_checkpoint(t, checkpoint_dir(tmp_path, 2), 2)
    data = bytearray((second / "__0_0.distcp").read_bytes())
    data[len(data) // 2] ^= 0x01
    (second / "__0_0.distcp").write_bytes(data)
    hint = r"remove .*step_00000002 to resume from the older step_00000001, at step 1"
    with pytest.raises(CheckpointError, match=rf"'__0_0.distcp'.*corrupted.*{hint}"):
        resume_from_latest(Trainer(cfg, progress=False), tmp_path)
    (second / "__0_0.distcp").write_bytes(data[:100])  # truncated: the launcher's size check sees it
    with pytest.raises(CheckpointError, match=rf"'__0_0.distcp'.*truncated.*{hint}"):
        check_resumable(tmp_path, cfg)
    shutil.rmtree(second)  # what the message says ('latest' still names the removed one)
    assert check_resumable(tmp_path, cfg).name == "step_00000001"
    assert resume_from_latest(Trainer(cfg, progress=False), tmp_path)[0] == 1
    first = tmp_path / "step_00000001"
    (first / "__0_0.distcp").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"truncated.*remove .*step_00000001 to start afresh, or use --no-resume"):
        check_resumable(tmp_path, cfg)


def _run_to(tmp_path, steps, **kw):
    cfg = _cfg()
    cfg = cfg.replace(train=cfg.train.replace(steps=steps, checkpoint_dir=str(tmp_path / "ck"), log_every=1, **kw))
    return Trainer(cfg, progress=False).run()


def test_resume_below_the_checkpoint_step_is_refused_and_history_is_exact(tmp_path):
    """--steps below the checkpoint's step trained nothing and moved `latest` back; the losses of
    a resumed run come from the checkpoint itself (one atomic unit), each step exactly once."""
    full = _run_to(tmp_path / "a", 6)
    _run_to(tmp_path, 4)
    with pytest.raises(ValueError, match="at step 4, beyond train.steps = 2"):
        _run_to(tmp_path, 2)
    assert json.loads((tmp_path / "ck" / "latest").read_text())["step"] == 4
    resumed = _run_to(tmp_path, 6)
    assert resumed.losses == full.losses and len(resumed.losses) == 6
    assert not (tmp_path / "ck" / "losses.json").exists()


def test_resume_three_ranks_is_within_float32_rounding(tmp_path):
    """At 3+ ranks the first resumed step's dense all-reduce runs with DDP's initial bucket layout
    (a fresh DDP rebuilds its buckets after its first step), and gloo's ring sums each element in
    an order that depends on the layout: the bound, not bit-identity (2 ranks: a + b commutes)."""
    cfg = _cfg()
    plan = ShardingPlan.uniform(cfg.model, "table_wise", 3, 3).with_overrides(cfg.model, {"t0": "row_wise"})
    out = run_ranks(_resume_ranks, 3, cfg, plan.to_dict(), str(tmp_path))
    for ref_losses, losses, _ in out:
        assert len(losses) == len(ref_losses)
        for a, b in zip(losses, ref_losses):
            assert abs(a - b) <= 1e-6 * abs(b), (a, b)
    ref, got = out[0][2]
    for name, v in ref["dense"].items():
        torch.testing.assert_close(got["dense"][name], v, rtol=1e-5, atol=1e-7)
    for table, entry in ref["tables"].items():
        for key, v in entry.items():
            torch.testing.assert_close(got["tables"][table][key], v, rtol=1e-5, atol=1e-7)
