"""benchmarks/e2e.py runs end to end in --quick mode (numbers are not checked, only their shape)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = {
    "input_dist",
    "lookup",
    "output_dist",
    "dense_forward",
    "embedding_comm_backward",
    "backward_other",
    "optimizer",
}


def test_e2e_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "e2e.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["machine"]["torch"] and report["machine"]["cpu"]
    assert report["worlds"], report
    for w in report["worlds"]:
        neo = [r for r in w["rows"] if r["framework"] == "neo_train"]
        assert len(neo) == 1 and neo[0]["samples_per_s"] > 0 and neo[0]["world_size"] == w["world_size"]
        assert set(w["breakdown"]) == PHASES
        assert all(v == v for v in w["breakdown"].values())  # no NaN
        trec = [r for r in w["rows"] if r["framework"] == "torchrec"]
        if trec:  # TorchRec ran: a real number and a ratio
            assert trec[0]["samples_per_s"] > 0
            assert w["ratio_neo_over_torchrec"] > 0
            assert len(w["paired_ratios"]) == len(neo[0]["samples_per_s_repeats"]) and all(x > 0 for x in w["paired_ratios"])
            assert "paired" in proc.stdout
        else:  # TorchRec failed: the error is recorded and printed, never a made-up number
            assert isinstance(w.get("torchrec_error"), str) and w["torchrec_error"], w.keys()
            assert "TorchRec" in proc.stdout


def test_e2e_benchmark_reports_torchrec_failure(tmp_path: Path) -> None:
    """A TorchRec that does not import: neo_train's numbers still come out, the error is recorded."""
    fake = tmp_path / "fake" / "torchrec"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("simulated broken torchrec")\n')
    out = tmp_path / "e2e.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "e2e.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    (w,) = report["worlds"]
    assert [r["framework"] for r in w["rows"]] == ["neo_train"]
    assert w["rows"][0]["samples_per_s"] > 0
    assert "simulated broken torchrec" in w["torchrec_error"]
    assert "TorchRec error" in proc.stdout and "simulated broken torchrec" in proc.stdout


def test_e2e_benchmark_emb_heavy_config_and_phases(tmp_path: Path) -> None:
    """--config emb-heavy (26 tables, dim 64, pooling 20-40; rows scaled by 1e-3 under --quick) with
    the per-phase instrumentation of both frameworks."""
    out = tmp_path / "e2e.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "e2e.py"), "--quick", "--config", "emb-heavy", "--phases",
         "--json", str(out)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    tables = report["config"]["model"]["tables"]
    assert len(tables) == 26 and {t["dim"] for t in tables} == {64} and {t["num_rows"] for t in tables} == {1000}
    factors = [t["pooling_factor"] for t in tables]
    assert min(factors) == 20.0 and max(factors) == 40.0
    (w,) = report["worlds"]
    ph = w["phases"]
    assert ph["data_generation_ms"]["synthetic_batch"] > 0
    frameworks = ["neo_train"] + (["torchrec"] if "torchrec_error" not in w else [])
    for fw in frameworks:
        assert not ph[fw]["missing_hooks"], ph[fw]["missing_hooks"]
        for k in ("lookup", "backward_other", "optimizer"):
            assert ph[fw]["wall_ms"][k] > 0 and ph[fw]["cpu_ms"][k] >= 0, (fw, k, ph[fw])
    assert "per-phase ms/step" in proc.stdout
