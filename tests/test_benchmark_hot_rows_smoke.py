"""benchmarks/hot_rows.py --quick runs end to end: the JSON's structure, replication's losses equal
to no replication's, the codecs' smaller pooled exchange, and a PNG (numbers are not judged)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
A2A = ("input_dist", "output_dist", "output_dist_bwd")


def test_hot_rows_benchmark_quick(tmp_path: Path) -> None:
    out, png = tmp_path / "hot_rows.json", tmp_path / "hot_rows.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "hot_rows.py"), "--quick", "--rows", "4000", "--batch-size", "32",
         "--codecs", "fp16,int8", "--json", str(out), "--png", str(png)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## goal" in proc.stdout and ("PASS" in proc.stdout or "FAIL" in proc.stdout)
    report = json.loads(out.read_text())
    assert report["quick"] is True and report["benchmark"] == "hot_rows"
    assert {"machine", "args", "model", "variants", "goal", "measured", "runs", "simulated"} <= set(report)
    assert report["machine"]["cpu_count"] >= 1 and "loadavg_1m_at_end" in report["machine"]

    rows = {r["variant"]: r for r in report["measured"]}
    assert set(rows) == {"off", "auto", "K=64", "fp16", "int8", "off@RW"}
    assert rows["off@RW"]["control"] == "row_wise" and not rows["off@RW"]["k"]
    assert all(r["world_size"] == 2 and r["zipf"] == 1.05 for r in rows.values())
    off = rows["off"]
    for r in rows.values():
        assert set(A2A) <= set(r["bytes_per_step"]), r["bytes_per_step"]
        assert r["a2a_bytes"] == sum(r["bytes_per_step"][t] for t in A2A) > 0
        assert r["step_ms"] > 0 and r["samples_per_s"] > 0 and len(r["step_s"]) == report["args"]["steps"]
        assert len(r["losses"]) == report["args"]["warmup"] + report["args"]["steps"]
        assert r["phases_ms"] and r["final_loss"] == r["losses"][-1]
    assert off["a2a_ratio"] == 1.0

    # auto replicates what the cost model priced on the job's cluster (cpu_local): at these toy sizes
    # nothing saves the collectives' latency, so auto runs as off, switching nothing
    auto = rows["auto"]
    assert {t: c["k"] for t, c in auto["cost_model"].items()} == auto["k"]
    if not auto["k"]:
        assert auto["switches"] == 0 and auto["bytes_per_step"] == off["bytes_per_step"] and auto["loss_matches_off"]
    # replication: exact (W = 2: a sum of two is order-free), fewer ids in the input dist, a replica all-reduce
    for name in [n for n in ("auto", "K=64") if rows[n]["k"]]:
        r = rows[name]
        assert r["loss_matches_off"] and r["loss_max_rel_diff_vs_off"] <= 1e-5, (name, r["loss_max_rel_diff_vs_off"])
        assert r["switches"] >= 1 and r["k"], name
        assert r["bytes_per_step"]["input_dist"] < off["bytes_per_step"]["input_dist"], name
        for tag in ("output_dist", "output_dist_bwd"):  # bags with no cold id skip the pooled exchange
            assert r["bytes_per_step"][tag] <= off["bytes_per_step"][tag], (name, tag)
            if name == "K=64":  # every table replicated: one-hot bags whose id is hot skip it
                assert r["bytes_per_step"][tag] < off["bytes_per_step"][tag], (name, tag)
        assert sum(v for t, v in r["bytes_per_step"].items() if t.startswith("dp_grad_")) > 0, name  # dense or sparse sync
    assert set(rows["K=64"]["k"].values()) == {64} and len(rows["K=64"]["k"]) == len(report["model"]["tables"])
    assert 0 < rows["K=64"]["hot_share_one_hot"] <= 1 and 0 < rows["K=64"]["all_hot_bags_one_hot"] <= 1

    # codecs: same ids, narrower pooled exchange both ways
    for name in ("fp16", "int8"):
        assert rows[name]["codec"] == name and not rows[name]["k"]
        r = rows[name]
        assert r["bytes_per_step"]["input_dist"] == off["bytes_per_step"]["input_dist"]
        for tag in ("output_dist", "output_dist_bwd"):
            assert r["bytes_per_step"][tag] < 0.6 * off["bytes_per_step"][tag], (name, tag)
    assert rows["fp16"]["bytes_per_step"]["output_dist"] == 0.5 * off["bytes_per_step"]["output_dist"]

    [verdict] = report["goal"]["verdicts"]
    assert verdict["world_size"] == 2 and isinstance(verdict["met"], bool)
    assert verdict["met"] == (verdict["bytes_met"] and verdict["time_met"])

    sim = report["simulated"]
    srows = sim["rows_by_network"]
    assert {r["network"] for r in srows} == {"fattree", "opera"}
    for net in ("fattree", "opera"):
        by = {r["variant"]: r for r in srows if r["network"] == net}
        assert set(by) == {"off", "auto@1.05", "fp16", "int8"}
        assert by["off"]["a2a_ratio"] == 1.0 and by["off"]["comm_ms"] > 0 and by["off"]["iteration_ms"] > 0
        auto = by["auto@1.05"]
        assert auto["hot_rows_k"] and 0 < auto["coverage"][0] < 1 and auto["replica_allreduce_gb"] > 0
        assert auto["phases"]["input_a2a"]["gb"] < by["off"]["phases"]["input_a2a"]["gb"]
        assert auto["phases"]["fwd_a2a"]["gb"] == by["off"]["phases"]["fwd_a2a"]["gb"]
        assert by["fp16"]["phases"]["fwd_a2a"]["gb"] == 0.5 * by["off"]["phases"]["fwd_a2a"]["gb"]
    assert png.stat().st_size > 10_000
