"""Training with cached tables (a bounded cache over host memory or the SSD tier) gives the same
per-step losses, evaluations and final tables as training with every row resident: on 1 rank
and on 3 ranks under TW, RW and CW, with the pipeline prefetching batch i+1's rows during
batch i's backward, for every sparse optimizer."""
import dataclasses
import json

import pytest
import torch

from neo_train.cli import main
from neo_train.config import TableConfig, preset
from neo_train.sharding import ShardingPlan
from neo_train.testing import run_ranks
from neo_train.train import Trainer


def _cfg(factor: float = 1.0, optimizer: str = "rowwise_adagrad", policy: str = "lru", storage_dir: str = "",
         pipeline: bool = True, steps: int = 8, **train):
    base = preset("tiny")
    tables = (  # awkward sizes; power-law ids; every batch fits a 0.03 cache on 1 rank, 0.2 on 3
        TableConfig("big", 3001, 8, pooling_factor=2.0),
        TableConfig("mid", 2003, 8, pooling="mean", pooling_factor=1.0, feature_names=("m0", "m1")),
        TableConfig("hot", 2400, 8, pooling_factor=3.0),
    )
    kw = {"steps": steps, "batch_size": 16, "kernel_backend": "reference", "sparse_optimizer": optimizer,
          "log_every": 2, "eval_every": 4, "eval_batches": 2, "pipeline": pipeline, **train}
    return base.replace(
        model=base.model.replace(tables=tables),
        train=base.train.replace(**kw),
        storage=base.storage.replace(cache_load_factor=factor, cache_policy=policy, storage_dir=storage_dir),
    )


def _result(t: Trainer, r):
    return r.losses, r.eval_history, t.gather_state_dict()["tables"], r.cache


def _single(**kw):
    t = Trainer(_cfg(**kw), progress=False)
    return _result(t, t.run())


def _assert_same(resident, cached) -> None:
    assert resident[0] == cached[0] and len(resident[0]) == 8  # identical per-step losses
    assert resident[1] == cached[1]  # and evaluations (mid-run ones with a prefetch in flight)
    for name, e in resident[2].items():
        for k, v in e.items():
            assert torch.equal(v, cached[2][name][k]), f"{name}.{k}"
    assert not resident[3]  # nothing cached there


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_one_rank_cached_equals_resident(optimizer):
    resident = _single(optimizer=optimizer)
    cached = _single(optimizer=optimizer, factor=0.03)
    _assert_same(resident, cached)
    c = cached[3]
    assert c["rows_evicted_per_step"] > 0 and 0 < c["hit_rate"] < 1, c  # the cache really worked
    assert c["tier"] == "host"


@pytest.mark.parametrize("pipeline", [False, True])
def test_ssd_tier_and_lfu_equal_resident(tmp_path, pipeline):
    resident = _single(optimizer="adam", pipeline=pipeline)
    cached = _single(optimizer="adam", pipeline=pipeline, factor=0.03, policy="lfu", storage_dir=str(tmp_path))
    _assert_same(resident, cached)
    assert cached[3]["tier"] == "ssd" and cached[3]["bytes_written_per_step"] > 0
    assert any(p.is_file() for p in tmp_path.rglob("*"))  # the tables live in files there
    assert (cached[3]["rows_prefetched_per_step"] > 0) == pipeline  # the plain loop fetches at lookup


def _ranks(comm, factor, optimizer, overrides, storage_dir):
    cfg = _cfg(factor=factor, optimizer=optimizer, storage_dir=storage_dir and f"{storage_dir}")
    plan = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size).with_overrides(cfg.model, overrides)
    t = Trainer(cfg, comm=comm, plan=plan, progress=False)
    return _result(t, t.run())


@pytest.mark.parametrize("optimizer,overrides,ssd", [
    ("rowwise_adagrad", {"big": "row_wise", "mid": "column_wise"}, False),  # RW + CW + TW
    ("adam", {"big": "column_wise", "hot": "row_wise"}, True),  # ... on the SSD tier
    ("sgd", {"mid": "row_wise", "big": "column_wise"}, False),
    pytest.param("adagrad", {"hot": "column_wise", "big": "row_wise"}, False, marks=pytest.mark.slow),
])
def test_three_ranks_cached_equals_resident(tmp_path, optimizer, overrides, ssd):
    resident = run_ranks(_ranks, 3, 1.0, optimizer, overrides, "")
    cached = run_ranks(_ranks, 3, 0.2, optimizer, overrides, str(tmp_path) if ssd else "")
    _assert_same(resident[0], cached[0])
    assert cached[0][3]["rows_evicted_per_step"] > 0
    assert cached[0][3] == cached[1][3] == cached[2][3]  # summed over ranks: every rank reports the same


