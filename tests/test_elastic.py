"""Elastic restart end to end: a rank is killed mid-run; torchrun restarts the job, which resumes
from the newest checkpoint and finishes with the same per-step losses as an uninterrupted run —
no sample lost, none counted twice."""
import json
import os
import subprocess
import sys

import pytest


def _train(tmp_path, name, *extra, env_extra=None):
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "neo_train", "train", "--preset", "tiny", "--steps", "8", "--nproc", "2",
           "--backend", "reference", "--log-dir", "none", "--no-progress", "--metrics-out", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    return p, (json.loads(out.read_text()) if out.exists() else None)


def test_killed_rank_restarts_from_the_checkpoint_with_identical_losses(tmp_path):
    p, plain = _train(tmp_path, "plain")
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = tmp_path / "ckpt"
    p, elastic = _train(tmp_path, "elastic", "--max-restarts", "1", "--checkpoint-every", "3",
                        "--checkpoint-dir", str(ckpt), env_extra={"NEO_TRAIN_FAIL_AT": "5:1"})
    text = p.stdout + p.stderr
    assert p.returncode == 0, text[-4000:]
    assert "rank 1 dies at step 5" in text  # the fault really happened ...
    assert "resumed from step 3" in text  # ... and the job restarted from the step-3 checkpoint
    assert len(elastic["losses"]) == 8
    for a, b in zip(plain["losses"], elastic["losses"]):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7)
    assert elastic["eval"]["auc"] == pytest.approx(plain["eval"]["auc"], rel=1e-6)


def test_without_restarts_the_failure_is_reported(tmp_path):
    p, _ = _train(tmp_path, "fail", "--checkpoint-every", "3", "--checkpoint-dir", str(tmp_path / "c"),
                  env_extra={"NEO_TRAIN_FAIL_AT": "4:0"})
    assert p.returncode != 0
    assert "rank 0 dies at step 4" in p.stdout + p.stderr
