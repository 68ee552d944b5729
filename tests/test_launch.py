"""The multi-rank command line end to end: `neo-train train --nproc N` (torchrun underneath)."""
import json
import os
import subprocess
import sys

import pytest

from neo_train.config import preset
from neo_train.sharding import ShardingPlan

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _train(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "neo_train", "train", "--preset", "tiny", "--steps", "4", "--backend", "reference",
           "--log-dir", "none", "--no-progress", "--metrics-out", str(out), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ENV)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text()), p.stdout


def test_runs_of_different_plans_give_the_same_global_losses(tmp_path):
    tw, out = _train(tmp_path, "tw", "--nproc", "2", "--sharding", "table_wise")
    assert tw["world_size"] == 2 and len(tw["losses"]) == 4 and "eval_auc=" in out
    plan = ShardingPlan.uniform(preset("tiny").model, "row_wise", 2).with_overrides(preset("tiny").model, {"t0": "data_parallel"})
    plan.to_json(str(tmp_path / "plan.json"))
    mixed, out = _train(tmp_path, "mixed", "--nproc", "2", "--plan", str(tmp_path / "plan.json"))
    assert "data_parallel" in out and "row_wise" in out
    for a, b in zip(tw["losses"], mixed["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


def test_four_ranks_table_row_wise_on_two_faked_nodes(tmp_path):
    m, out = _train(tmp_path, "twrw", "--nproc", "4", "--sharding", "table_row_wise", "--local-world-size", "2")
    assert m["world_size"] == 4 and "2 nodes x 2" in out and "step time (ms)" in out



def test_the_launch_says_which_tables_replicate_hot_rows_and_which_cannot_be_cached(tmp_path):
    """Replication and caching chosen for the run are printed once: k per replicated table (t1
    is mean-pooled: not eligible), a K no table can take as a note; a cache load factor that
    data-parallel tables cannot honour as a note, with no hit rate of nothing in the summary, and
    a storage directory with nothing cached to back as a note."""
    _, out = _train(tmp_path, "hot", "--nproc", "2", "--sharding", "table_wise", "--hot-rows", "8")
    assert "hot-row replication (8): t0 k=8, t2 k=8; re-profiled every 100 steps" in out
    _, out = _train(tmp_path, "none", "--nproc", "2", "--sharding", "table_wise", "--hot-rows", "100000")
    assert "--hot-rows 100000 replicates no table here" in out
    _, out = _train(tmp_path, "dp", "--nproc", "2", "--sharding", "data_parallel", "--cache-load-factor", "0.5",
                    "--storage-dir", str(tmp_path / "ssd"))
    assert "4 table(s) with a cache load factor below 1 are data-parallel and so not cached" in out
    assert "--storage-dir has no effect: no table is cached" in out
    assert "cache_hit_rate" not in out

def test_a_plan_for_another_world_size_is_refused(tmp_path):
    ShardingPlan.uniform(preset("tiny").model, "row_wise", 4).to_json(str(tmp_path / "p4.json"))
    cmd = [sys.executable, "-m", "neo_train", "train", "--preset", "tiny", "--steps", "2", "--nproc", "2",
           "--log-dir", "none", "--plan", str(tmp_path / "p4.json")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ENV)
    assert p.returncode != 0
    assert "plan is for world size 4, but the job has 2 ranks" in p.stdout + p.stderr


def test_the_launch_script_finds_the_python_that_has_neo_train(tmp_path):
    """launch/single_node.sh from a shell without the venv on PATH: it uses $PYTHON, else the
    active venv, else the repository's .venv; a Python without neo_train is one line, rc 2."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "launch" / "single_node.sh"
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NPROC": "2"}
    venv = Path(sys.executable).parent.parent  # the venv running the tests, as an activated one
    out = tmp_path / "m.json"
    p = subprocess.run(["bash", str(script), "--preset", "tiny", "--steps", "2", "--batch-size", "8", "--backend",
                        "reference", "--log-dir", "none", "--no-progress", "--metrics-out", str(out)],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path, env={**bare, "VIRTUAL_ENV": str(venv)})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "intra-op thread(s) per rank" in p.stdout and len(json.loads(out.read_text())["losses"]) == 2
    nothing = tmp_path / "nothing"
    nothing.write_text("#!/bin/sh\nexit 1\n")
    nothing.chmod(0o755)
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**bare, "PYTHON": str(nothing)})
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"single_node.sh: error: {nothing} cannot import neo_train; run ./install.sh or set PYTHON=/path/to/python"]