def test_a_cache_smaller_than_a_batch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"big.*cache_load_factor"):
        Trainer(_cfg(factor=0.005), progress=False).run()


def test_cli_cache_flags_report_the_hit_rate(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = main(["train", "--preset", "tiny", "--nproc", "1", "--steps", "6", "--log-dir", "none", "--backend", "reference",
               "--cache-load-factor", "0.9", "--cache-policy", "lfu", "--storage-dir", str(tmp_path / "ssd"),
               "--metrics-out", str(out), "--no-progress"])
    assert rc == 0
    m = json.loads(out.read_text())
    assert m["cache"]["tier"] == "ssd" and 0 <= m["cache"]["hit_rate"] <= 1 and m["cache_history"]
    assert "cache_hit_rate=" in capsys.readouterr().out


@pytest.mark.parametrize("flags,message", [
    (["--cache-load-factor", "0"], "storage.cache_load_factor: must be in (0, 1]"),
    (["--cache-load-factor", "1.5"], "storage.cache_load_factor: must be in (0, 1]"),
    (["--stochastic-rounding"], "storage.stochastic_rounding"),
    (["--table-dtype", "fp8"], "--table-dtype"),
    (["--cache-policy", "fifo"], "--cache-policy"),
])
def test_bad_storage_flags_are_one_line(flags, message, capsys):
    try:
        rc = main(["train", "--preset", "tiny", "--nproc", "1", "--steps", "2", "--log-dir", "none", *flags])
    except SystemExit as e:  # argparse's own usage errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("dtype,torch_dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_table_dtype_reaches_the_kernel(dtype, torch_dtype):
    cfg = _cfg(steps=4)
    cfg = cfg.replace(storage=cfg.storage.replace(table_dtype=dtype))
    t = Trainer(cfg, progress=False)
    assert t.model.embeddings.kernel.weight_dtype == torch_dtype
    low = t.run().losses
    full = Trainer(_cfg(steps=4), progress=False).run().losses
    assert all(abs(a - b) < 0.05 for a, b in zip(low, full)) and low != full  # rounded, not ignored


def test_a_backend_without_the_table_dtype_refuses_it():
    from neo_train.kernels import available_backends

    if "fbgemm" not in available_backends():
        pytest.skip("fbgemm does not import here")
    cfg = _cfg(kernel_backend="fbgemm")
    cfg = cfg.replace(storage=cfg.storage.replace(table_dtype="bf16"))
    with pytest.raises(ValueError, match=r"backend 'fbgemm' does not support weight dtype torch.bfloat16"):
        Trainer(cfg, progress=False)


def _ck_ranks(comm, factor, steps, root, overrides):
    cfg = _cfg(factor=factor, steps=steps, checkpoint_dir=root, checkpoint_every=4, eval_every=0)
    plan = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size).with_overrides(cfg.model, overrides)
    t = Trainer(cfg, comm=comm, plan=plan, progress=False)
    r = t.run()
    return r.losses, t.gather_state_dict()["tables"]


def test_checkpoints_of_cached_tables_resume_exactly_and_reshard(tmp_path):
    """A checkpoint flushes the dirty rows: resuming a cached 2-rank run is exact, and its
    checkpoint loads into 3 resident ranks and into 1 cached process with the same tables."""
    rw = {"big": "row_wise", "hot": "row_wise"}
    whole = run_ranks(_ck_ranks, 2, 0.2, 8, str(tmp_path / "whole"), rw)[0]
    root = str(tmp_path / "ck")
    first = run_ranks(_ck_ranks, 2, 0.2, 4, root, rw)[0]
    resumed = run_ranks(_ck_ranks, 2, 0.2, 8, root, rw)[0]
    assert resumed[0] == whole[0] and len(whole[0]) == 8 and first[0] == whole[0][:4]
    for name, e in whole[1].items():
        for k, v in e.items():
            assert torch.equal(v, resumed[1][name][k]), f"{name}.{k}"
    # the step-8 checkpoint under 3 resident ranks (N -> M) and under 1 cached process
    three = run_ranks(_ck_ranks, 3, 1.0, 8, root, {"mid": "column_wise"})[0]
    one = Trainer(_cfg(factor=0.03, steps=8, checkpoint_dir=root, eval_every=0), progress=False)
    one.run()
    for got in (three[1], one.gather_state_dict()["tables"]):
        for name, e in whole[1].items():
            assert torch.equal(e["weight"], got[name]["weight"]), name


