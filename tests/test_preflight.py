"""Errors that can be found before launch are reported once, by the launcher: one line, exit
code 2, before any rank starts (no torchrun dump, no per-rank copies)."""
import json
import time

import pytest

from neo_train.cli import main
from neo_train.config import preset
from neo_train.sharding import ShardingPlan


def _cases(tmp):
    model = preset("tiny").model
    four = tmp / "plan4.json"
    four.write_text(ShardingPlan.uniform(model, "table_wise", 4).to_json())
    other = tmp / "other.json"
    other.write_text(ShardingPlan.uniform(preset("small").model, "table_wise", 2).to_json())
    a_file = tmp / "a_file"
    a_file.write_text("x")
    return [
        (["--plan", str(tmp / "missing.json")], "does not exist"),
        (["--plan", str(four)], "world size 4"),
        (["--plan", str(other)], "that the model does not have"),
        (["--backend", "fbgem"], "unknown backend 'fbgem'"),
        (["--local-world-size", "3"], "does not divide --nproc 2"),
        (["--data", "criteo", "--data-path", str(tmp / "none.tsv")], "no such file"),
        (["--checkpoint-dir", str(a_file)], "is a file, not a directory"),
        (["--metrics-out", str(tmp)], "is a directory"),
        (["--trace-dir", str(a_file)], "is a file, not a directory"),
        (["--log-dir", str(a_file / "runs")], "--log-dir"),
        (["--eval-path", str(a_file)], "apply to --data criteo; this run's data is synthetic"),
        (["--data", "criteo", "--data-path", str(a_file)], "Criteo has 26 categorical features but the model's tables give 4"),
        (["--epochs", "2"], "--epochs applies to --data criteo"),
        (["--epochs", "2", "--holdout-every", "5"], "--epochs / --holdout-every apply to --data criteo"),
    ]


@pytest.mark.parametrize("index", range(14))
def test_launch_errors_are_one_line_before_any_rank_starts(index, tmp_path, capsys):
    extra, expected = _cases(tmp_path)[index]
    start = time.time()
    rc = main(["train", "--nproc", "2", "--preset", "tiny", "--steps", "2", "--log-dir", "none", *extra])
    out, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neo-train: error:") and expected in lines[0], err
    assert "starting" not in out  # torchrun was never called
    assert time.time() - start < 10


