"""The benchmark scripts run end to end at toy sizes (numbers are not checked, only their shape)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from neo_train.kernels import available_backends

ROOT = Path(__file__).resolve().parents[1]


def test_embedding_benchmark_quick(tmp_path: Path) -> None:
    out, png = tmp_path / "embedding.json", tmp_path / "x.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "embedding.py"), "--quick", "--json", str(out), "--png", str(png)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["machine"]["torch"] and report["machine"]["cpu"]
    configs = {r["config"] for r in report["rows"]}
    assert len(configs) == 2
    for config in configs:
        impls = [r["impl"] for r in report["rows"] if r["config"] == config]
        assert any(i.startswith("torch EmbeddingBag") for i in impls), impls
        for backend in available_backends():
            assert any(i.startswith(f"{backend} (") for i in impls), (backend, impls)
    for r in report["rows"]:
        assert r["fwd_ms"] > 0 and r["step_ms"] > 0 and r["step_bytes"] > r["fwd_bytes"] > 0
    assert report["quick"] is True and png.stat().st_size > 10_000


def test_embedding_benchmark_png_from_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/embedding.py's chart from a hand-built report: a backend missing from one config
    and a zero time; then one config, one backend, no baseline (--no-baseline) and no machine info."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_embedding", ROOT / "benchmarks" / "embedding.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # its dataclasses look their module up while it loads
    spec.loader.exec_module(mod)

    def row(config: str, impl: str, fwd_ms: float, step_ms: float) -> dict:
        fwd_b, step_b = 100_000, 350_000
        return {"config": config, "impl": impl, "fwd_ms": fwd_ms, "step_ms": step_ms, "fwd_bytes": fwd_b,
                "step_bytes": step_b, "fwd_gbs": fwd_b / fwd_ms / 1e6 if fwd_ms else 0.0,
                "step_gbs": step_b / step_ms / 1e6 if step_ms else 0.0, "fwd_speedup": None, "step_speedup": None}

    base = "torch EmbeddingBag + Adagrad (sparse, element-wise)"
    full = {"benchmark": "embedding", "quick": False, "args": {"optimizer": "rowwise_adagrad"},
            "machine": {"cpu": "test cpu", "cpu_count": 2, "torch": "2.x", "torch_threads": 2,
                        "loadavg_1m_at_start": 0.5, "copy_gbs": 10.0},
            "configs": [{"name": "dlrm26", "rows": [10] * 26, "dims": [64] * 26, "batch": 2048, "pooling": 20},
                        {"name": "modelA100", "rows": [10] * 4, "dims": [4, 8, 16, 384], "batch": 512, "pooling": 15}],
            "rows": [row("dlrm26", base, 1.0, 4.0), row("dlrm26", "reference (rowwise_adagrad)", 0.8, 0.0),
                     row("dlrm26", "fbgemm (rowwise_adagrad)", 0.5, 2.0), row("modelA100", base, 2.0, 9.0),
                     row("modelA100", "fbgemm (rowwise_adagrad)", 1.5, 5.0)]}  # fmt: skip
    tiny = {"rows": [row("dlrm26-quick", "fbgemm (sgd)", 0.1, 0.3)]}
    for name, report in (("full", full), ("tiny", tiny)):
        png = tmp_path / f"{name}.png"
        mod.write_png(str(png), report)
        assert png.stat().st_size > 10_000, name


def test_gpu_suite_smoke_on_cpu(tmp_path: Path) -> None:
    """benchmarks/gpu_suite.py --device cpu --quick: the whole suite end to end on the CPU (the
    reference backend stands in for triton), labelled a smoke run, JSON and PNG written."""
    out, png = tmp_path / "gpu_suite.json", tmp_path / "gpu_suite.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--device", "cpu", "--quick",
         "--json", str(out), "--png", str(png)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SMOKE RUN" in proc.stdout
    report = json.loads(out.read_text())
    assert report["smoke"] is True and report["device"] == "cpu" and report["all_goals_pass"] is None
    assert {"suite", "machine", "args", "copy_gbs", "tbe", "training", "goals"} <= set(report)
    assert report["copy_gbs"] > 0
    tbe = report["tbe"]
    # the goals are read at uniform ids; the power-law run is reported beside them
    assert [t["alpha"] for t in report["tbe_runs"]] == [0.0, 1.1] and report["tbe_runs"][0] == tbe
    assert all(v < 1e-4 for t in report["tbe_runs"] for v in t["checks"].values())
    assert [r["key"] for r in tbe["rows"]] == ["fused", "per_table", "batched"]
    for r in tbe["rows"]:
        assert r["fwd_ms"] > 0 and r["bwd_ms"] > 0 and r["bwd_bytes"] > 0 and r["fwd_frac"] > 0
    assert all(v < 1e-4 for v in tbe["checks"].values()), tbe["checks"]
    training = report["training"]
    assert [r["key"] for r in training["rows"]] == ["neo_train", "plain"]
    assert all(r["samples_per_s"] > 0 for r in training["rows"]) and training["speedup"] > 0
    assert training["first_loss_abs_diff"] < 1e-4  # the same model on the same first batch
    assert [g["pass"] for g in report["goals"]] == [None, None, None]
    assert png.stat().st_size > 10_000