def test_a_killed_rank_restarts_with_cached_tables_on_the_ssd_tier(tmp_path):
    """The elastic kill-a-rank test with every table cached on the SSD tier: the restarted job
    resumes from the checkpoint (which flushed the dirty rows) and matches the resident run."""
    import os
    import subprocess
    import sys

    cfg_path = tmp_path / "cached.toml"
    _cfg(steps=8, eval_every=0).dump(cfg_path)

    def train(name, *extra, fail=None):
        out = tmp_path / f"{name}.json"
        cmd = [sys.executable, "-m", "neo_train", "train", "--config", str(cfg_path), "--nproc", "2",
               "--sharding", "row_wise", "--log-dir", "none", "--no-progress", "--metrics-out", str(out), *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1", **({"NEO_TRAIN_FAIL_AT": fail} if fail else {})}
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        return p, (json.loads(out.read_text()) if out.exists() else None)

    p, plain = train("plain")
    assert p.returncode == 0, p.stderr[-3000:]
    p, elastic = train("elastic", "--cache-load-factor", "0.1", "--storage-dir", str(tmp_path / "ssd"),
                       "--max-restarts", "1", "--checkpoint-every", "3", "--checkpoint-dir", str(tmp_path / "ck"),
                       fail="5:1")
    text = p.stdout + p.stderr
    assert p.returncode == 0, text[-4000:]
    assert "rank 1 dies at step 5" in text and "resumed from step 3" in text
    assert elastic["cache"]["tier"] == "ssd" and elastic["cache"]["rows_evicted_per_step"] > 0
    assert elastic["losses"] == plain["losses"]  # 2 ranks: resume is bit-exact


def _plan_cached_ranks(comm, factors):
    cfg = _cfg(eval_every=0)
    plan = ShardingPlan.uniform(cfg.model, "row_wise", comm.world_size)
    plan = ShardingPlan(plan.world_size, plan.local_world_size, tuple(
        dataclasses.replace(tp, cache_load_factor=factors.get(tp.table)) for tp in plan.tables))
    plan = ShardingPlan.from_json(plan.to_json())  # as a plan file carries them
    t = Trainer(cfg, comm=comm, plan=plan, progress=False)
    return _result(t, t.run())


def test_a_plans_cache_load_factors_cache_those_tables():
    """The planner's per-table factors reach the kernels through the plan (JSON round trip)."""
    factors = {"big": 0.05, "hot": 0.1}
    resident = run_ranks(_plan_cached_ranks, 2, {})[0]
    cached = run_ranks(_plan_cached_ranks, 2, factors)[0]
    _assert_same(resident, cached)
    assert cached[3]["rows_evicted_per_step"] > 0


def test_a_checkpoint_keeps_its_table_dtype_and_ignores_where_rows_lived(tmp_path):
    root = str(tmp_path / "ck")
    cfg = _cfg(steps=3, checkpoint_dir=root, eval_every=0)
    fp16 = cfg.replace(storage=cfg.storage.replace(table_dtype="fp16"))
    Trainer(fp16, progress=False).run()
    more = fp16.replace(train=fp16.train.replace(steps=5))
    tables = tuple(t.replace(cache_load_factor=0.05) if t.name == "big" else t for t in more.model.tables)
    r = Trainer(more.replace(model=more.model.replace(tables=tables)), progress=False).run()  # cached now: resumes
    assert len(r.losses) == 5 and r.cache
    from neo_train.train.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="table_dtype: checkpoint 'fp16', this run 'fp32'"):
        Trainer(cfg.replace(train=cfg.train.replace(steps=6)), progress=False).run()


def test_stochastic_rounding_reaches_the_triton_kernel():
    from neo_train.config import StorageConfig
    from neo_train.kernels import available_backends
    from neo_train.kernels import SparseOptimizerSpec, TableSpec
    from neo_train.modules.storage import create_table_kernel

    if "triton" not in available_backends():
        pytest.skip("triton does not run here")
    storage = StorageConfig(table_dtype="bf16", stochastic_rounding=True)
    k = create_table_kernel("triton", [TableSpec(50, 8)], SparseOptimizerSpec("sgd", lr=0.1), factors=[1.0],
                            storage=storage, store_name="x", feature_table_map=[0], feature_names=["f"], device="cpu")
    assert k.stochastic_rounding and k.weight_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="kernel backend 'reference' rounds fp16/bf16 updates to nearest only"):
        create_table_kernel("reference", [TableSpec(50, 8)], SparseOptimizerSpec("sgd"), factors=[1.0], storage=storage,
                            store_name="x", feature_table_map=[0], feature_names=["f"], device="cpu")
