"""The benchmark scripts run end to end at toy sizes (numbers are not checked, only their shape)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from neo_train.kernels import available_backends

ROOT = Path(__file__).resolve().parents[1]


def test_embedding_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "embedding.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "embedding.py"), "--quick", "--json", str(out)],
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
