"""benchmarks/cache.py --quick runs end to end (numbers are not checked, only their shape and range)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cache_benchmark_quick(tmp_path: Path) -> None:
    out, png = tmp_path / "cache.json", tmp_path / "cache.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cache.py"), "--quick", "--json", str(out), "--png", str(png),
         "--storage-dir", str(tmp_path / "ssd")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"machine", "args", "workload", "sweep", "goal", "ssd"} <= set(report) and report["quick"] is True
    assert report["machine"]["torch"] and report["machine"]["cpu_count"] >= 1
    assert "loadavg_1m_at_start" in report["machine"] and "loadavg_1m_at_end" in report["machine"]
    sweep = report["sweep"]
    assert {(r["policy"], r["fraction"]) for r in sweep} == {(p, f) for p in ("lru", "lfu") for f in (0.01, 0.1)}
    assert {r["status"] for r in sweep} == {"ok", "too small"}  # 1 % of 5,000 rows holds less than one batch
    for r in sweep:
        if r["status"] == "too small":
            assert "cache holds" in r["error"]
            continue
        assert 0.0 <= r["hit_rate"] <= r["ceiling"] + 1e-9 <= 1.0 + 1e-9
        assert 0.0 <= r["prefetch_hit_rate"] <= 1.0
        assert r["step_ms"] > 0 and r["resident_ms"] > 0 and r["ratio"] > 0 and r["prefetch_ratio"] > 0
        assert r["store_mb_per_step"] > 0  # a 10 % cache misses, so rows moved
    assert [(g["policy"], g["prefetch"]) for g in report["goal"]["rows"]] == [
        ("lru", False), ("lru", True), ("lfu", False), ("lfu", True)]  # fmt: skip
    assert all(g["ratio"] > 0 and isinstance(g["met"], bool) for g in report["goal"]["rows"])
    ssd = report["ssd"]
    for key in ("read_cold_mbs", "read_cold_other_mbs", "read_warm_mbs", "write_mbs", "write_sync_mbs",
                "fill_mbs"):
        assert ssd["store"][key] > 0, key
    for key in ("write_mbs", "read_cold_mbs", "read_warm_mbs"):
        assert ssd["sequential"][key] > 0, key
    assert {ssd["store"]["store_advice"], ssd["store"]["other_advice"]} in ({"random", "normal"}, {None, "random"})
    assert not any((tmp_path / "ssd").iterdir())  # the store's files and the sequential file are removed
    assert png.stat().st_size > 10_000