def test_an_auto_plan_that_cannot_fit_is_one_line_before_launch(tmp_path, capsys):
    """model_a's 40 MLP layers of 3375 do not fit a cpu_local rank: said once by the launcher
    (it used to be rank 0's multi-line error and a collective failure on rank 1)."""
    rc = main(["train", "--nproc", "2", "--preset", "model_a", "--row-scale", "1e-6", "--steps", "2", "--log-dir", "none"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "--sharding auto: the dense replica" in lines[0], err
    assert "starting" not in out


def test_intra_op_threads_share_the_free_cpus(monkeypatch):
    import os

    from neo_train.cli import intra_op_threads

    monkeypatch.delenv("NEO_TRAIN_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert intra_op_threads(1)[0] == 8 and intra_op_threads(2)[0] == 4 and intra_op_threads(16)[0] == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (6.2, 0.0, 0.0))  # others keep 6 CPUs busy
    assert intra_op_threads(1)[0] == 2 and intra_op_threads(2)[0] == 1
    monkeypatch.setenv("NEO_TRAIN_THREADS", "3")
    assert intra_op_threads(2) == (3, "NEO_TRAIN_THREADS")


def test_a_dead_rank_is_one_line_per_rank(tmp_path):
    """When a rank dies the launcher prints one summary line naming the ranks and exit codes, a
    survivor at most one line naming the collective and its rank; no traceback without --verbose."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NEO_TRAIN_FAIL_AT": "2:1"}
    r = subprocess.run([sys.executable, "-m", "neo_train", "train", "--preset", "tiny", "--steps", "6", "--timeout", "5",
                        "--log-dir", "none", "--no-progress", "--batch-size", "16", "--sharding", "table_wise"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    assert err[-1].startswith("neo-train: error: the job failed") and "rank 1: exit code 17" in err[-1], r.stderr
    # the survivor reports its CollectiveError in one line when it gets there before torchrun
    # stops it (torchrun terminates the other ranks as soon as one exits: a race)
    for line in err[:-1]:
        assert line.startswith("neo-train: error:") and "on rank 0" in line and "a peer may have died" in line, r.stderr
    assert len(err) <= 2, r.stderr


def test_replay_of_a_missing_trace_is_one_line(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nosuchdir")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such trace file" in err[0], err


def test_an_unavailable_backend_is_one_line_before_launch(monkeypatch, capsys):
    """A registered backend that cannot run on this host (triton without CUDA or the interpreter)
    is said once by the launcher, with why; it used to fail on every rank after launch."""
    from neo_train.kernels import registry

    monkeypatch.setitem(registry._BACKENDS, "nowhere", registry._Backend(lambda *a, **k: None, lambda: False, lambda: "needs a moon base"))
    rc = main(["train", "--nproc", "2", "--preset", "tiny", "--steps", "2", "--log-dir", "none", "--backend", "nowhere"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "'nowhere' is not available here: needs a moon base" in lines[0] and "reference" in lines[0], err
    assert "starting" not in out


def test_cached_tables_leave_out_data_parallel_ones():
    """A cache load factor below 1 caches every table but the data-parallel ones (replicas are
    never cached); the launcher names those in a note, and the run's summary reports a hit rate
    only when some table is cached (it printed cache_hit_rate=nan when none was)."""
    import dataclasses

    from neo_train.cli import _data_parallel_uncached
    from neo_train.modules.storage import cached_tables

    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, storage=dataclasses.replace(cfg.storage, cache_load_factor=0.5))
    names = [t.name for t in cfg.model.tables]
    assert cached_tables(cfg.model, cfg.storage) == names  # unsharded: every table
    dp = ShardingPlan.uniform(cfg.model, "data_parallel", 2)
    assert cached_tables(cfg.model, cfg.storage, dp) == [] and _data_parallel_uncached(cfg, dp) == names
    tw = ShardingPlan.uniform(cfg.model, "table_wise", 2)
    assert cached_tables(cfg.model, cfg.storage, tw) == names and _data_parallel_uncached(cfg, tw) == []
    resident = dataclasses.replace(cfg, storage=dataclasses.replace(cfg.storage, cache_load_factor=1.0))
    assert cached_tables(resident.model, resident.storage, tw) == [] and _data_parallel_uncached(resident, dp) == []


def test_a_backend_that_cannot_store_the_table_dtype_is_one_line_before_launch(capsys):
    from neo_train.kernels import available_backends

    if "fbgemm" not in available_backends():
        pytest.skip("fbgemm does not import here")
    rc = main(["train", "--nproc", "2", "--preset", "tiny", "--steps", "2", "--log-dir", "none", "--backend", "fbgemm",
               "--table-dtype", "bf16"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "--table-dtype bf16: kernel backend 'fbgemm' stores float32, float16 tables only" in lines[0], err
    assert "that store it: reference" in lines[0] and "starting" not in out


def test_a_cuda_device_on_a_host_without_one_is_one_line_before_launch(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA device")
    for nproc in ("1", "2"):
        rc = main(["train", "--nproc", nproc, "--preset", "tiny", "--steps", "2", "--log-dir", "none", "--device", "cuda"])
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and "--device cuda: no CUDA device here" in lines[0], err
        assert "starting" not in out


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_cache_too_small_for_the_first_batch_is_one_line_before_launch(nproc, tmp_path, capsys):
    """A cached table whose cache cannot hold the unique rows of the job's first global batch is
    refused by the launcher (it used to be every rank's error at step 0), naming the table, the
    shard and the smallest load factor that fits; exactly that factor passes the check, 10 %
    less does not."""
    import dataclasses
    import re

    from neo_train import cli

    argv = ["train", "--nproc", str(nproc), "--preset", "small", "--steps", "2", "--log-dir", "none"]
    rc = main([*argv, "--cache-load-factor", "0.001"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    shard = "(rank 0's shard, rows [0, 50000)) " if nproc == 2 else ""
    assert f"cached embedding: table 't0' {shard}needs " in lines[0] and "in the first global batch" in lines[0], err
    assert "but its cache holds 50 rows; a cache_load_factor of at least" in lines[0], err
    assert "starting" not in out
    suggested = float(re.search(r"at least ([0-9.e-]+) \(", lines[0]).group(1))
    cfg = preset("small")
    plan = ShardingPlan.uniform(cfg.model, "table_wise", nproc) if nproc > 1 else None

    def t0_cached(factor: float):  # only t0 cached, the other tables resident
        tables = tuple(t.replace(cache_load_factor=factor) if t.name == "t0" else t for t in cfg.model.tables)
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, tables=tables))

    cli._check_caches_fit(t0_cached(suggested), plan, nproc)  # fits
    with pytest.raises(ValueError, match=r"table 't0'.*needs \d+ unique rows in the first global batch"):
        cli._check_caches_fit(t0_cached(suggested * 0.9), plan, nproc)
