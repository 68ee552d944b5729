"""Simulating a recorded run (issue 14, item 1): the ranks' recorded timelines, per-rank chains joined
at collectives, the calibration's fit and file, and the command line's errors. Mechanics only:
no assertion here depends on how fast this machine runs."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neo_train.topology.calibrate import (
    AFTER_FACTOR, FORMAT, Calibration, CalibrationError, KindFit, _async_seconds, _call_seconds, _launch, _return_spread,
    _unit_time, fabric_comm, fit_calibration, nnls,
)
from neo_train.topology import calibrate
from neo_train.topology.simulator import simulate
from neo_train.topology.trace_input import load_trace, rank_timelines, timeline_phases
from neo_train.topology.trace_sim import calibrated_collectives, calibrated_return_lags, validate_timeline

ROOT = Path(__file__).resolve().parents[1]
MS = 1_000_000  # ns


def _cal(world: int = 2, fabric: str = "shared", bandwidth: float = 1e9) -> Calibration:
    kinds = {"all_to_allv": KindFit({2: 1e-3}, 1 / bandwidth), "all_reduce": KindFit({2: 2e-3}, 1 / bandwidth),
             "all_gather": KindFit({2: 1e-3}, 1 / bandwidth), "reduce_scatter": KindFit({2: 1e-3}, 1 / bandwidth)}
    return Calibration("gloo", "cpu", world, fabric, bandwidth, kinds)


# ---- a hand-made two-rank trace: the chains and their joins, to the nanosecond --------------------

def _entry(comms, pg, order, compute, call, *, step=None, lead=None, size=0, async_op=False, wait=None,
           duration=None):
    e = {"comms": comms, "pg_id": pg, "global_ranks": [0, 1], "world_size": 2, "dtype": "float",
         "in_msg_size": size, "out_msg_size": size, "in_split": [size // 2] * 2 if comms == "all_to_allv" else [],
         "out_split": [size // 2] * 2 if comms == "all_to_allv" else [], "markers": [f"{comms}{pg}"],
         "order": order, "compute_ns": compute, "call_ns": call, "async": async_op, "step": step,
         "startTime_ns": 0, "duration_ns": duration if duration is not None else call, "backend": "gloo"}
    if lead is not None:
        e["step_start_ns"] = lead
    if wait is not None:
        by, order_w, compute_w, ns = wait
        e.update(joined_by=by, wait_order=order_w, wait_compute_ns=compute_w, wait_ns=ns, wait_step=step)
    return e


def _hand_trace(path: Path) -> Path:
    """Rank 0 / rank 1: a blocking all-to-all; step 0 begins; an async all-to-all waited for;
    an async all-reduce of 1 MB (250,000 floats) joined at a backward's end; the loop ends; a
    blocking all-to-all. Rank 1 computes longer before the step's first all-to-all and before
    the all-reduce, so rank 0 waits for it."""
    S = 250_000
    r0 = [_entry("all_to_allv", 0, 0, None, 1 * MS),
          _entry("all_to_allv", 0, 1, 1 * MS, MS // 10, step=0, lead=MS // 2, async_op=True,
                 wait=("wait", 2, 2 * MS, MS), duration=31 * MS // 10),
          _entry("all_reduce", 1, 3, 1 * MS, 0, step=0, size=S, async_op=True, wait=("backward", 4, MS // 2, 45 * MS // 10),
                 duration=5 * MS),
          _entry("all_to_allv", 0, 5, 1 * MS, 1 * MS, step=None, lead=0)]
    r1 = [_entry("all_to_allv", 0, 0, None, 1 * MS),
          _entry("all_to_allv", 0, 1, 3 * MS, MS // 10, step=0, lead=1 * MS, async_op=True,
                 wait=("wait", 2, MS // 2, MS // 2)),
          _entry("all_reduce", 1, 3, 2 * MS, 0, step=0, size=S, async_op=True, wait=("backward", 4, MS // 2, 35 * MS // 10)),
          _entry("all_to_allv", 0, 5, 1 * MS, 1 * MS, step=None, lead=0)]
    path.mkdir(parents=True, exist_ok=True)
    for r, es in enumerate((r0, r1)):
        (path / f"trace_rank{r}.json").write_text(json.dumps(es))
    return path


def _simulated_at(traces):
    """(timeline, result, at): at(rank, order) gives the simulated (start, end) of a rank's block, ms."""
    tl, res = _simulated(traces)
    end = {p.name: p.end * 1e3 for p in res.phases}

    def at(rank, order):
        a, b = tl.nodes[(rank, order)]
        return end[a], end[b]
    return tl, res, at


def test_per_rank_chains_join_at_collectives(tmp_path):
    tl, res, at = _simulated_at(load_trace(_hand_trace(tmp_path / "tr")))
    end = {p.name: p.end * 1e3 for p in res.phases}  # ms

    # the first all-to-all: both arrive at 0, alpha 1 ms
    assert at(0, 0) == pytest.approx((0.0, 1.0)) and at(1, 0) == pytest.approx((0.0, 1.0))
    # async launch: rank 0 issues at 2 ms, rank 1 at 4 ms; the launch (0.1 ms) is the rank's work
    assert at(0, 1) == pytest.approx((2.0, 2.1)) and at(1, 1) == pytest.approx((4.0, 4.1))
    # it starts once the last launch returned (4.1 ms: nothing is sent before) and ends alpha
    # later; both waits end there
    assert at(0, 2) == pytest.approx((4.1, 5.1)) and at(1, 2) == pytest.approx((4.6, 5.1))
    # the all-reduce: last launch 7.1 ms, alpha 2 ms, 2 (g-1) S = 2 MB at 1 GB/s = 2 ms -> 11.1 ms
    assert at(0, 3) == pytest.approx((6.1, 6.1)) and at(1, 3) == pytest.approx((7.1, 7.1))
    assert at(0, 4) == pytest.approx((6.6, 11.1)) and at(1, 4) == pytest.approx((7.6, 11.1))
    assert at(0, 5) == pytest.approx((12.1, 13.1)) and at(1, 5) == pytest.approx((12.1, 13.1))
    # step 0 began 0.5 ms (rank 0) / 1 ms (rank 1) before the async call; the loop's end closes it
    bounds = {r: [(s, end[n]) for s, n, _ in b] for r, b in tl.boundaries.items()}
    assert bounds[0] == [(0, pytest.approx(1.5)), (None, pytest.approx(12.1))]
    assert bounds[1] == [(0, pytest.approx(3.0)), (None, pytest.approx(12.1))]

    val = validate_timeline(tl, res, warmup_steps=0)
    (step,) = val.steps
    # measured: rank 0's recorded blocks equal the simulated ones (10.6 ms); rank 1 blocked
    # 0.5 ms in its wait (simulated 0.5) and 3.5 ms at the backward's end (simulated 3.5): 9.1 ms
    assert step["measured_s"] * 1e3 == pytest.approx((10.6 + 9.1) / 2)
    assert step["predicted_s"] * 1e3 == pytest.approx((10.6 + 9.1) / 2)
    rows = {(r["comms"], r["mode"]): r for r in val.collectives}
    a2a = rows[("all_to_allv", "async")]
    assert a2a["n"] == 2 and a2a["predicted_s"] * 1e3 == pytest.approx((3.1 + 1.1) / 2)  # wait end - call start
    ar = rows[("all_reduce", "async")]
    assert ar["predicted_s"] * 1e3 == pytest.approx((5.0 + 4.0) / 2)  # joined by the backward: its completion
    assert ar["predicted_net_s"] * 1e3 == pytest.approx(4.0)  # last launch returned (7.1 ms) to its end (11.1 ms)


def test_an_asynchronous_collective_starts_where_it_was_issued(tmp_path):
    """With ``issue_ns`` recorded, an asynchronous collective starts once every rank handed it to
    the transport, not when the last launch returned: rank 1's launches take 1 ms (the host kept
    it from returning), its all-to-all issued 0.1 ms in and its all-reduce at once."""
    path = _hand_trace(tmp_path / "tr")
    for r, changes in ((0, {1: (MS // 10, MS // 20), 2: (0, 0)}), (1, {1: (MS, MS // 10), 2: (MS, 0)})):
        f = path / f"trace_rank{r}.json"
        es = json.loads(f.read_text())
        for i, (call, issue) in changes.items():
            es[i].update(call_ns=call, issue_ns=issue)
        f.write_text(json.dumps(es))
    tl, res, at = _simulated_at(load_trace(path))

    # rank 1 launches the all-to-all from 4 to 5 ms and issued it at 4.1: it ends alpha later, 5.1
    # (from the launch's end it would be 6.0); rank 1 reaches its wait after that and goes on
    assert at(1, 1) == pytest.approx((4.0, 5.0))
    assert at(0, 2) == pytest.approx((4.1, 5.1)) and at(1, 2) == pytest.approx((5.5, 5.5))
    # the all-reduce: rank 1 issues it at 7.5 ms (its launch ends at 8.5), + alpha 2 + 2 ms = 11.5
    assert at(0, 3) == pytest.approx((6.1, 6.1)) and at(1, 3) == pytest.approx((7.5, 8.5))
    assert at(0, 4) == pytest.approx((6.6, 11.5)) and at(1, 4) == pytest.approx((9.0, 11.5))
    val = validate_timeline(tl, res, warmup_steps=0)
    ar = {(r["comms"], r["mode"]): r for r in val.collectives}[("all_reduce", "async")]
    assert ar["predicted_net_s"] * 1e3 == pytest.approx(4.0)  # from the last issue (7.5 ms) to its end
    # the blocking share of an idle-mixed latency is charged less the launch up to the issue
    kinds = {k: KindFit(dict(f.latency_s), f.seconds_per_byte) for k, f in _cal().kinds.items()}
    cal = dataclasses.replace(_cal(), async_kinds={"all_reduce": KindFit({2: 0.5e-3}, 1e-9)}, kinds=kinds)
    by_rank = {r: dict(e, _idle=1.0) for r, e in tl.colls[next(k for k, v in tl.colls.items()
                                                                 if v[0]["comms"] == "all_reduce")].items()}
    (lat, _), _ = calibrated_collectives(cal)("all_reduce", [0, 1], by_rank, "ar", ())
    assert lat.seconds == pytest.approx(2e-3 - 0.0)  # issue_ns 0 on both ranks: nothing taken off
    by_rank = {r: dict(e, issue_ns=MS // 2 if r else 0) for r, e in by_rank.items()}
    (lat, _), _ = calibrated_collectives(cal)("all_reduce", [0, 1], by_rank, "ar", ())
    assert lat.seconds == pytest.approx(2e-3 - 0.25e-3)  # the mean issue, 0.25 ms (not the 0.5 ms launches)


@pytest.mark.parametrize("change, message", [
    ({"issue_ns": 2 * MS}, "field 'issue_ns' (2000000) exceeds the launch's call_ns (100000)"),
    ({"async": False, "issue_ns": 0}, "field 'issue_ns' (0) on a blocking call"),
])
def test_a_malformed_issue_is_named(tmp_path, change, message):
    path = _hand_trace(tmp_path / "tr")
    f = path / "trace_rank1.json"
    es = json.loads(f.read_text())
    es[1].update(change)
    if change.get("async") is False:
        for k in ("joined_by", "wait_order", "wait_compute_ns", "wait_ns", "wait_step"):
            es[1].pop(k)
    f.write_text(json.dumps(es))
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        rank_timelines(load_trace(path))
    assert "rank 1 entry 1" in str(err.value)


def test_a_cuda_trace_has_no_net_time(tmp_path):
    """The net time compares the ranks' host clocks (``startTime_ns``) plus durations: a CUDA
    trace's durations are the device's, so it is left out, not mixed."""
    path = _hand_trace(tmp_path / "tr")
    host = validate_timeline(*_simulated(load_trace(path)), warmup_steps=0)
    for f in path.glob("trace_rank*.json"):
        f.write_text(json.dumps([dict(e, clock="cuda") for e in json.loads(f.read_text())]))
    cuda = validate_timeline(*_simulated(load_trace(path)), warmup_steps=0)
    net = {(r["comms"], r["mode"]): r["measured_net_s"] for r in host.collectives}
    assert net[("all_reduce", "async")] is not None
    assert all(r["measured_net_s"] is None for r in cuda.collectives)
    assert [r["measured_s"] for r in cuda.collectives] == [r["measured_s"] for r in host.collectives]


def _simulated(traces):
    tl = timeline_phases(traces, calibrated_collectives(_cal()))
    return tl, simulate(tl.phases, _cal().network())


def test_a_late_rank_delays_a_blocking_collective(tmp_path):
    """Blocking calls: the early rank's blocked time is the other's lateness plus alpha."""
    es = {r: [_entry("all_to_allv", 0, 0, None, MS), _entry("all_to_allv", 0, 1, (1 + 2 * r) * MS, MS, step=0, lead=0)]
          for r in (0, 1)}
    for r, e in es.items():
        (tmp_path / f"trace_rank{r}.json").write_text(json.dumps(e))
    tl = timeline_phases(load_trace(tmp_path), calibrated_collectives(_cal()))
    res = simulate(tl.phases, _cal().network())
    end = {p.name: p.end for p in res.phases}
    blocked = [end[tl.nodes[(r, 1)][1]] - end[tl.nodes[(r, 1)][0]] for r in (0, 1)]
    assert blocked == pytest.approx([3e-3, 1e-3])


# ---- the recorder, in a real training run --------------------------------------------------------

def _run_body(comm, out_dir, pipeline):
    from neo_train.comm.trace import TracingCommunicator
    from neo_train.config import preset
    from neo_train.sharding import ShardingPlan
    from neo_train.train import Trainer

    cfg = preset("tiny")
    cfg = cfg.replace(train=cfg.train.replace(kernel_backend="reference", steps=4, pipeline=pipeline, eval_batches=1))
    tc = TracingCommunicator(comm)
    t = Trainer(cfg, comm=tc, plan=ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size), progress=False,
                log_dir=None)
    t.run()
    return str(tc.dump(out_dir))


@pytest.fixture(scope="module")
def run_trace(tmp_path_factory):
    from neo_train.testing import run_ranks

    out = tmp_path_factory.mktemp("run")
    run_ranks(_run_body, 2, str(out), True)
    return out


def test_the_recorded_timeline_is_complete(run_trace):
    """Every blocking interval recorded once (orders 0..N-1 over calls and waits), the fields
    present and consistent, each step marked once, DDP's buckets joined at the backward's end."""
    for r in (0, 1):
        entries = json.loads((run_trace / f"trace_rank{r}.json").read_text())
        orders = [e["order"] for e in entries] + sorted({e["wait_order"] for e in entries if "wait_order" in e})
        assert sorted(orders) == list(range(len(orders)))
        for e in entries:
            assert e["backend"] == "gloo" and isinstance(e["async"], bool) and e["call_ns"] >= 0
            assert e["compute_ns"] is not None or e["order"] == 0
            if not e["async"]:
                assert e["duration_ns"] == e["call_ns"] and "wait_order" not in e
        dense = [e for e in entries if e["markers"] == ["dense_allreduce"]]
        assert dense and all(e["async"] and e["joined_by"] == "backward" and e["wait_ns"] >= 0 for e in dense)
        waited = [e for e in entries if e.get("joined_by") == "wait"]
        assert waited and all(e["wait_order"] > e["order"] for e in waited)
        # the loop's 4 steps: each begins once, before its first blocking interval; the loop's end too
        marks = [(e["step"], e["step_start_ns"]) for e in entries if e.get("step_start_ns") is not None]
        marks += [(e["wait_step"], e["wait_step_start_ns"]) for e in entries if e.get("wait_step_start_ns") is not None]
        assert sorted(s for s, _ in marks if s is not None) == [0, 1, 2, 3]
        assert sum(s is None for s, _ in marks) == 1
    blocks, colls = rank_timelines(load_trace(run_trace))
    for r, bs in blocks.items():
        assert [b.order for b in bs] == list(range(len(bs)))
        steps = [b.step for b in bs if b.step_lead is not None]
        assert steps == [0, 1, 2, 3, None]
        assert all(b.step_lead <= b.compute + 1e-9 for b in bs if b.step_lead is not None)
    assert all(set(by_rank) == {0, 1} for by_rank in colls.values())


def test_the_recorded_timeline_accounts_for_the_wall_clock(run_trace):
    """Nothing is left out between the blocking intervals: a rank's recorded compute and blocked
    times, summed from its first interval, put each collective's call where the wall clock
    (startTime_ns) does, to the end of the run: a replay that keeps them loses no time."""
    blocks, colls = rank_timelines(load_trace(run_trace))
    for r, bs in blocks.items():
        t, start = 0, {}
        for b in bs:
            start[b.order] = t + b.compute
            t += b.compute + b.blocked
        calls = sorted((e["startTime_ns"], start[e["order"]] * 1e9) for by_rank in colls.values()
                       for rr, e in by_rank.items() if rr == r)
        offset = [wall - rebuilt for wall, rebuilt in calls]
        q = max(1, len(offset) // 4)
        drift = np.median(offset[-q:]) - np.median(offset[:q])
        assert abs(drift) < 0.5 * MS, (r, drift)


def test_a_recorded_run_simulates_with_a_calibration(run_trace, tmp_path, capsys):
    from neo_train.topology.study import add_simulate_arguments, simulate_command

    cal = tmp_path / "cal.json"
    _cal().save(cal)
    p = argparse.ArgumentParser()
    add_simulate_arguments(p)
    args = p.parse_args(["--trace", str(run_trace), "--calibration", str(cal), "--warmup-steps", "1",
                         "--out", str(tmp_path / "out")])
    assert simulate_command(args) == 0
    out = capsys.readouterr().out
    assert "each rank's recorded compute" in out and "predicted vs measured, 3 steady steps" in out
    assert re.search(r"simulated [1-6] time\(s\), each with the asynchronous collectives' idle shares of the one "
                     r"before", out), out
    assert re.search(r"computing \d+% of the time \(a calibration for this trace: neo-train calibrate --nproc 2 --busy-ms "
                     r"\d+\.\d\d --overlap-ms (\w+=\d+\.\d\d,?)+ --out FILE", out), out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["network"] == "calibrated" and summary["measured_step_s"] > 0 and summary["predicted_step_s"] > 0
    # without a calibration: the same chains on a topology
    args = p.parse_args(["--trace", str(run_trace), "--network", "fattree"])
    assert simulate_command(args) == 0
    assert "each rank's recorded compute" in capsys.readouterr().out


# ---- calibration: the fit, the file, the measurement ---------------------------------------------

@pytest.mark.parametrize("fabric", ["shared", "per_rank"])
def test_the_fit_recovers_known_latency_and_bandwidth(fabric):
    C = 2e9
    alpha = {"all_to_allv": {2: 1e-4, 3: 3e-4, 4: 5e-4}, "all_reduce": {2: 2e-4, 3: 6e-4, 4: 9e-4},
             "all_gather": {2: 1e-4, 3: 2e-4, 4: 4e-4}, "reduce_scatter": {2: 3e-4, 3: 4e-4, 4: 7e-4}}
    factor = {"all_to_allv": 1.0, "all_reduce": 1.7, "all_gather": 0.6, "reduce_scatter": 2.5}
    samples = [{"kind": k, "group": g, "bytes": b, "seconds": alpha[k][g] + factor[k] * _unit_time(k, g, b, fabric) / C}
               for k in alpha for g in (2, 3, 4) for b in (16, 4096, 1 << 17, 1 << 20, 1 << 22)]
    cal = fit_calibration(samples, world_size=4, transport="gloo", device="cpu")
    assert cal.fabric == fabric
    assert cal.bandwidth == pytest.approx(C, rel=1e-6)
    for k in alpha:
        assert cal.kinds[k].byte_factor == pytest.approx(factor[k], rel=1e-6)
        for g in (2, 3, 4):
            assert cal.latency(k, g) == pytest.approx(alpha[k][g], rel=1e-6, abs=1e-12)
        assert cal.kinds[k].max_rel_err < 1e-9
    s = samples[7]
    assert cal.predict(s["kind"], s["group"], s["bytes"]) == pytest.approx(s["seconds"], rel=1e-6)
    assert cal.async_kinds == {}
    # a busy calibration's asynchronous samples: fitted apart, on the same fabric and C
    launched = [dict(s, seconds=2 * alpha[s["kind"]][s["group"]] + 3 * (s["seconds"] - alpha[s["kind"]][s["group"]]),
                     **{"async": True}) for s in samples]
    cal = fit_calibration(samples + launched, world_size=4, transport="gloo", device="cpu")
    assert cal.fabric == fabric and cal.bandwidth == pytest.approx(C, rel=1e-6)
    for k in alpha:
        assert cal.kinds[k].byte_factor == pytest.approx(factor[k], rel=1e-6)
        assert cal.async_kinds[k].byte_factor == pytest.approx(3 * factor[k], rel=1e-6)
        assert cal.latency(k, 3, async_op=True) == pytest.approx(2 * alpha[k][3], rel=1e-6)
    assert cal.predict(s["kind"], s["group"], s["bytes"], async_op=True) == pytest.approx(launched[7]["seconds"],
                                                                                          rel=1e-6)


def test_an_all_reduce_of_fewer_than_two_elements_per_rank_is_fitted_apart(tmp_path):
    """gloo's ring all-reduce cuts its buffer into two segments per rank and skips the empty ones'
    sends, so a calibration's smallest cell (one element per rank at g = 3, 4) is faster than the
    latency of every larger one (the AMD VM: 2.05 against 3.8 - 4.0 ms at g = 4). Fitted together,
    it pulled the latency of the others down (DDP's 36 KB bucket with it). Here those cells take half
    the others' latency: the fit of the rest recovers the others' exactly (it would not with them in),
    they keep their own latency, which a collective that small takes (``predict``, the trace's
    factory), a group of two (whose 16-byte cell has four elements) has none, and the file keeps it."""
    from neo_train.topology.calibrate import FEW_ELEMENTS_PER_RANK, few_elements

    assert FEW_ELEMENTS_PER_RANK == 2
    assert few_elements("all_reduce", 4, 7) and not few_elements("all_reduce", 4, 8)
    assert not few_elements("all_reduce", 4, 0) and not few_elements("all_gather", 4, 4)
    C, fabric = 2e9, "per_rank"
    alpha = {"all_to_allv": {2: 1e-3, 3: 1.5e-3, 4: 2e-3}, "all_reduce": {2: 2e-3, 3: 3e-3, 4: 4e-3}}
    sizes = (16, 256, 4096, 1 << 17, 1 << 20)

    def cell(k, g, b, async_op=False):
        t = alpha[k][g] * (0.5 if few_elements(k, g, calibrate._cell_elements(g, b)) else 1.0)
        t = (2 if async_op else 1) * t + _unit_time(k, g, b, fabric) / C
        return {"kind": k, "group": g, "bytes": b, "seconds": t, "async": async_op}

    samples = [cell(k, g, b, a) for k in alpha for g in (2, 3, 4) for b in sizes for a in (False, True)]
    cal = fit_calibration(samples, world_size=4, transport="gloo", device="cpu")
    for fit, x in ((cal.kinds["all_reduce"], 1), (cal.async_kinds["all_reduce"], 2)):
        for g in (2, 3, 4):
            assert fit.latency_s[g] == pytest.approx(x * alpha["all_reduce"][g], rel=1e-6)
        assert fit.few_latency_s == pytest.approx({3: x * 1.5e-3, 4: x * 2e-3}, rel=1e-6)
        assert fit.max_rel_err < 1e-9 and fit.samples == 13  # the two few-element cells are not the fit's
    assert cal.kinds["all_to_allv"].few_latency_s == {}
    assert cal.latency("all_reduce", 4, few=True) == pytest.approx(2e-3)
    assert cal.latency("all_reduce", 2, few=True) == pytest.approx(2e-3)  # no few-element latency at g = 2
    assert cal.latency("all_reduce", 3, async_op=True, few=True) == pytest.approx(3e-3)
    s = next(x for x in samples if x["kind"] == "all_reduce" and x["group"] == 4 and x["bytes"] == 16)
    assert cal.predict("all_reduce", 4, 16) == pytest.approx(s["seconds"], rel=1e-6)
    assert cal.predict("all_reduce", 4, 16, elements=9009) > 1.9 * s["seconds"]
    # a trace's all-reduce of three elements among three ranks takes it; one of 9,009 does not
    for n, want in ((3, 1.5e-3), (9009, 3e-3)):
        by_rank = {r: {"comms": "all_reduce", "in_msg_size": n, "dtype": "float", "async": False} for r in range(3)}
        (lat, _), _ = calibrated_collectives(cal)("all_reduce", [0, 1, 2], by_rank, "ar", ())
        assert lat.seconds == pytest.approx(want, rel=1e-6)
    # the file keeps it; the table says it
    back = Calibration.load(cal.save(tmp_path / "c.json"))
    assert back.kinds["all_reduce"].few_latency_s == pytest.approx(cal.kinds["all_reduce"].few_latency_s)
    assert "under 2 elements per rank g=3: 1500 us, g=4: 2000 us" in back.table()
    # fitted together (the rule before): the larger cells' latency comes out low
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibrate, "few_elements", lambda *a: False)
        low = fit_calibration(samples, world_size=4, transport="gloo", device="cpu")
    assert low.kinds["all_reduce"].latency_s[4] < 0.95 * alpha["all_reduce"][4]
    assert low.kinds["all_reduce"].few_latency_s == {}


def test_the_fit_charges_a_noisy_cell_its_mean_not_less():
    """Cells whose times scatter (means of a few iterations with a long tail) are fitted to their
    mean: a size-independent latency comes out as the cells' average (and grows with a cell's
    tail), where the earlier weighting by the measured time gave a value near the fastest cells'
    (1 and 3 ms -> 1.2 ms), which under-predicted every collective of a run."""
    from neo_train.topology.calibrate import _fit_kind

    rows = [{"group": 2, "seconds": t} for t in (1e-3, 3e-3, 1e-3, 3e-3)]
    fit = _fit_kind(rows, [0.0] * 4)
    assert fit.latency_s[2] == pytest.approx(2e-3, rel=1e-6) and fit.seconds_per_byte == 0.0
    # latency + bytes with multiplicative noise of mean 1: recovered in the mean
    rng = np.random.default_rng(3)
    xs = [b / 1e9 for b in (16, 4096, 1 << 17, 1 << 20, 1 << 21)] * 40
    noise = rng.choice([0.5, 1.5], size=len(xs))
    rows = [{"group": 3, "seconds": (4e-4 + 2.0 * x) * e} for x, e in zip(xs, noise)]
    fit = _fit_kind(rows, xs)
    assert fit.latency_s[3] == pytest.approx(4e-4, rel=0.1) and fit.seconds_per_byte == pytest.approx(2.0, rel=0.1)


def test_a_cell_measured_at_zero_does_not_steer_the_fit():
    """An asynchronous cell whose waits all returned at once (the collective done within the
    overlap) has D = 0. Started relative to the measured times, that cell outweighed the rest,
    pinned alpha to 0 and the bandwidth to what fits the other cells from there, and the
    reweighting stayed in that corner: a busy W = 4 calibration's asynchronous all-to-all (these
    first returns, ms) came out 437 x slower per byte than its blocking twin."""
    from neo_train.topology.calibrate import _fit_kind, _unit_time

    sizes = (16, 256, 4096, 32768, 131072, 524288, 2097152)
    first_ms = {2: (0.694, 0.781, 0.557, 0.669, 0.730, 0.723, 2.457), 3: (0.772, 1.386, 1.085, 0.815, 1.155, 0.974, 1.101),
                4: (0.0, 0.541, 0.454, 0.431, 0.665, 0.376, 0.682)}
    rows, xs = [], []
    for g, ts in first_ms.items():
        for b, t in zip(sizes, ts):
            b = b // 4 // g * g * 4
            rows.append({"group": g, "bytes": b, "seconds": t * 1e-3 + 3e-4, "first_s": t * 1e-3, "spread_s": 3e-4})
            xs.append(_unit_time("all_to_allv", g, b, "per_rank") / 2.1e9)
    fit = _fit_kind(rows, xs)
    assert fit.latency_s[4] > 2e-4 and fit.seconds_per_byte < 3.0  # within a few x of the blocking twin's 1
    pred = [fit.latency_s[r["group"]] + fit.seconds_per_byte * x for r, x in zip(rows, xs)]
    assert max(p / r["first_s"] for p, r in zip(pred, rows) if r["first_s"] > 0) < 2.0
    assert fit.rms_rel_err < 0.5


def test_nnls_keeps_coefficients_non_negative():
    rng = np.random.default_rng(0)
    A = rng.random((30, 4))
    x = nnls(A, A @ np.array([1.0, 0.0, 2.0, 0.5]))
    assert x == pytest.approx([1.0, 0.0, 2.0, 0.5], abs=1e-9)
    x = nnls(A, A @ np.array([1.0, -3.0, 2.0, 0.5]))  # the best fit wants a negative: clamped at 0
    assert (x >= 0).all() and x[1] == 0


def test_fabric_bytes():
    M = np.array([[5.0, 2.0], [3.0, 7.0]])
    (t,) = fabric_comm("all_to_allv", [0, 1], M, "shared", name="a").rounds
    assert t.total_bytes == 5.0  # off-diagonal only: a rank's own block crosses nothing
    (t,) = fabric_comm("all_reduce", [0, 1, 2], 10.0, "shared", name="b", byte_factor=2).rounds
    assert t.total_bytes == 2 * 2 * 2 * 10.0
    ring = fabric_comm("all_reduce", [0, 1, 2], 30.0, "per_rank", name="c")
    assert len(ring.rounds) == 4 and sum(r.total_bytes for r in ring.rounds) == pytest.approx(2 * 2 / 3 * 30.0 * 3)
    assert fabric_comm("all_gather", [3], [8.0], "shared", name="d").rounds == ()


def test_the_calibration_file_round_trips_and_bad_files_are_named(tmp_path):
    cal = _cal(3)
    cal.kinds["all_to_allv"] = KindFit({2: 1e-4, 3: 2e-4}, 1e-9)
    p = cal.save(tmp_path / "c.json")
    back = Calibration.load(p)
    assert back.to_dict() == cal.to_dict() and back.source == str(p)
    with pytest.raises(CalibrationError, match=r"c.json is for 3 ranks but trace x has 4 \(calibrate with --nproc 4\)"):
        back.check_for(4, ["gloo"], "trace x")
    with pytest.raises(CalibrationError, match=r"measured transport 'gloo' but trace x ran on 'nccl'"):
        back.check_for(3, ["nccl"], "trace x")
    back.check_for(3, [], "trace x")  # a trace that does not say its transport
    with pytest.raises(CalibrationError, match=r"all_reduce was calibrated for groups of 2 ranks, not 3"):
        back.latency("all_reduce", 3)
    assert back.latency("all_reduce", 1) == 0.0

    def bad(data, match):
        f = tmp_path / "bad.json"
        f.write_text(data if isinstance(data, str) else json.dumps(data))
        with pytest.raises(CalibrationError, match=match):
            Calibration.load(f)

    good = cal.to_dict()
    bad("{nope", r"bad.json: not valid JSON")
    bad([1, 2], r"bad.json: expected a JSON object, got list")
    bad({**good, "format": "something/2"}, r"field 'format' is 'something/2'")
    bad({**good, "world_size": 1}, r"field 'world_size' must be an integer >= 2, got 1")
    bad({**good, "bandwidth_Bps": -1}, r"field 'bandwidth_Bps' must be a finite number > 0, got -1")
    bad({**good, "fabric": "mesh"}, r"field 'fabric' is 'mesh'")
    bad({**good, "kinds": {"all_to_some": {}}}, r"field 'kinds' names 'all_to_some'")
    broken = json.loads(json.dumps(good))
    broken["kinds"]["all_reduce"]["latency_s"]["2"] = "fast"
    bad(broken, r"field 'kinds.all_reduce.latency_s.2' must be a finite number >= 0, got 'fast'")
    with pytest.raises(CalibrationError, match=r"missing.json: no such file"):
        Calibration.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="no collective's time grows with its size"):
        fit_calibration([{"kind": "all_to_allv", "group": 2, "bytes": b, "seconds": 1e-4} for b in (16, 1024)],
                        world_size=2, transport="gloo", device="cpu")


def _measure_body(comm, busy_s, overlap_s=None):
    from neo_train.topology.calibrate import measure_collectives

    return measure_collectives(comm, sizes=[16, 4096], iters=2, warmup=1, busy_s=busy_s, overlap_s=overlap_s)


@pytest.mark.parametrize("busy_s", [0.0, 1e-4])
def test_measure_collectives_on_gloo_ranks(busy_s):
    from neo_train.testing import run_ranks

    a, b, c = run_ranks(_measure_body, 3, busy_s)
    assert a == b == c  # every rank returns the same samples
    sync = [s for s in a if not s.get("async") and not s.get("pass")]
    cells = {(s["kind"], s["group"], s["bytes"] // 4 // s["group"] * s["group"] > 0) for s in sync}
    assert len(sync) == 4 * 2 * 2 and len(cells) == 4 * 2
    # a busy calibration also launches every cell asynchronously, the ranks computing meanwhile, in
    # a second pass (cells up to CONCURRENT_MAX_BYTES: both here) alone and with a twin in flight,
    # and in a third calls the smallest and largest of those blocking, with busy_s and AFTER_FACTOR
    # x busy_s of compute after the call
    first = [s for s in a if s.get("async") and not s.get("pass")]
    second = [s for s in a if s.get("pass") == "concurrent"]
    third = [s for s in a if s.get("pass") == "after"]
    assert len(first) == (4 * 2 * 2 if busy_s else 0) and len(a) == len(sync) + len(first) + len(second) + len(third)
    assert sorted(s["concurrent"] for s in second) == ([False] * 16 + [True] * 16 if busy_s else [])
    assert sorted(s["after_s"] for s in third) == ([busy_s] * 16 + [AFTER_FACTOR * busy_s] * 16 if busy_s else [])
    assert not any(s.get("async") for s in third)
    assert all(s["seconds"] > 0 and s["iters"] == 2 and s["busy_s"] == busy_s and s["overlap_s"] == busy_s / 2 for s in a)
    assert all(s["p25"] <= s["p50"] <= s["p75"] for s in sync)
    # the first pass's asynchronous cells keep, per pooled iteration, the compute drawn over them
    # (within the draw's range, [0, 2 x overlap_s)) and their completion after the last launch,
    # where the handle has the backend's future (gloo's reduce-scatter is an all-to-all and a sum)
    assert {s["kind"] for s in first if "iters_done_s" not in s} <= {"reduce_scatter"}
    for s in (s for s in first if s["kind"] != "reduce_scatter"):
        ov, done = s["iters_overlap_s"], s["iters_done_s"]
        pooled = 2 * (3 // s["group"] if s["group"] < 3 else 1)  # iterations x the groups side by side
        assert len(ov) == len(done) == pooled and all(0 <= v < 2 * busy_s / 2 + 1e-6 for v in ov), s
        assert all(d > 0 for d in done) and np.mean(done) <= s["seconds"] + max(ov) + 0.05, s
    assert not any("iters_done_s" in s for s in a if s not in first)


def test_measure_collectives_overlaps_each_kind_as_given():
    """``overlap_s`` per kind (``trace_duties``): each kind's asynchronous cells compute that long
    on average while in flight; kinds left out take the mean of those given."""
    from neo_train.testing import run_ranks
    from neo_train.topology.calibrate import parse_overlaps

    given = parse_overlaps("all_reduce=0.3,all_to_allv=0.1")
    assert given == pytest.approx({"all_reduce": 3e-4, "all_to_allv": 1e-4})
    a, b = run_ranks(_measure_body, 2, 1e-4, given)
    assert a == b
    want = {"all_reduce": 3e-4, "all_to_allv": 1e-4, "all_gather": 2e-4, "reduce_scatter": 2e-4}
    assert {s["kind"]: s["overlap_s"] for s in a} == pytest.approx(want)
    assert parse_overlaps("2") == pytest.approx(2e-3)
    for bad, msg in (("all_reduce=x", "cannot read 'all_reduce=x'"), ("bcast=1", "unknown collective kind 'bcast'"),
                     ("all_reduce=-1", "must be a number of milliseconds >= 0")):
        with pytest.raises(ValueError, match=msg):
            parse_overlaps(bad)


def _logged_measure_body(comm, tiled=None, concurrent=False, sizes=(16,)):
    """A busy all-to-all calibration on this rank, logging in order its barriers, its all-to-all
    calls (group size, async, the group's ranks, the group object's id) and its compute bursts
    (seconds); returns the log and the samples. Without the second pass unless
    asked (``concurrent``)."""
    from neo_train.comm.native import NativeCommunicator
    from neo_train.topology import calibrate

    log: list[tuple] = []
    busy, barrier, a2a = calibrate._busy, NativeCommunicator.barrier, NativeCommunicator.all_to_all_v

    def logged_busy(work, seconds):
        log.append(("busy", seconds))
        busy(work, seconds)

    def logged_barrier(self):
        log.append(("barrier",))
        barrier(self)

    def logged_a2a(self, *args, async_op=False, **kw):
        log.append(("all_to_allv", self.world_size, async_op, tuple(self.global_ranks), id(self)))
        return a2a(self, *args, async_op=async_op, **kw)

    calibrate._busy = logged_busy
    NativeCommunicator.barrier, NativeCommunicator.all_to_all_v = logged_barrier, logged_a2a
    samples = calibrate.measure_collectives(comm, sizes=list(sizes), kinds=("all_to_allv",), iters=2, warmup=1,
                                            busy_s=1e-4, overlap_s=1e-4, tiled=tiled, concurrent=concurrent)
    return log, samples


def test_a_busy_calibration_measures_small_cells_again_with_a_twin_in_flight():
    """Training keeps two collectives in flight at once (the output dist with the next batch's ids,
    the backward's with DDP's bucket), which on a host whose cores the ranks hold costs each more.
    So a busy calibration's second pass launches each cell up to CONCURRENT_MAX_BYTES asynchronously
    alone and then with its twin on another group right behind it, each after a burst and a
    barrier, both waited for; the larger cells only in the first pass. A third pass calls the
    smallest and largest of those blocking, with busy_s and then AFTER_FACTOR x as much compute
    after the call (how the return lag grows with it). Two ranks."""
    from neo_train.testing import run_ranks
    from neo_train.topology.calibrate import CONCURRENT_MAX_BYTES

    big = CONCURRENT_MAX_BYTES * 2
    for log, samples in run_ranks(_logged_measure_body, 2, None, True, (16, big)):
        calls = [(i, e) for i, e in enumerate(log) if e[0] == "all_to_allv"]
        first_pass = 3 * 2 * 2  # (warm-up + iterations) x 2 sizes x (blocking, launched)
        second, third = calls[first_pass:first_pass + 3 * 3], calls[first_pass + 3 * 3:]
        # per iteration: alone (barrier, launch, busy), then with its twin (barrier, launch, twin launch, busy)
        assert len(second) == 3 * 3 and all(e[2] for _, e in second)
        # the third pass, per iteration: the small cell called blocking (barrier, busy, call, busy
        # after it), then with AFTER_FACTOR x the compute after it
        assert len(third) == 3 * 2 and not any(e[2] for _, e in third)
        for n, (i, _) in enumerate(third):
            assert log[i - 1][0] == "busy" and log[i - 2] == ("barrier",) and log[i + 1][0] == "busy"
            lo, hi = (0.5e-4, 1.5e-4) if n % 2 == 0 else (0.5e-4 * AFTER_FACTOR, 1.5e-4 * AFTER_FACTOR)
            assert lo <= log[i + 1][1] <= hi
        for j in range(3):
            (i_alone, alone), (i_a, a), (i_b, b) = second[3 * j: 3 * j + 3]
            assert log[i_alone - 1] == ("barrier",) and log[i_alone - 2][0] == "busy"
            assert log[i_a - 1] == ("barrier",) and log[i_a - 2][0] == "busy" and i_b == i_a + 1
            assert log[i_b + 1][0] == "busy" and a[4] == alone[4] != b[4] and a[3] == b[3] == (0, 1)
        passes = {(s["bytes"], s.get("pass"), s.get("concurrent")) for s in samples if s.get("async")}
        assert passes == {(16, None, None), (big, None, None), (16, "concurrent", False), (16, "concurrent", True)}
        assert {(s["bytes"], s["after_s"]) for s in samples if s.get("pass") == "after"} == {
            (16, 1e-4), (16, AFTER_FACTOR * 1e-4)}


def test_a_busy_calibration_launches_each_async_cell_together_and_overlaps_it_alike():
    """Training's ranks leave a collective together and compute alike while the next is in flight,
    so the calibration's asynchronous cells do too: every launch follows a barrier, and the compute
    between launch and wait is the same draw on every rank. Three ranks, groups of 2 and 3: rank 2,
    outside the group of 2, still draws for its cells, so the group of 3's draws stay the same."""
    from neo_train.testing import run_ranks

    logs = [log for log, _ in run_ranks(_logged_measure_body, 3)]
    overlaps = {}
    for rank, log in enumerate(logs):
        launches = [i for i, e in enumerate(log) if e[0] == "all_to_allv" and e[2]]
        assert len(launches) == 3 * (2 if rank < 2 else 1)  # (warm-up + iterations) x this rank's groups
        assert all(log[i - 1] == ("barrier",) and log[i + 1][0] == "busy" for i in launches), rank
        overlaps[rank] = [log[i + 1][1] for i in launches if log[i][1] == 3]
    assert overlaps[0] == overlaps[1] == overlaps[2] and len(set(overlaps[0])) == 3
    # the skew before each blocking call stays each rank's own
    first = [next(e[1] for e in log if e[0] == "busy") for log in logs]
    assert len(set(first)) == 3


@pytest.mark.parametrize("tiled", [None, False])
def test_a_busy_calibration_runs_smaller_groups_side_by_side(tiled):
    """Training runs its node-local and cross-node groups at once, so a busy calibration (tiled by
    default) measures a group size g < W as the world cut into W // g groups running each cell
    together, pooling their iterations; untiled, ranks 0..g-1 alone while the others idle. Four
    ranks: pairs {0, 1} and {2, 3}; a group of 3 is {0, 1, 2} either way (rank 3 idles)."""
    from neo_train.testing import run_ranks

    got = run_ranks(_logged_measure_body, 4, tiled)
    for rank, (log, samples) in enumerate(got):
        calls = [e for e in log if e[0] == "all_to_allv"]
        groups = {g: {e[3] for e in calls if e[1] == g} for g in (2, 3, 4)}
        pair = {(0, 1)} if rank < 2 else ({(2, 3)} if tiled is None else set())
        assert groups == {2: pair, 3: {(0, 1, 2)} if rank < 3 else set(), 4: {(0, 1, 2, 3)}}, rank
        # (warm-up + iterations) x (blocking, launched) per group this rank is in
        assert len(calls) == 3 * 2 * sum(map(len, groups.values()))
        assert samples == got[0][1]
        together = {(s["group"], s["groups_together"]) for s in samples}
        assert together == {(2, 2 if tiled is None else 1), (3, 1), (4, 1)}
        # every pooled iteration was timed (an untimed one would leave its figure NaN)
        assert all(math.isfinite(s[k]) and s[k] >= 0 for s in samples for k in ("seconds", "first_s", "spread_s"))


def test_a_call_costs_its_ranks_mean_return_after_the_last_call():
    """The simulator starts a collective at its last rank's call and resumes every rank at its end,
    and a step is the sum of its calls: a call's cost is the mean over ranks of (return - last
    call), averaged over iterations; the fastest rank's median (the calibration before) misses
    both the slower rank and the tail."""
    call = np.array([[0, 10, 20, 30], [2, 12, 22, 32]]) * MS  # (ranks, iterations): rank 1 calls last
    ret = np.array([[3, 13, 23, 38], [4, 14, 24, 39]]) * MS  # 1.5 ms each, one 6.5 ms stall
    per_iter = _call_seconds(call, ret)
    assert per_iter * 1e3 == pytest.approx([1.5, 1.5, 1.5, 6.5])
    assert per_iter.mean() * 1e3 == pytest.approx(2.75)
    assert np.median((ret - call).min(axis=0)) / 1e9 * 1e3 == pytest.approx(2.0)  # the old estimate


def test_an_async_collective_lasts_what_makes_the_waits_return_when_they_did():
    """D: the collective ends D after the last launch returned; a wait returns at the later of its
    start and that end. Waits that began after the end say only that D was shorter."""
    launch = np.array([[0, 10], [1, 11]]) * MS
    D = 3 * MS
    wait = np.array([[2, 20], [3, 12]]) * MS  # rank 0's second wait starts after the end (14 ms)
    ret = np.maximum(wait, launch.max(axis=0) + D)
    d, first, spread = _async_seconds(launch, wait, ret)
    assert (d * 1e3, first * 1e3, spread) == pytest.approx((3.0, 3.0, 0.0))
    assert _async_seconds(launch, wait, wait) == (0.0, 0.0, 0.0)  # every wait returned at once: nothing to wait for


def test_a_calibration_launch_is_timed_where_the_backend_issued_it():
    """``_launch``: the launch's instant is where the backend marked the hand-over to its transport
    (``Communicator.issued_at``), not where the launch returned (a host that keeps the caller from
    returning 40 ms after it); a communicator without the mark gives the return."""
    import time as _time

    from neo_train.comm.interface import Communicator, mark_issue

    def op(async_op):
        _time.sleep(0.01)  # what a launch does before the transport call
        mark_issue()
        _time.sleep(0.04)
        return "handle"

    class Marked:  # what the calibration reads off a communicator
        clear_issue, issued_at = staticmethod(Communicator.clear_issue), staticmethod(Communicator.issued_at)

    for comm, lo, hi in ((Marked(), 10, 35), (object(), 50, 1000)):
        t0 = _time.time_ns()
        handle, at = _launch(comm, op)
        assert handle == "handle" and lo <= (at - t0) / MS < hi, (comm, (at - t0) / MS)
    mark_issue()  # a mark left from before is cleared by the next launch
    assert Marked.issued_at() is not None
    handle, at = _launch(Marked(), lambda a: "no mark")
    assert Marked.issued_at() is None and at <= _time.time_ns()


def test_the_ranks_waiting_for_a_collective_return_apart():
    """A blocking cell: its first rank returns 1 ms after the last call, the other 2 ms later in
    one iteration and at once in the other: first 1 ms, spread (0 + 2 + 0 + 0) / 4 = 0.5 ms, and
    first + spread is the cell's mean cost. An asynchronous cell: the waits that blocked return
    apart (rank 1 2 ms after rank 0), so ``first`` ends with the first of them; a wait that began
    after the end (rank 0, second iteration) blocked for nothing and has no lag; D is still what
    gives the mean return with the ranks resuming together."""
    call = np.array([[0, 10], [2, 12]]) * MS
    ret = np.array([[3, 13], [5, 13]]) * MS
    first, spread = _return_spread(call, ret)
    assert (first * 1e3, spread * 1e3) == pytest.approx((1.0, 0.5))
    assert first + spread == pytest.approx(_call_seconds(call, ret).mean())
    launch = np.array([[0, 10], [1, 11]]) * MS
    wait = np.array([[2, 20], [2, 12]]) * MS
    ret = np.array([[4, 20], [6, 14]]) * MS  # ends at 4 and 14 ms (D = 3 ms); rank 1 lags 2 ms in the first
    d, first, spread = _async_seconds(launch, wait, ret)
    assert first * 1e3 == pytest.approx(3.0)
    assert spread * 1e3 == pytest.approx((0 + 2 + 0) / 3)  # over the three waits that blocked
    assert d * 1e3 == pytest.approx(11 / 3)  # mean return 11 ms (4, 20, 6, 14) with the ranks resuming together


def test_the_fit_takes_the_first_return_and_keeps_the_spread_beside_it():
    """Cells with first_s / spread_s: alpha is fitted to the first return, the spread kept per group
    size (the mean over the cells); without them (files before) alpha is the mean return and the
    ranks return together. The file keeps the spread; a malformed one is named."""
    def first(k, g, b):  # alpha 1 ms per rank of the group, the shared fabric at 1 GB/s
        return 1e-3 * g + _unit_time(k, g, b, "shared") / 1e9

    rows = [{"kind": k, "group": g, "bytes": b, "seconds": first(k, g, b) + 3e-3, "first_s": first(k, g, b),
             "spread_s": 3e-3 if g == 2 else 2e-3} for k in ("all_to_allv", "all_reduce") for g in (2, 3)
            for b in (1 << 10, 1 << 20, 8 << 20)]
    cal = fit_calibration(rows, world_size=3, transport="gloo", device="cpu")
    f = cal.kinds["all_to_allv"]
    assert f.latency_s == pytest.approx({2: 2e-3, 3: 3e-3}, rel=1e-3)
    assert f.spread_s == pytest.approx({2: 3e-3, 3: 2e-3})
    assert cal.spread("all_to_allv", 2) == pytest.approx(3e-3) and cal.spread("barrier", 2) == 0.0
    old = fit_calibration([{k: v for k, v in r.items() if k not in ("first_s", "spread_s")} for r in rows],
                          world_size=3, transport="gloo", device="cpu")
    assert old.kinds["all_to_allv"].latency_s == pytest.approx({2: 5e-3, 3: 6e-3}, rel=1e-3)
    assert old.spread("all_to_allv", 2) == 0.0
    data = json.loads(json.dumps(cal.to_dict()))
    assert Calibration.from_dict(data).kinds == cal.kinds
    data["kinds"]["all_to_allv"]["spread_s"] = {"1": 1e-3}
    with pytest.raises(CalibrationError, match=r"kinds\.all_to_allv\.spread_s"):
        Calibration.from_dict(data, "c.json")


def _file_keeps(cal: Calibration, section: str, kind: str, field: str, bad: dict) -> None:
    """``cal``'s fits of ``section`` survive its file; the file with ``section.kind.field`` set to
    ``bad`` is refused, naming the field and the group size."""
    data = json.loads(json.dumps(cal.to_dict()))
    assert getattr(Calibration.from_dict(data), section) == getattr(cal, section)
    data[section][kind][field] = bad
    with pytest.raises(CalibrationError, match=re.escape(f"{section}.{kind}.{field}.{next(iter(bad))}")):
        Calibration.from_dict(data, "c.json")


def test_the_third_pass_fits_how_the_return_lag_grows_with_the_compute_after_the_call():
    """A busy calibration's third pass (cells called blocking with busy_s, then AFTER_FACTOR x busy_s
    of compute after the call): per kind and group size, the growth of the mean spread per second
    of the difference (never below 0), kept on the blocking fit, which the pass does not move.
    ``Calibration.lag_after`` charges it for the compute beyond the calibration's burst. The file
    keeps it; a malformed one is named; files without it add nothing."""
    busy = 1e-3

    def t(g, b):
        return 1e-3 * g + _unit_time("all_to_allv", g, b, "shared") / 1e9

    sync = [{"kind": k, "group": g, "bytes": b, "seconds": t(g, b) + 5e-4, "first_s": t(g, b), "spread_s": 5e-4,
             "busy_s": busy}
            for k in ("all_to_allv", "all_reduce") for g in (2, 3) for b in (1 << 10, 1 << 20, 8 << 20)]
    # all-to-all: g = 2 spread 0.5 -> 0.9 ms when the compute after grows 1 -> 3 ms (0.2 per second), g = 3
    # flat; all-reduce: g = 2 shrinks (0), g = 3 0.3 -> 0.5 and 0.7 -> 0.9 over two sizes (0.1)
    spreads = {("all_to_allv", 2): ((5e-4, 5e-4), (9e-4, 9e-4)), ("all_to_allv", 3): ((6e-4, 6e-4), (6e-4, 6e-4)),
               ("all_reduce", 2): ((9e-4, 9e-4), (5e-4, 5e-4)), ("all_reduce", 3): ((3e-4, 7e-4), (5e-4, 9e-4))}
    third = [{"kind": k, "group": g, "bytes": b, "seconds": t(g, b) + sp[j][i], "first_s": t(g, b),
              "spread_s": sp[j][i], "busy_s": busy, "pass": "after", "after_s": a} for (k, g), sp in spreads.items()
             for i, b in enumerate((16, 1 << 17)) for j, a in enumerate((busy, AFTER_FACTOR * busy))]
    cal = fit_calibration(sync + third, world_size=3, transport="gloo", device="cpu")
    alone = fit_calibration(sync, world_size=3, transport="gloo", device="cpu")
    assert cal.kinds["all_to_allv"].after_lag == pytest.approx({2: 0.2, 3: 0.0}, abs=1e-9)
    assert cal.kinds["all_reduce"].after_lag == pytest.approx({2: 0.0, 3: 0.1}, abs=1e-9)
    for k in ("all_to_allv", "all_reduce"):
        assert dataclasses.replace(cal.kinds[k], after_lag={}) == alone.kinds[k]
    assert cal.busy_s == busy and alone.busy_s == busy and _cal().busy_s == 0.0
    assert cal.lag_after("all_to_allv", 2, 5e-3) == pytest.approx(0.2 * 4e-3)
    assert cal.lag_after("all_to_allv", 2, 5e-4) == 0.0  # no more than the calibration's burst
    assert cal.lag_after("all_reduce", 3, 2e-3) == pytest.approx(1e-4)
    assert cal.lag_after("all_gather", 2, 5e-3) == 0.0 == alone.lag_after("all_to_allv", 2, 5e-3)
    assert "lag +200, 0 us per ms computed after it" in cal.table()
    _file_keeps(cal, "kinds", "all_reduce", "after_lag", {"3": -0.1})


def test_the_lagging_ranks_lag_longer_where_the_others_compute_longer_after_it(tmp_path):
    """``trace_input.compute_after``: per collective waited for, the compute after the call or wait
    until the rank's next blocking interval, the mean over its ranks; the timeline hands it to the
    return lags (``_after``), which add ``Calibration.lag_after`` x g / (g - 1) to each rank that
    lags (the same draws otherwise), nothing to the one that resumes at the end."""
    from neo_train.topology.trace_input import compute_after

    traces = load_trace(_hand_trace(tmp_path / "tr"))
    blocks, colls = rank_timelines(traces)
    a2a, ar = ((0, (0, 1)), (1, (0, 1)))
    # the blocking a2a: then 1 / 3 ms before the async one; that one's wait: 1 / 2 ms before the
    # all-reduce; the all-reduce's backward: 1 ms before the last call; the last call: nothing after it
    assert compute_after(blocks) == pytest.approx({(a2a, 0): 2e-3, (a2a, 1): 1.5e-3, (ar, 0): 1e-3})
    cal = _cal()
    cal.kinds = {k: dataclasses.replace(f, spread_s={2: 1e-3}, after_lag={2: 0.5}) for k, f in cal.kinds.items()}
    cal.samples = [{"busy_s": 1e-3}]
    entries = {r: dict(e) for r, e in colls[(a2a, 0)].items()}
    def lags(after=None):  # the same seed: the same draws
        given = entries if after is None else {r: dict(e, _after=after) for r, e in entries.items()}
        return calibrated_return_lags(cal, seed=5)("all_to_allv", [0, 1], given)

    plain, longer = lags(), lags(3e-3)
    assert sorted(plain.values())[0] == 0.0 and set(plain) == set(longer) == {0, 1}
    for r in (0, 1):
        assert longer[r] == (0.0 if plain[r] == 0 else pytest.approx(plain[r] + 0.5 * 2e-3 * 2))
    assert lags(5e-4) == plain
    # in the timeline: the lag phases of the blocking a2a grow by 0.5 x (2 - 1) ms x 2
    base = timeline_phases(traces, calibrated_collectives(cal), calibrated_return_lags(_cal_spread(), seed=5))
    tl = timeline_phases(traces, calibrated_collectives(cal), calibrated_return_lags(cal, seed=5))
    lag = lambda t: {p.name: p.seconds for p in t.phases if p.name.startswith("lag:") and ":0:0" in p.name}
    assert lag(base) and {n: v - lag(base)[n] for n, v in lag(tl).items()} == pytest.approx(
        {n: 1e-3 for n in lag(base)})


def _cal_spread() -> Calibration:
    cal = _cal()
    cal.kinds = {k: dataclasses.replace(f, spread_s={2: 1e-3}) for k, f in cal.kinds.items()}
    return cal


def test_the_second_pass_adds_what_company_costs_to_the_first_pass_fit():
    """A busy calibration's second pass (each small cell launched alone, then with a twin in
    flight): what the company adds is fitted from those two alone, per group size, and kept beside
    the first pass's asynchronous fit, which the second pass does not move (its load differs). The
    file keeps it; a malformed one is named; files without it add nothing."""
    def t(k, g, b, alpha):  # the shared fabric at 1 GB/s
        return alpha * g + _unit_time(k, g, b, "shared") / 1e9

    sync = [{"kind": k, "group": g, "bytes": b, "seconds": t(k, g, b, 1e-3)} for k in ("all_to_allv", "all_reduce")
            for g in (2, 3) for b in (1 << 10, 1 << 20, 8 << 20)]
    first = [dict(r, seconds=t(r["kind"], r["group"], r["bytes"], 2e-3), **{"async": True}) for r in sync]
    # the second pass ran lighter (alpha 0.5 ms per rank) and company adds 0.3 ms (g = 2), 0.6 ms (g = 3)
    second = [dict(r, seconds=t(r["kind"], r["group"], r["bytes"], 5e-4) + (3e-4 * (r["group"] - 1) if c else 0.0),
                   concurrent=c, **{"async": True, "pass": "concurrent"}) for r in sync if r["bytes"] <= 1 << 20
              for c in (False, True)]
    cal = fit_calibration(sync + first + second, world_size=3, transport="gloo", device="cpu")
    alone = fit_calibration(sync + first, world_size=3, transport="gloo", device="cpu")
    for k in ("all_to_allv", "all_reduce"):
        f = cal.async_kinds[k]
        assert f.latency_s == pytest.approx({2: 4e-3, 3: 6e-3}, rel=1e-6)  # the first pass's alone
        assert dataclasses.replace(f, concurrent_s={}) == alone.async_kinds[k]
        assert f.concurrent_s == pytest.approx({2: 3e-4, 3: 6e-4}, rel=1e-6, abs=1e-9)
        assert cal.latency(k, 3, async_op=True, concurrent=True) == pytest.approx(6.6e-3)
        assert cal.latency(k, 3, concurrent=True) == cal.latency(k, 3) == pytest.approx(3e-3)  # blocking: none
        assert alone.latency(k, 3, async_op=True, concurrent=True) == pytest.approx(6e-3)
    assert "with another in flight +300, 600 us" in cal.table()
    _file_keeps(cal, "async_kinds", "all_reduce", "concurrent_s", {"2": -1.0})


def test_the_first_pass_fits_how_an_asynchronous_collective_slows_with_the_compute_over_it():
    """A busy calibration's first pass keeps each asynchronous cell's iterations (the compute drawn
    over it, its completion): per kind and group size the slope of the completion on the draw with
    each cell's means taken off (cells of different sizes differ in level, not in slope), at least
    0, and the mean draw, on the asynchronous fit, whose latency they do not move. ``latency``
    charges an asynchronous collective the slope times the compute over it beyond that mean, on
    the asynchronous fit's share only (less compute, or a blocking call: nothing). The file keeps
    them; a malformed one is named; files without the iterations add nothing."""
    rng = np.random.default_rng(3)

    def t(k, g, b, alpha):  # the shared fabric at 1 GB/s
        return alpha * g + _unit_time(k, g, b, "shared") / 1e9

    sync = [{"kind": k, "group": g, "bytes": b, "seconds": t(k, g, b, 1e-3)} for k in ("all_to_allv", "all_reduce")
            for g in (2, 3) for b in (1 << 10, 1 << 20, 8 << 20)]
    slope = {("all_to_allv", 2): 0.4, ("all_to_allv", 3): 0.25, ("all_reduce", 2): 0.0, ("all_reduce", 3): 0.5}
    first = []
    for r in sync:
        k, g, b = r["kind"], r["group"], r["bytes"]
        ov = rng.uniform(0.0, 4e-3, 37)
        done = t(k, g, b, 2e-3) + slope[(k, g)] * (ov - ov.mean()) + rng.normal(0, 1e-5, ov.size)
        if (k, g) == ("all_reduce", 2):
            done = done - 0.2 * (ov - ov.mean())  # slows less the more it is computed over: clamped to 0
        first.append(dict(r, seconds=float(done.mean()), iters_overlap_s=ov.round(6).tolist(),
                          iters_done_s=done.round(6).tolist(), **{"async": True}))
    cal = fit_calibration(sync + first, world_size=3, transport="gloo", device="cpu")
    bare = fit_calibration(sync + [{k: v for k, v in r.items() if not k.startswith("iters_")} for r in first],
                           world_size=3, transport="gloo", device="cpu")
    draws = {g: np.mean([np.mean(r["iters_overlap_s"]) for r in first if r["group"] == g and r["kind"] == "all_to_allv"])
             for g in (2, 3)}
    f = cal.async_kinds["all_to_allv"]
    assert f.overlap_slope == pytest.approx({2: 0.4, 3: 0.25}, abs=0.01)
    assert f.overlap_mean_s == pytest.approx(draws) and 1.5e-3 < draws[2] < 2.5e-3
    assert cal.async_kinds["all_reduce"].overlap_slope == pytest.approx({2: 0.0, 3: 0.5}, abs=0.01)
    for k in ("all_to_allv", "all_reduce"):
        assert dataclasses.replace(cal.async_kinds[k], overlap_slope={}, overlap_mean_s={}) == bare.async_kinds[k]
        assert bare.async_kinds[k].overlap_slope == {} and cal.kinds[k] == bare.kinds[k]
    at = cal.latency("all_to_allv", 2, async_op=True)
    s2, m2 = f.overlap_slope[2], f.overlap_mean_s[2]
    assert cal.latency("all_to_allv", 2, async_op=True, over_s=m2 + 3e-3) == pytest.approx(at + s2 * 3e-3)
    assert cal.latency("all_to_allv", 2, async_op=True, over_s=m2 / 2) == at  # less than the calibration's draw
    assert cal.latency("all_to_allv", 2, over_s=m2 + 3e-3) == cal.latency("all_to_allv", 2)  # blocking: none
    assert bare.latency("all_to_allv", 2, async_op=True, over_s=m2 + 3e-3) == bare.latency("all_to_allv", 2,
                                                                                            async_op=True)
    # waited for idle a quarter of its time: the asynchronous fit's rate, slope included, for three quarters
    assert cal.latency("all_to_allv", 2, async_op=True, idle=0.25, over_s=m2 + 3e-3) == pytest.approx(
        1 / (0.75 / (at + s2 * 3e-3) + 0.25 / cal.latency("all_to_allv", 2)))
    assert "us per ms computed over it beyond" in cal.table()
    _file_keeps(cal, "async_kinds", "all_to_allv", "overlap_slope", {"2": -0.1, "3": 0.25})
    data = json.loads(json.dumps(cal.to_dict()))
    del data["async_kinds"]["all_to_allv"]["overlap_mean_s"]["3"]
    with pytest.raises(CalibrationError, match=r"async_kinds\.all_to_allv\.overlap_slope.*overlap_mean_s"):
        Calibration.from_dict(data, "c.json")


def test_an_asynchronous_collective_computed_over_longer_than_the_calibration_lasts_longer(tmp_path):
    """``trace_input.compute_over``: per asynchronous collective joined (a wait, or the backward's
    end), its ranks' compute from the launch to the join, the mean over them; the timeline hands
    it to the factory (``_over``), which charges the asynchronous fit's ``overlap_slope`` for what
    exceeds its ``overlap_mean_s``: the all-reduce's end moves by that much."""
    from neo_train.topology.trace_input import compute_over

    traces = load_trace(_hand_trace(tmp_path / "tr"))
    blocks, colls = rank_timelines(traces)
    a2a, ar = ((0, (0, 1)), (1, (0, 1)))
    # the async a2a: rank 0 computes 2 ms before its wait, rank 1 0.5 ms; the all-reduce 0.5 ms
    # before the backward's end on both; the blocking calls have none
    assert compute_over(blocks, colls) == pytest.approx({(a2a, 1): 1.25e-3, (ar, 0): 0.5e-3})
    cal = _cal()
    cal.async_kinds = dict(cal.kinds)
    plain = simulate(timeline_phases(traces, calibrated_collectives(cal)).phases, cal.network())
    cal.async_kinds = {k: dataclasses.replace(f, overlap_slope={2: 0.5}, overlap_mean_s={2: 0.3e-3})
                       for k, f in cal.kinds.items()}
    tl = timeline_phases(traces, calibrated_collectives(cal))
    lat = {":".join(p.name.split(":")[-2:]): p.seconds for p in tl.phases if p.name.startswith("latency:")}
    # alpha, plus 0.5 x (1.25 - 0.3) ms for the a2a and 0.5 x (0.5 - 0.3) ms for the all-reduce
    assert lat == pytest.approx({"0:0": 1e-3, "0:1": 1.475e-3, "1:0": 2.1e-3, "0:2": 1e-3})
    res = simulate(tl.phases, cal.network())
    end = {p.name: p.end for p in res.phases}
    end0 = {p.name: p.end for p in plain.phases}
    name = tl.comm_end[(ar, 0)]
    # the a2a ends 0.475 ms later, which rank 1 waited for before it launched the all-reduce
    assert (end[name] - end0[name]) * 1e3 == pytest.approx(0.475 + 0.1)


def test_collectives_in_flight_together_take_the_company_latency(tmp_path):
    """By the recorded order: an asynchronous collective's company is how many other collectives
    were issued between its launch and its wait on a rank, or launched before and waited for after
    its launch (the most over the ranks); a blocking call has none (the calibration measures
    asynchronous pairs), but takes a live one's beside it (``live_company``, the next test). In
    company it takes the calibration's concurrent latency on top, once (one companion was
    measured)."""
    from neo_train.topology.trace_input import concurrent_collectives

    # every rank: a2a launched (1), all-reduce launched (2), a2a waited (3), all-reduce waited (4);
    # then an a2a launched (5), a blocking a2a (6), an all-reduce launched (7), waits (8, 9);
    # rank 1 computes longer here and there (the order is what counts)
    def rank_entries(extra):
        return [_entry("all_to_allv", 0, 1, 1 * MS, MS // 10, step=0, lead=0, async_op=True,
                       wait=("wait", 3, MS // 10, MS)),
                _entry("all_reduce", 1, 2, MS // 10 + extra, MS // 10, step=0, size=1000, async_op=True,
                       wait=("wait", 4, MS // 10, MS)),
                _entry("all_to_allv", 0, 5, 1 * MS, MS // 10, step=0, async_op=True, wait=("wait", 8, MS, 0)),
                _entry("all_to_allv", 0, 6, 1 * MS + extra, MS, step=0),
                _entry("all_reduce", 1, 7, 1 * MS, MS // 10, step=0, size=1000, async_op=True,
                       wait=("wait", 9, MS // 10, MS))]
    path = tmp_path / "tr"
    path.mkdir()
    for r in (0, 1):
        (path / f"trace_rank{r}.json").write_text(json.dumps(rank_entries(r * MS)))
    traces = load_trace(path)
    blocks, colls = rank_timelines(traces)
    key_of = {(pg, k): key for key in colls for (pg, _), k in [key]}
    assert concurrent_collectives(blocks) == {key_of[(0, 0)]: 1, key_of[(1, 0)]: 1, key_of[(0, 1)]: 2,
                                              key_of[(1, 1)]: 1}
    cal = _cal()
    cal.async_kinds = {k: dataclasses.replace(f, concurrent_s={2: 5e-4}) for k, f in cal.kinds.items()}
    tl = timeline_phases(traces, calibrated_collectives(cal))
    lat = {":".join(p.name.split(":")[-2:]): p.seconds for p in tl.phases if p.name.startswith("latency:")}
    # "process group:k-th": alpha (1 ms a2a, 2 ms all-reduce) + 0.5 ms in company; the blocking a2a has
    # no company of its own, but the a2a launched before it is live (both ranks launched it): its 0.5 ms
    assert lat == pytest.approx({"0:0": 1.5e-3, "1:0": 2.5e-3, "0:1": 1.5e-3, "0:2": 1.5e-3, "1:1": 2.5e-3})
    # without the calibration's figure (files before): alpha alone
    cal.async_kinds = dict(cal.kinds)
    tl = timeline_phases(traces, calibrated_collectives(cal))
    assert {p.seconds for p in tl.phases if p.name.startswith("latency:")} == {1e-3, 2e-3}


def _four_rank_trace(path: Path, bucket_at: dict[int, int], joined: bool = True) -> Path:
    """Four ranks on two "nodes" of two, as W = 4 TWRW's backward: each rank calls a blocking
    cross-node all-to-all ({0, 2}, {1, 3}) and then a blocking node-local all-gather ({0, 1},
    {2, 3}), and launches a world all-reduce (DDP's bucket) at position ``bucket_at[rank]`` among
    those (0: before both, 2: after both), joined by a wait last (or never)."""
    def on(e, pg, group):
        return dict(e, pg_id=pg, global_ranks=group, world_size=4)

    path.mkdir(parents=True, exist_ok=True)
    for r in range(4):
        calls = [on(_entry("all_to_allv", 0, 0, MS, MS, step=0, size=8), 10 + r % 2, [r % 2, r % 2 + 2]),
                 on(_entry("all_gather", 0, 0, MS, MS, step=0, size=8), 20 + r // 2, [r // 2 * 2, r // 2 * 2 + 1])]
        wait = ("wait", 3, MS, MS) if joined else None
        calls.insert(bucket_at[r], on(_entry("all_reduce", 0, 0, MS, MS // 10, step=0, size=8, async_op=True, wait=wait),
                                      30, [0, 1, 2, 3]))
        (path / f"trace_rank{r}.json").write_text(json.dumps([dict(e, order=i) for i, e in enumerate(calls)]))
    return path


def test_a_blocking_call_beside_a_live_collective_takes_its_company(tmp_path):
    """A blocking call made while an asynchronous collective of its rank is in flight takes that
    collective's company figure (the asynchronous fit's ``concurrent_s`` at its group size) only where
    the collective is live: every rank of its group known, by the recorded order, to have launched
    it by the time the call ends. With the bucket launched first on every rank, the cross-node
    all-to-all ends knowing only its own node pair's launches (not live), the node-local all-gather
    after it knows all four (live); with the bucket launched last on one node, neither is."""
    from neo_train.topology.trace_input import live_company

    def company(path):
        traces = load_trace(path)
        blocks, colls = rank_timelines(traces)
        return {(pg, k): v for ((pg, _), k), v in live_company(blocks, colls).items()}, traces

    first, traces = company(_four_rank_trace(tmp_path / "first", {r: 0 for r in range(4)}))
    assert first == {(20, 0): ("all_reduce", 4), (21, 0): ("all_reduce", 4)}  # the all-gathers; no all-to-all
    late, _ = company(_four_rank_trace(tmp_path / "late", {0: 0, 1: 2, 2: 0, 3: 2}))
    assert late == {}  # ranks 1, 3 launch it after both calls
    assert company(_four_rank_trace(tmp_path / "never", {r: 0 for r in range(4)}, joined=False))[0] == {}
    # the calibrated factory charges the live company on the all-gathers' latency, nothing else
    kinds = {k: KindFit({2: 1e-3, 4: 2e-3}, 1e-9) for k in ("all_to_allv", "all_reduce", "all_gather", "reduce_scatter")}
    cal = Calibration("gloo", "cpu", 4, "shared", 1e9, kinds)
    cal.async_kinds = {k: dataclasses.replace(f, concurrent_s={2: 3e-4, 4: 7e-4}) for k, f in kinds.items()}
    lat = {p.name.split(":")[-2]: p.seconds for p in timeline_phases(traces, calibrated_collectives(cal)).phases
           if p.name.startswith("latency:")}
    assert lat == pytest.approx({"10": 1e-3, "11": 1e-3, "20": 1.7e-3, "21": 1.7e-3, "30": 2e-3 + 7e-4})
    assert cal.company("all_reduce", 4) == 7e-4 and cal.company("all_reduce", 3) == 0.0
    cal.async_kinds = {}  # an idle calibration: no company measured, none charged
    lat = {p.name.split(":")[-2]: p.seconds for p in timeline_phases(traces, calibrated_collectives(cal)).phases
           if p.name.startswith("latency:")}
    assert lat["20"] == lat["10"] == 1e-3


def test_an_all_reduce_keeps_company_only_with_a_call_of_a_smaller_group(tmp_path):
    """W = 2, 3 TWRW's node-local group is the world: the backward's all-gather is called beside DDP's
    world bucket, of its own group, and takes no company (``COMPANY_LARGER_GROUP_ONLY``); an
    all-to-all live beside a call of its own group (the next batch's ids beside the forward's
    node-local all-to-all) still gives its company, and W = 4's pairs still take the bucket's."""
    from neo_train.topology.trace_input import COMPANY_LARGER_GROUP_ONLY, live_company

    assert COMPANY_LARGER_GROUP_ONLY == ("all_reduce",)

    def world_trace(path: Path, kind: str, ranks: int) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        group = list(range(ranks))
        for r in group:
            calls = [_entry(kind, 30, 0, 0, MS // 10, step=0, size=3 * ranks, async_op=True, wait=("wait", 2, MS, MS)),
                     _entry("all_gather", 20, 1, 0, MS, step=0, size=8)]
            calls = [dict(e, global_ranks=group, world_size=ranks, in_split=[3] * ranks if kind == "all_to_allv" else [],
                          out_split=[3] * ranks if kind == "all_to_allv" else []) for e in calls]
            calls[1].update(in_split=[], out_split=[])
            (path / f"trace_rank{r}.json").write_text(json.dumps(calls))
        return path

    def company(path: Path) -> dict:
        blocks, colls = rank_timelines(load_trace(path))
        return {pg: v for ((pg, _), _), v in live_company(blocks, colls).items()}

    for ranks in (2, 3):
        assert company(world_trace(tmp_path / f"bucket{ranks}", "all_reduce", ranks)) == {}
        assert company(world_trace(tmp_path / f"ids{ranks}", "all_to_allv", ranks)) == {20: ("all_to_allv", ranks)}
    pairs = company(_four_rank_trace(tmp_path / "pairs", {r: 0 for r in range(4)}))
    assert pairs == {20: ("all_reduce", 4), 21: ("all_reduce", 4)}


def test_a_call_of_a_smaller_group_counts_half_as_compute_over_a_collective_in_flight(tmp_path):
    """W = 4 TWRW's backward: DDP's world bucket is in flight over each rank's blocking pair calls
    (1 ms compute before each block, 1 ms in each call). ``compute_over`` counts the time blocked in
    a call of a smaller group than the collective's at ``OVER_BLOCKED_SMALLER`` (0.5), beside the
    compute; a call of its own group not at all; the timeline hands it to the factory as ``_over``."""
    from neo_train.topology.trace_input import OVER_BLOCKED_SMALLER, compute_over

    assert OVER_BLOCKED_SMALLER == 0.5

    def over(path: Path) -> float:
        blocks, colls = rank_timelines(load_trace(path))
        (value,) = [v for ((pg, _), _), v in compute_over(blocks, colls).items() if pg == 30]
        return value

    # launched before both calls: 3 ms of compute and half of the 2 ms blocked; after one, 2 + 0.5;
    # after both, the wait's 1 ms alone
    assert over(_four_rank_trace(tmp_path / "first", {r: 0 for r in range(4)})) == pytest.approx(4e-3)
    assert over(_four_rank_trace(tmp_path / "middle", {r: 1 for r in range(4)})) == pytest.approx(2.5e-3)
    assert over(_four_rank_trace(tmp_path / "last", {r: 2 for r in range(4)})) == pytest.approx(1e-3)
    # the all-gather made a world call: the bucket's own group, not counted
    world = _four_rank_trace(tmp_path / "world", {r: 0 for r in range(4)})
    for f in world.glob("trace_rank*.json"):
        es = json.loads(f.read_text())
        for e in es:
            if e["comms"] == "all_gather":
                e.update(pg_id=40, global_ranks=[0, 1, 2, 3])
        f.write_text(json.dumps(es))
    assert over(world) == pytest.approx(3.5e-3)
    # a one-rank call (the rank's own copy) after the launch: no transport, not counted
    own = _four_rank_trace(tmp_path / "own", {r: 0 for r in range(4)})
    for r, f in enumerate(sorted(own.glob("trace_rank*.json"))):
        es = json.loads(f.read_text())
        copy = dict(_entry("all_gather", 50 + r, 0, 0, MS, step=0, size=8), global_ranks=[r], world_size=4)
        es = [dict(e, order=i) for i, e in enumerate(es[:1] + [copy] + es[1:])]
        es[0]["wait_order"] = len(es)
        f.write_text(json.dumps(es))
    assert over(own) == pytest.approx(4e-3)
    seen = {}

    def factory(kind, group, by_rank, name, after):
        seen[name.split(":")[2]] = by_rank[min(by_rank)].get("_over")
        return None

    timeline_phases(load_trace(tmp_path / "first"), factory)
    assert seen["30"] == pytest.approx(4e-3)


def test_each_rank_resumes_at_the_end_plus_its_own_lag(tmp_path):
    """The hand-made trace with a spread of 1 ms per collective: per collective one rank resumes at
    its end and the other after its drawn lag (the same draws for the same seed); every blocking
    call and wait resumes at the later of its arrival and the end plus its lag. Over many
    collectives the lags have mean spread * g / (g - 1) on the ranks that lag, one rank per
    collective none: the mean over the ranks is the spread."""
    cal = _cal()
    cal.kinds = {k: dataclasses.replace(f, spread_s={2: 1e-3}) for k, f in cal.kinds.items()}
    traces = load_trace(_hand_trace(tmp_path / "tr"))
    plain = timeline_phases(traces, calibrated_collectives(cal))
    tl = timeline_phases(traces, calibrated_collectives(cal), calibrated_return_lags(cal, seed=3))
    again = timeline_phases(traces, calibrated_collectives(cal), calibrated_return_lags(cal, seed=3))
    assert [(p.name, p.seconds) for p in tl.phases if p.name.startswith("lag:")] == [
        (p.name, p.seconds) for p in again.phases if p.name.startswith("lag:")]
    e0 = {p.name: p.end for p in simulate(plain.phases, cal.network()).phases}
    e1 = {p.name: p.end for p in simulate(tl.phases, cal.network()).phases}
    lags = {p.name: p.seconds for p in tl.phases if p.name.startswith("lag:")}
    assert lags and all(v > 0 for v in lags.values())
    waited = 0
    for (rank, order), (before, after) in tl.nodes.items():
        b = next(b for b in tl.blocks[rank] if b.order == order)
        if not (b.sync or b.kind == "wait"):
            continue
        ends = [e1[tl.comm_end[k]] + lags.get(f"lag:r{rank}:{tl.comm_end[k]}", 0.0) for k in b.colls]
        assert e1[after] == pytest.approx(max([e1[before]] + ends))  # the later of its arrival and end + lag
        waited += e1[before] < max(ends)
    assert waited >= 4
    assert all(e1[n] >= e0[n] - 1e-12 for n in e0)  # lags only ever delay
    for name in tl.comm_end.values():  # one rank per collective resumes at its end
        assert sum(f"lag:r{r}:{name}" not in lags for r in (0, 1)) == 1
    lag_fn = calibrated_return_lags(cal, seed=0)
    draws = [lag_fn("all_to_allv", [0, 1], {0: {}, 1: {}}) for _ in range(4000)]
    assert all(min(d.values()) == 0.0 for d in draws)
    assert np.mean([max(d.values()) for d in draws]) == pytest.approx(2e-3, rel=0.08)  # spread * g / (g - 1)
    assert np.mean([sum(d.values()) / 2 for d in draws]) == pytest.approx(1e-3, rel=0.08)  # the mean: spread
    # a trace's even all-to-all is the calibration's all_to_allv: its latency, bytes and spread
    even = {r: {"in_msg_size": 8, "dtype": "float"} for r in (0, 1)}
    lat, comm = calibrated_collectives(cal)("all_to_all", [0, 1], even, "a2a", ())[0]
    assert lat.seconds == cal.latency("all_to_allv", 2) > 0 and comm.rounds
    assert len(calibrated_return_lags(cal, seed=0)("all_to_all", [0, 1], even)) == 2


def test_each_rank_leaves_in_its_recorded_order(tmp_path):
    """``trace_input.leave_order``: the ranks' order in leaving each collective they waited for, on
    the wall clock (a call's ``startTime_ns``, the blocks after it by their compute and length), and
    ``calibrated_return_lags`` giving the lags in that order: the first to leave none, the others
    the same draws sorted, so the set of lags is the unordered one's and only who gets which moves."""
    from neo_train.topology.trace_input import leave_order, rank_timelines

    traces = load_trace(_hand_trace(tmp_path / "tr"))
    # rank 1's blocking all-to-all began 0.5 ms after rank 0's and both lasted 1 ms: rank 0 left first;
    # rank 1's async all-to-all began 0.2 ms earlier than rank 0's, and its wait ended 0.5 ms sooner
    for r, t0 in ((0, 0), (1, MS // 2)):
        traces[r][0]["startTime_ns"] = t0
        traces[r][1]["startTime_ns"] = 10 * MS + (MS // 5 if r == 0 else 0)
        traces[r][2]["startTime_ns"] = 20 * MS
        traces[r][3]["startTime_ns"] = 30 * MS + (0 if r == 1 else MS)
    blocks, colls = rank_timelines(traces)
    order = leave_order(blocks, colls)
    key = {(k[0][0], k[1]): k for k in colls}  # (process group, its k-th collective)
    first, ids, bucket, last = key[(0, 0)], key[(0, 1)], key[(1, 0)], key[(0, 2)]
    assert order[first] == {0: 0, 1: 1}
    # the waits: rank 0 left at 10.2 + 0.1 + 2 + 1 = 13.3 ms, rank 1 at 10 + 0.1 + 0.5 + 0.5 = 11.1
    assert order[ids] == {1: 0, 0: 1}
    assert order[last] == {1: 0, 0: 1}  # began at 30 and 31 ms, 1 ms each
    assert bucket in order  # joined at the backward's end, anchored on its launch
    # a rank timed on the device's clock cannot be placed: the collectives it waited for are left out
    traces[0][3]["clock"] = "cuda"
    assert last not in leave_order(*rank_timelines(traces))

    cal = _cal(3)
    cal.kinds = {k: dataclasses.replace(f, latency_s={2: 1e-3, 3: 1e-3}, spread_s={3: 1e-3})
                 for k, f in cal.kinds.items()}
    for seed in range(20):
        free = calibrated_return_lags(cal, seed=seed)("all_to_allv", [0, 1, 2], {r: {} for r in range(3)})
        placed = calibrated_return_lags(cal, seed=seed)("all_to_allv", [0, 1, 2],
                                                        {0: {"_leave": 2}, 1: {"_leave": 0}, 2: {"_leave": 1}})
        assert sorted(placed.values()) == pytest.approx(sorted(free.values()))
        assert placed[1] == 0.0 <= placed[2] <= placed[0]
    # the timeline gives each collective's ranks their places (``_leave`` in the entries the lags see)
    seen = {}

    def spy(kind, group, by_rank):
        seen[len(seen)] = {r: e.get("_leave") for r, e in by_rank.items()}
        return {}
    timeline_phases(load_trace(_hand_trace(tmp_path / "tr2")), calibrated_collectives(_cal()), spy)
    assert seen and all(set(v.values()) == {0, 1} for v in seen.values())


def test_async_collectives_use_the_calibration_for_launched_collectives(tmp_path):
    """The hand-made trace's asynchronous all-to-all and all-reduce take the async fit (alpha 2 ms
    and 3 ms instead of 1 and 2); the blocking all-to-alls keep the blocking one."""
    cal = _cal()
    cal.async_kinds = {"all_to_allv": KindFit({2: 2e-3}, 1e-9), "all_reduce": KindFit({2: 3e-3}, 1e-9)}
    tl = timeline_phases(load_trace(_hand_trace(tmp_path / "tr")), calibrated_collectives(cal))
    res = simulate(tl.phases, cal.network())
    end = {p.name: p.end * 1e3 for p in res.phases}
    assert end[tl.nodes[(0, 0)][1]] == pytest.approx(1.0)  # blocking: alpha 1 ms
    assert end[tl.nodes[(0, 2)][1]] == pytest.approx(6.1)  # the last launch returned at 4.1 ms, + 2 ms
    # the all-reduce: rank 1 launches last, at 8.1 ms (2 ms after its wait); + 3 ms + 2 MB at 1 GB/s
    assert end[tl.nodes[(0, 4)][1]] == pytest.approx(13.1)
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.async_kinds == cal.async_kinds and back.latency("all_reduce", 2, async_op=True) == 3e-3
    assert back.latency("all_gather", 2, async_op=True) == back.latency("all_gather", 2)  # no async fit: blocking


def _idle_cal() -> Calibration:
    """Blocking a2a: alpha 1 ms, spread 1 ms, byte factor 1; launched while computing: alpha 3 ms,
    0.5 ms more in company, spread 2 ms, byte factor 2."""
    cal = _cal()
    cal.kinds["all_to_allv"] = KindFit({2: 1e-3}, 1e-9, 1.0, spread_s={2: 1e-3})
    cal.async_kinds = {"all_to_allv": KindFit({2: 3e-3}, 2e-9, 2.0, spread_s={2: 2e-3}, concurrent_s={2: 5e-4})}
    return cal


def test_an_async_collective_its_ranks_wait_idle_for_costs_the_blocking_fit_for_that_share():
    """An asynchronous collective's latency, spread and byte factor mix the blocking fit in by the
    share of its time its ranks wait idle for it: none, the asynchronous fit (company included);
    all, the blocking fit; between, the latency as rates (the harmonic mean weighted by the shares,
    ``RATE_MIX``; the weighted sum without it, or where the launch outlasts the blocking fit), the
    spread and byte factor in proportion. A blocking call, or a kind without an asynchronous fit,
    is not moved; a share outside 0..1 is an error."""
    cal = _idle_cal()
    assert cal.latency("all_to_allv", 2, True) == pytest.approx(3e-3)
    assert cal.latency("all_to_allv", 2, True, idle=1.0) == pytest.approx(1e-3)
    # a quarter idle at 1 ms, three quarters computing at 3 ms: 0.75 T / 3 + 0.25 T / 1 = 1 ms of progress
    assert cal.latency("all_to_allv", 2, True, idle=0.25) == pytest.approx(2e-3)
    assert cal.latency("all_to_allv", 2, True, concurrent=True, idle=0.25) == pytest.approx(
        1 / (0.75 / 3.5e-3 + 0.25 / 1e-3))
    # the blocking share counts from the last call, the launch's time before the collective starts
    assert cal.latency("all_to_allv", 2, True, idle=0.25, launch_s=4e-4) == pytest.approx(1 / (0.75 / 3e-3 + 0.25 / 6e-4))
    assert cal.latency("all_to_allv", 2, True, launch_s=4e-4) == pytest.approx(3e-3)
    assert cal.latency("all_to_allv", 2, True, idle=0.25, launch_s=1.2e-3) == pytest.approx(0.75 * 3e-3 - 0.25 * 2e-4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibrate, "RATE_MIX", False)
        assert cal.latency("all_to_allv", 2, True, idle=0.25) == pytest.approx(0.75 * 3e-3 + 0.25 * 1e-3)
        assert cal.latency("all_to_allv", 2, True, idle=0.25, launch_s=4e-4) == pytest.approx(2.5e-3 - 0.25 * 4e-4)
    assert cal.latency("all_to_allv", 2, False, idle=0.5) == pytest.approx(1e-3)  # blocking: its own fit
    assert cal.latency("all_reduce", 2, True, idle=0.5) == cal.latency("all_reduce", 2)  # no async fit
    assert cal.spread("all_to_allv", 2, True, idle=0.5) == pytest.approx(1.5e-3)
    assert cal.spread("all_to_allv", 2, False, idle=0.5) == pytest.approx(1e-3)

    def bytes_on_fabric(**kw):
        (rnd,) = cal.comm("all_to_allv", [0, 1], np.full((2, 2), 100.0), name="x", async_op=True, **kw).rounds
        return float(np.sum(rnd.nbytes))
    assert bytes_on_fabric() == pytest.approx(400.0)  # 200 B off the diagonal, byte factor 2
    assert bytes_on_fabric(idle=0.5) == pytest.approx(300.0)  # factor 1.5
    assert bytes_on_fabric(idle=1.0) == pytest.approx(200.0)
    with pytest.raises(ValueError, match="idle share 1.5 of a all_to_allv"):
        cal.latency("all_to_allv", 2, True, idle=1.5)
    # the factories read the share from the entries (timeline_phases puts it there)
    e = {r: {"in_msg_size": 8, "dtype": "float", "async": True, "_idle": 1.0} for r in (0, 1)}
    lat, _ = calibrated_collectives(cal)("all_to_allv", [0, 1], e, "a2a", ())[0]
    assert lat.seconds == pytest.approx(1e-3)
    lags = calibrated_return_lags(cal, seed=0)
    draws = [sum(lags("all_to_allv", [0, 1], e).values()) / 2 for _ in range(4000)]
    assert np.mean(draws) == pytest.approx(1e-3, rel=0.08)  # the blocking spread, not the async 2 ms


def test_the_idle_shares_are_the_ranks_own_waits_over_the_collective_and_settle(tmp_path, monkeypatch):
    """The hand-made trace's asynchronous all-to-all starts when rank 1's launch returns (4.1 ms);
    rank 0 already waits for it there, rank 1 from 4.6 ms. With the asynchronous fit's 3 ms it
    ends at 7.1 ms: the ranks wait 3 + 2.5 of its 2 x 3 ms, a share of 11/12. The all-reduce
    joined by the backward counts the ranks' waits at the backward's end; the blocking calls have
    none. The simulation repeats with each pass's shares until they settle: the collective lasts
    D ms, for the share f = 1 - 0.25 / D of which its ranks wait, progressing at 1 / 3 per ms while
    they compute and 1 / 0.9 while they wait (the blocking fit less the 0.1 ms launches; ``RATE_MIX``):
    0.25 / 3 + (D - 0.25) / 0.9 = 1, so D = 0.25 + 0.9 (1 - 0.25 / 3) ms."""
    from neo_train.topology import trace_sim
    from neo_train.topology.trace_sim import idle_shares, simulate_calibrated

    cal = _idle_cal()
    for k in cal.kinds:
        cal.kinds[k] = dataclasses.replace(cal.kinds[k], spread_s={})
    cal.async_kinds = {"all_to_allv": KindFit({2: 3e-3}, 1e-9), "all_reduce": KindFit({2: 2e-3}, 1e-9)}
    traces = load_trace(_hand_trace(tmp_path / "tr"))
    tl = timeline_phases(traces, calibrated_collectives(cal), calibrated_return_lags(cal))
    res = simulate(tl.phases, cal.network())
    end = {p.name: p.end * 1e3 for p in res.phases}
    assert end[tl.nodes[(0, 2)][1]] == pytest.approx(7.1)
    shares = {tl.colls[k][0]["comms"]: v for k, v in idle_shares(tl, res).items()}
    # the all-reduce: from rank 1's launch (7.1 ms) to its end (11.1 ms), waited for at the
    # backward's end from 6.6 and 7.6 ms
    assert shares == pytest.approx({"all_to_allv": 11 / 12, "all_reduce": (4.0 + 3.5) / 8})
    # on a host with fewer cores than ranks only the time both wait at once counts: 4.6 - 7.1 ms of
    # the all-to-all's 3 ms, 7.6 - 11.1 of the all-reduce's 4
    together = {tl.colls[k][0]["comms"]: v for k, v in idle_shares(tl, res, together=True).items()}
    assert together == pytest.approx({"all_to_allv": 2.5 / 3, "all_reduce": 3.5 / 4})
    D = 0.25 + 0.9 * (1 - 0.25 / 3)
    tl, res, passes = simulate_calibrated(traces, cal)  # until no share moves by more than 0.02
    end = {p.name: p.end * 1e3 for p in res.phases}
    assert 3 <= passes < 6
    assert end[tl.nodes[(0, 2)][1]] == end[tl.nodes[(1, 2)][1]] == pytest.approx(4.1 + D, abs=0.05)
    monkeypatch.setattr(trace_sim, "IDLE_TOLERANCE", 1e-9)
    tl, res, passes = simulate_calibrated(traces, cal, passes=60)
    end = {p.name: p.end * 1e3 for p in res.phases}
    assert end[tl.nodes[(0, 2)][1]] == pytest.approx(4.1 + D, abs=1e-6) and passes < 60
    # one pass: the asynchronous fit alone
    tl1, res1, n1 = simulate_calibrated(traces, cal, passes=1)
    assert n1 == 1 and {p.name: p.end for p in res1.phases}[tl1.nodes[(0, 2)][1]] * 1e3 == pytest.approx(7.1)
    # the result's wall time is every pass's (`simulate --trace` prints it)
    runs, real = [], trace_sim.simulate
    monkeypatch.setattr(trace_sim, "simulate", lambda *a, **k: runs.append(real(*a, **k)) or runs[-1])
    tl, res, passes = simulate_calibrated(traces, cal)
    assert len(runs) == passes > 1 and res.wall_seconds == pytest.approx(sum(r.wall_seconds for r in runs))
    assert res.wall_seconds > runs[-1].wall_seconds


def _launch_block_wait(d: Path):
    """Both ranks: an asynchronous all-reduce launched (0.1 ms), 0.5 ms of compute, a blocking
    all-to-all, 0.5 ms of compute, the all-reduce's wait."""
    d.mkdir()
    for r in (0, 1):
        es = [_entry("all_reduce", 1, 0, None, MS // 10, step=0, lead=0, async_op=True, wait=("wait", 2, MS // 2, MS)),
              _entry("all_to_allv", 0, 1, MS // 2, MS, step=0)]
        (d / f"trace_rank{r}.json").write_text(json.dumps(es))
    return load_trace(d)


def test_a_rank_blocked_in_another_call_frees_its_core_for_a_collective_in_flight(tmp_path, monkeypatch):
    """Both ranks launch an asynchronous all-reduce (0.1 ms; it runs 0.1 - 3.1 ms on its 3 ms
    asynchronous fit), compute 0.5 ms, block in an all-to-all (0.6 - 1.6 ms), compute 0.5 ms and
    wait for the all-reduce (2.1 - 3.1 ms). Their own waits give it an idle share of 1/3; the
    blocked millisecond counts ``blocked`` of itself on top (half: 1/2). ``simulate_calibrated``
    counts it with ``BLOCKED_IDLE`` only where the calibration says its host had a core for each
    rank (``Calibration.core_per_rank``: meta's cpus, CPU only)."""
    from neo_train.topology import trace_sim
    from neo_train.topology.trace_sim import BLOCKED_IDLE, idle_shares, simulate_calibrated

    traces = _launch_block_wait(tmp_path / "tr")
    cal = _cal()
    cal.async_kinds = {"all_reduce": KindFit({2: 3e-3}, 1e-9)}
    tl = timeline_phases(traces, calibrated_collectives(cal))
    res = simulate(tl.phases, cal.network())
    end = {p.name: p.end * 1e3 for p in res.phases}
    assert [end[n] for n in tl.nodes[(0, 1)]] == pytest.approx([0.6, 1.6])  # the blocking all-to-all
    assert [end[n] for n in tl.nodes[(0, 2)]] == pytest.approx([2.1, 3.1])  # the wait
    shares = lambda blocked: {tl.colls[k][0]["comms"]: v for k, v in idle_shares(tl, res, blocked).items()}
    assert shares(0.0) == pytest.approx({"all_reduce": 1 / 3})
    assert shares(0.5) == pytest.approx({"all_reduce": 1 / 2})
    assert shares(1.0) == pytest.approx({"all_reduce": 2 / 3})
    # which weight the simulation uses: the calibrated host's cores against its ranks
    seen = []
    real = trace_sim.idle_shares
    monkeypatch.setattr(trace_sim, "idle_shares", lambda t, r, blocked=0.0, together=False:
                        seen.append((blocked, together)) or real(t, r, blocked, together))
    # (and which shares: all the ranks waiting at once where it had fewer cores than ranks, IDLE_TOGETHER)
    for meta, device, want, short in (({}, "cpu", 0.0, False), ({"cpus": 1}, "cpu", 0.0, True),
                                      ({"cpus": 2}, "cpu", BLOCKED_IDLE, False), ({"cpus": 64}, "cuda", 0.0, False),
                                      ({"cpus": 1}, "cuda", 0.0, False)):
        cal.meta, cal.device, seen[:] = meta, device, []
        assert cal.core_per_rank == (want > 0) and cal.cores_short == short
        simulate_calibrated(traces, cal, passes=2)
        assert seen == [(want, short)]
    # and it moves the collective: more of it on the (here faster) blocking fit
    cal.meta, cal.device = {"cpus": 2}, "cpu"
    tl2, res2, _ = simulate_calibrated(traces, cal, passes=2)
    cal.meta = {}
    tl0, res0, _ = simulate_calibrated(traces, cal, passes=2)
    wait_end = lambda t, r: {p.name: p.end for p in r.phases}[t.nodes[(0, 2)][1]]
    assert wait_end(tl2, res2) < wait_end(tl0, res0)


def test_free_core_time_ends_an_all_reduce_starved_while_its_ranks_compute(tmp_path):
    """``simulate_calibrated(free_core=True)``: at a core per rank an asynchronous all-reduce ends
    once its ranks have left it the blocking fit's latency (2 ms, less the 0.1 ms launch) of free
    core time. Both ranks launch it (0 - 0.1 ms), compute 0.5 ms, block in an all-to-all (0.6 -
    1.6 ms: a freed core at half rate, its own transport takes the rest), compute 0.5 ms and wait
    for it (from 2.1 ms: rate 1 until it ends). 0.5 ms of free time by 1.6 ms, 1.4 more from 2.1
    ms: it ends at 3.5 ms, where the asynchronous fit (8 ms) and the blocking one mixed by the idle
    share as a weighted sum end it at 4.1. As rates (``RATE_MIX``, the default) the model itself
    ends it sooner: the idle share's 1.9 ms at the blocking pace less the 1.5 ms computed over it at
    the asynchronous one, 0.1 + 1.5 + 1.9 (1 - 1.5 / 8) = 3.14 ms, so the free core time moves
    nothing there. On by default (``FREE_CORE``; ``free_core=False`` turns it off), and off where the
    host had fewer cores than ranks."""
    from neo_train.topology import trace_sim
    from neo_train.topology.trace_sim import free_core_latency, free_core_times, simulate_calibrated

    traces = _launch_block_wait(tmp_path / "tr")
    cal = _cal()
    cal.async_kinds = {"all_reduce": KindFit({2: 8e-3}, 1e-9)}
    cal.meta = {"cpus": 2}
    tl = timeline_phases(traces, calibrated_collectives(cal))
    res = simulate(tl.phases, cal.network())
    (name, segs), = free_core_times(tl, res).items()
    assert name.startswith("all_reduce")
    assert [s[:2] for s in segs] == [pytest.approx((0.5e-3, 1.5e-3)), (pytest.approx(2e-3), math.inf)]
    assert [s[2] for s in segs] == [0.5, 1.0]
    assert free_core_latency(segs, 1.9e-3) == pytest.approx(3.4e-3)
    assert free_core_latency(segs, 0.3e-3) == pytest.approx(1.1e-3)
    assert free_core_latency(segs, 0.0) == 0.0
    assert free_core_latency(segs[:1], 1.9e-3) == math.inf

    def ends(**kw):
        tl, res, _ = simulate_calibrated(traces, cal, **kw)
        end = {p.name: p.end * 1e3 for p in res.phases}
        return {tl.colls[k][0]["comms"]: end[v] for k, v in tl.comm_end.items()}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trace_sim, "IDLE_TOLERANCE", 1e-9)
        rates = ends(free_core=False, passes=60)
        assert rates == {"all_reduce": pytest.approx(0.1 + 1.5 + 1.9 * (1 - 1.5 / 8), abs=1e-4),
                         "all_to_allv": pytest.approx(1.6)}
        assert ends(passes=60) == pytest.approx(rates)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibrate, "RATE_MIX", False)
        model = ends(free_core=False)
        assert model["all_reduce"] > 4.0 and model["all_to_allv"] == pytest.approx(1.6)
        assert ends() == {"all_reduce": pytest.approx(3.5), "all_to_allv": pytest.approx(1.6)}  # the default
        assert ends(free_core=True) == ends()
        cal.meta = {"cpus": 1}
        assert ends() == ends(free_core=False)


# ---- the command line: errors name the file, rank and field -------------------------------------

def _cli(argv, capsys):
    from neo_train.cli import main

    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _plain_trace(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    e = {"comms": "all_to_allv", "pg_id": 0, "global_ranks": [0, 1], "world_size": 2, "dtype": "float",
         "in_msg_size": 8, "out_msg_size": 8, "in_split": [4, 4], "out_split": [4, 4], "markers": ["input_dist"]}
    for r in (0, 1):
        (d / f"trace_rank{r}.json").write_text(json.dumps([e]))
    return d


def test_simulate_a_trace_without_compute_times(tmp_path, capsys):
    tr = _plain_trace(tmp_path / "tr")
    rc, out, err = _cli(["simulate", "--trace", tr, "--network", "flat"], capsys)
    assert rc == 0 and f"trace {tr / 'trace_rank0.json'}: no recorded compute times" in out, err
    assert "'compute_ns'" in out and "communication only" in out and "input_dist" in out
    rc, out, err = _cli(["simulate", "--trace", tr, "--network", "flat", "--compute", "none"], capsys)
    assert rc == 0, err
    cal = _cal().save(tmp_path / "c.json")
    rc, out, err = _cli(["simulate", "--trace", tr, "--compute", "input_dist=0.001", "--calibration", cal], capsys)
    assert rc == 2 and "--calibration replays the trace's own recorded compute" in err


def test_simulate_with_a_calibration_for_another_machine(tmp_path, capsys):
    tr = _hand_trace(tmp_path / "tr")
    cal = _cal(3).save(tmp_path / "c3.json")
    rc, out, err = _cli(["simulate", "--trace", tr, "--calibration", cal], capsys)
    assert rc == 2 and f"calibration {cal} is for 3 ranks but trace {tr} has 2" in err
    c = _cal()
    c.transport = "nccl"
    rc, out, err = _cli(["simulate", "--trace", tr, "--calibration", c.save(tmp_path / "n.json")], capsys)
    assert rc == 2 and "measured transport 'nccl' but trace" in err and "'gloo'" in err
    (tmp_path / "x.json").write_text("[1")
    rc, out, err = _cli(["simulate", "--trace", tr, "--calibration", tmp_path / "x.json"], capsys)
    assert rc == 2 and f"calibration {tmp_path / 'x.json'}: not valid JSON" in err
    ok = _cal().save(tmp_path / "ok.json")
    rc, out, err = _cli(["simulate", "--trace", tr, "--calibration", ok], capsys)
    assert rc == 0, err
    assert "no steady training steps marked in the trace" in out  # its one step is a warm-up step
    rc, out, err = _cli(["simulate", "--trace", tr, "--calibration", ok, "--warmup-steps", "0"], capsys)
    assert rc == 0, err
    assert "predicted vs measured, 1 steady steps" in out and "cluster: calibrated gloo/cpu, shared fabric" in out
    # the free core rule (on by default): either flag with a calibration only
    for flag in ("--free-core", "--no-free-core"):
        rc, out, err = _cli(["simulate", "--trace", tr, "--calibration", ok, "--warmup-steps", "0", flag], capsys)
        assert rc == 0 and "predicted vs measured, 1 steady steps" in out, err
        rc, out, err = _cli(["simulate", "--trace", tr, "--network", "flat", flag], capsys)
        assert rc == 2 and f"{flag} applies to --calibration" in err
        rc, out, err = _cli(["simulate", "--nodes", "16", flag], capsys)
        assert rc == 2 and f"{flag} applies to --trace only" in err


def test_traces_with_broken_timelines_are_named(tmp_path):
    tr = _hand_trace(tmp_path / "tr")
    entries = json.loads((tr / "trace_rank1.json").read_text())
    del entries[2]["compute_ns"]
    (tr / "trace_rank1.json").write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=r"trace .*trace_rank1.json rank 1 entry 2 \(all_reduce\): field 'compute_ns' is "
                                         r"missing"):
        rank_timelines(load_trace(tr))
    entries[2]["compute_ns"] = 5
    entries[2]["order"] = 1  # collides with the all-to-all's
    (tr / "trace_rank1.json").write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=r"rank 1 entries 1 and 2: two blocking intervals share order 1"):
        rank_timelines(load_trace(tr))
    entries[2]["order"] = "three"
    (tr / "trace_rank1.json").write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=r"rank 1 entry 2 \(all_reduce\): order must be an integer >= 0"):
        load_trace(tr)


def test_calibrate_command_checks_its_flags(tmp_path, capsys):
    rc, out, err = _cli(["calibrate", "--out", tmp_path], capsys)
    assert rc == 2 and f"--out {tmp_path} is a directory" in err
    rc, out, err = _cli(["calibrate", "--out", tmp_path / "no" / "c.json"], capsys)
    assert rc == 2 and "does not exist" in err
    rc, out, err = _cli(["calibrate", "--out", tmp_path / "c.json", "--sizes", "lots"], capsys)
    assert rc == 2 and "--sizes: cannot read 'lots'" in err
    rc, out, err = _cli(["calibrate", "--out", tmp_path / "c.json", "--overlap-ms", "2"], capsys)
    assert rc == 2 and "--overlap-ms applies to a busy calibration: give --busy-ms too" in err


@pytest.mark.slow
def test_benchmark_quick(tmp_path):
    out, png = tmp_path / "v.json", tmp_path / "sv.png"
    keep = tmp_path / "keep"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sim_validation.py"), "--quick",
                           "--calibrations", "idle,busy", "--json", str(out), "--png", str(png), "--keep", str(keep)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.exists() and png.stat().st_size > 10_000
    report = json.loads(out.read_text())
    assert {(r["W"], r["plan"]) for r in report["rows"]} == {(2, "tw"), (4, "twrw")}
    assert report["args"]["batch_size"] == _sim_validation().BATCH_SIZE  # not the preset's 256
    for r in report["rows"]:
        assert r["measured_step_ms"] > 0 and r["predicted_step_ms"] > 0 and math.isfinite(r["step_error"])
        assert r["collectives"] and r["steady_steps"] > 0
    assert set(report["calibrations"]) == {"2:idle", "4:idle", "2:busy:pipelined", "4:busy:pipelined"}
    assert report["calibrations"]["4:busy:pipelined"]["meta"]["groups"] == "tiled"
    assert report["calibrations"]["2:idle"]["format"] == FORMAT
    # the baseline: each case again, the same calibration without return lags
    base = {(r["W"], r["plan"], r["mode"], r["calibration"]): r for r in report["baseline_rows"]}
    for r in report["rows"]:
        b = base[(r["W"], r["plan"], r["mode"], r["calibration"] + ", together")]
        assert b["measured_step_ms"] == r["measured_step_ms"] and b["predicted_step_ms"] > 0
    assert "together" in proc.stdout
    # and without the free core rule, which moves predictions only where the host had a core per rank
    free = {(r["W"], r["plan"], r["mode"], r["calibration"]): r for r in report["no_free_core_rows"]}
    for r in report["rows"]:
        f = free[(r["W"], r["plan"], r["mode"], r["calibration"] + ", no free core")]
        assert f["measured_step_ms"] == r["measured_step_ms"] and f["predicted_step_ms"] > 0
        if r["W"] > (os.cpu_count() or 1):
            assert f["predicted_step_ms"] == r["predicted_step_ms"]
    assert "no free core" in proc.stdout
    # the kept run judged again (--rescore): the same rows, the calibrations refitted from their samples
    assert json.loads((keep / "recorded.json").read_text())["args"]["warmup"] == report["args"]["warmup"]
    again = tmp_path / "again.json"
    assert _sim_validation().main(["--rescore", str(keep), "--json", str(again)]) == 0
    rescored = json.loads(again.read_text())
    key = lambda r: (r["W"], r["plan"], r["mode"], r["calibration"])  # noqa: E731
    assert sorted(map(key, rescored["rows"])) == sorted(map(key, report["rows"]))
    for r in report["rows"]:
        x = next(y for y in rescored["rows"] if key(y) == key(r))
        for k in ("measured_step_mean_ms", "predicted_step_mean_ms", "trainer_step_ms"):
            assert x[k] == pytest.approx(r[k], rel=1e-9), (key(r), k)


def test_benchmark_rejects_a_batch_size_below_one(capsys):
    with pytest.raises(SystemExit) as e:
        _sim_validation().main(["--batch-size", "0", "--worlds", "2"])
    assert e.value.code == 2 and "--batch-size must be >= 1, got 0" in capsys.readouterr().err


def test_benchmark_on_cuda_needs_a_gpu(capsys):
    """``--device cuda`` on a machine without one stops before recording anything, saying why (on a
    GPU machine ``tests/test_gpu.py``'s ``test_sim_validation_on_a_gpu`` runs it)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the benchmark would run")
    with pytest.raises(SystemExit) as e:
        _sim_validation().main(["--device", "cuda", "--quick"])
    assert e.value.code == 2 and "--device cuda: torch sees no CUDA device" in capsys.readouterr().err


def _kept_run(keep: Path, run_trace: Path, recorded: bool) -> Calibration:
    """A run's --keep directory made by hand: the module's recorded W = 2 run as two launches of TW
    pipelined, a busy calibration fitted from synthetic samples (blocking and asynchronous, every
    kind), and, with ``recorded``, the trainer's figures beside them; returns the calibration."""
    keep.mkdir()
    for name in ("w2_tw_pipelined", "w2_tw_pipelined_r1"):
        shutil.copytree(run_trace, keep / name)
    C, alpha = 1e9, {"all_to_allv": 3e-4, "all_reduce": 8e-4, "all_gather": 4e-4, "reduce_scatter": 5e-4}
    sync = [{"kind": k, "group": 2, "bytes": b, "seconds": a + _unit_time(k, 2, b, "shared") / C}
            for k, a in alpha.items() for b in (16, 4096, 1 << 17, 1 << 20)]
    launched = [dict(s, seconds=2 * s["seconds"], **{"async": True}) for s in sync]
    cal = fit_calibration(sync + launched, world_size=2, transport="gloo", device="cpu",
                          meta={"cpu": "a test CPU", "cpus": 1, "busy_s": 1e-3, "overlap_s": {"all_reduce": 2e-3}})
    cal.save(keep / "calibration_w2_busy1.00ms_pipelined.json")
    if recorded:
        cases = [{"W": 2, "plan": "tw", "mode": "pipelined", "repeat": r, "trainer_step_ms": ms, "run_wall_s": 1.0,
                  "load_before": 0.5, "load_after": 0.7} for r, ms in ((0, 10.0), (1, 12.0))]
        (keep / "recorded.json").write_text(json.dumps({"args": {"preset": "tiny", "steps": 4, "warmup": 1},
                                                        "cases": cases}))
    return cal


def test_a_kept_run_is_judged_again_with_this_codes_model(run_trace, tmp_path, capsys):
    """``sim_validation.py --rescore DIR``: a kept run's traces and calibrations, the calibrations
    refitted from their samples, predicted as the run itself would have been (the same rows as
    ``predict`` on each launch, pooled), the trainer's figures read back from recorded.json; the
    report written as a run's. Nothing is recorded or measured."""
    sv = _sim_validation()
    keep = tmp_path / "keep"
    cal = _kept_run(keep, run_trace, recorded=True)
    out = tmp_path / "r.json"
    assert sv.main(["--rescore", str(keep), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "rescored: the run kept in" in printed and "recorded on a test CPU, 1 CPUs" in printed
    report = json.loads(out.read_text())
    assert report["machine"] == {"cpu": "a test CPU", "cpus": 1} and report["args"]["rescored"] == str(keep)
    assert report["args"]["warmup"] == 1 and report["args"]["repeats"] == 2  # the run's own, from recorded.json
    (row,) = report["rows"]
    assert (row["W"], row["plan"], row["mode"], row["calibration"]) == (2, "tw", "pipelined", "busy")
    assert row["trainer_step_ms"] == 11.0 and len(row["repeats"]) == 2
    direct = sv.merge_repeats([{"W": 2, "plan": "tw", "mode": "pipelined", "repeat": r, "trace": str(keep / d),
                                "trainer_step_ms": 0.0, "run_wall_s": 0.0, "load_before": 0.0, "load_after": 0.0}
                               | sv.predict({"trace": str(keep / d), "W": 2}, cal, 1)
                               for r, d in enumerate(("w2_tw_pipelined", "w2_tw_pipelined_r1"))])
    assert row["predicted_step_mean_ms"] == pytest.approx(direct["predicted_step_mean_ms"], rel=1e-9)
    assert row["measured_step_mean_ms"] == pytest.approx(direct["measured_step_mean_ms"], rel=1e-9)
    assert [c["error"] for c in row["collectives"]] == pytest.approx([c["error"] for c in direct["collectives"]])
    assert {r["calibration"] for r in report["baseline_rows"] + report["no_free_core_rows"]} == {
        "busy, together", "busy, no free core"}
    # without recorded.json: the trainer's figures unknown, shown as '-'; the default warm-up
    (keep / "recorded.json").unlink()
    assert sv.main(["--rescore", str(keep), "--json", str(out)]) == 0
    assert re.search(r"\d+/\d+ +- +-- +- ", capsys.readouterr().out)
    row = json.loads(out.read_text())["rows"][0]
    assert math.isnan(row["trainer_step_ms"]) and json.loads(out.read_text())["args"]["warmup"] == 4


@pytest.mark.parametrize("make, args, message", [
    (None, [], "is not a directory"),
    ("empty", [], "no recorded cases in"),
    ("kept", ["--modes", "sideways"], "--modes: unknown mode 'sideways'"),
    ("no calibration", [], "has no calibration for W = 2 pipelined runs"),
    ("bad calibration", [], "calibration_w2_busy1.00ms_pipelined.json"),
    ("bad recorded", [], "recorded.json is not what --keep writes"),
])
def test_rescore_names_what_is_missing(run_trace, tmp_path, capsys, make, args, message):
    keep = tmp_path / "keep"
    if make == "empty":
        keep.mkdir()
    elif make:
        _kept_run(keep, run_trace, recorded=False)
    if make == "no calibration":
        (keep / "calibration_w2_busy1.00ms_pipelined.json").unlink()
    if make == "bad calibration":
        (keep / "calibration_w2_busy1.00ms_pipelined.json").write_text("{not json")
    if make == "bad recorded":
        (keep / "recorded.json").write_text('{"cases": [{"W": 2}]}')
    with pytest.raises(SystemExit) as e:
        _sim_validation().main(["--rescore", str(keep)] + args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def _sim_validation():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sim_validation", ROOT / "benchmarks" / "sim_validation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _report_row(W: int, plan: str, mode: str, calibration: str, measured_ms: float, step_error: float,
                errors: dict[str, float], steady_steps: int = 10) -> dict:
    """A row shaped as sim_validation.main() writes it (``record`` | ``predict``), for ``errors``
    {marker: predicted / measured - 1} of collectives every step runs, and a rare one (metrics)."""
    colls = [{"marker": m, "comms": "all_to_allv", "mode": "async", "n": 2 * steady_steps, "measured_s": 1e-3,
              "predicted_s": 1e-3 * (1 + e), "measured_blocked_s": 0.0, "predicted_blocked_s": 0.0,
              "measured_net_s": None, "predicted_net_s": None, "error": e} for m, e in errors.items()]
    colls.append({"marker": "metrics", "comms": "all_reduce", "mode": "sync", "n": 2, "measured_s": 2e-3,
                  "predicted_s": 1e-3, "measured_blocked_s": 2e-3, "predicted_blocked_s": 1e-3,
                  "measured_net_s": 2e-3, "predicted_net_s": 1e-3, "error": -0.5})  # not every step: left out
    worst = max((abs(e) for e in errors.values()), default=0.0)
    return {"W": W, "plan": plan, "mode": mode, "local_world_size": W, "trace": "/nowhere",
            "trainer_step_ms": measured_ms, "run_wall_s": 1.0, "load_before": 0.5, "load_after": 0.5,
            "calibration": calibration, "busy_s": 0.0, "overlap_s": 0.0, "measured_step_ms": measured_ms,
            "predicted_step_ms": measured_ms * (1 + step_error), "step_error": step_error,
            "measured_step_mean_ms": measured_ms, "predicted_step_mean_ms": measured_ms * (1 + step_error),
            "step_mean_error": step_error, "steady_steps": steady_steps, "collectives": colls,
            "worst_collective_error": worst, "collectives_within_goal": [sum(abs(e) <= 0.25 for e in errors.values()),
                                                                         len(errors)],
            "step_ok": abs(step_error) <= 0.15, "collectives_ok": worst <= 0.25, "sim_wall_s": 0.01, "phases": 100,
            "per_step": []}


def test_benchmark_chart_from_a_report(tmp_path):
    """write_png draws from the report alone, awkward rows included: a case with no collective that
    every step runs, an error of exactly 0, one of +185 % (past the axis), a NaN one, two calibrations;
    a report with no rows still gives a figure."""
    sv = _sim_validation()
    rows = []
    for cal, shift in (("idle", -0.2), ("busy", 0.0)):
        rows += [_report_row(2, "tw", "pipelined", cal, 12.0, shift - 0.05, {"input_dist": 0.0, "output_dist": -0.3}),
                 _report_row(2, "tw", "plain", cal, 14.0, shift + 0.1, {}),
                 _report_row(3, "rw", "pipelined", cal, 20.0, shift, {"input_dist": 1.85, "dense_allreduce": math.nan}),
                 _report_row(4, "twrw", "plain", cal, 35.0, shift - 0.12,
                             {"output_dist_cross": 0.1, "output_dist_intra_bwd": -0.62})]
    report = {"benchmark": "sim_validation", "machine": {"cpu": "test", "cpus": 2},
              "args": {"preset": "small", "batch_size": 256, "steps": 14, "warmup": 4, "iters": 5, "sizes": [16],
                       "quick": True, "judged": "mean"},
              "goals": {"step": 0.15, "collective": 0.25}, "calibrations": {}, "rows": rows, "seconds": 1.0}
    old_file = dict(report, args={k: v for k, v in report["args"].items() if k != "judged"})  # judged medians
    for name, rep in (("both", report), ("busy", dict(report, rows=[r for r in rows if r["calibration"] == "busy"])),
                      ("empty", dict(report, rows=[])), ("medians", old_file)):
        png = tmp_path / f"{name}.png"
        sv.write_png(str(png), json.loads(json.dumps(rep)))  # as read back from --json
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, name
    assert sv.steady_collectives(rows[0]["collectives"], 10) == rows[0]["collectives"][:2]
    # the printout's summary per calibration and W (0: all): steps within 15 %, cases, median step
    # error, collective rows within 25 % of those every step runs (a NaN error is not within), and
    # within it widened by the launches' error (rows from one launch, or files before: the same)
    summary = {(c, W): rest for c, W, *rest in sv.summary_by_world(rows)}
    assert list(summary) == [("idle", 2), ("idle", 3), ("idle", 4), ("idle", 0), ("busy", 2), ("busy", 3),
                             ("busy", 4), ("busy", 0)]
    assert summary[("idle", 2)] == [1, 2, pytest.approx(-0.175), 1, 2, 1]
    assert summary[("idle", 0)] == [1, 4, pytest.approx(-0.225), 2, 6, 2]
    assert summary[("busy", 3)] == [1, 1, pytest.approx(0.0), 0, 2, 0]
    assert summary[("busy", 0)] == [4, 4, pytest.approx(-0.025), 2, 6, 2]
    widened = [dict(rows[0], collectives_within_noise=[2, 2])]  # its -30 % row within the launches' error
    assert [x[5:] for x in sv.summary_by_world(widened)] == [(1, 2, 2), (1, 2, 2)]


def test_trace_duty_gives_the_busy_and_overlap_calibration_times(tmp_path):
    """The hand trace's step 0: compute before each blocking interval (rank 0: 1, 2, 1, 0.5 ms;
    rank 1: 3, 0.5, 2, 0.5) and between each async launch and its wait (rank 0: 2 and 0.5 ms,
    rank 1: 0.5 and 0.5); the blocks outside a step count for neither."""
    from neo_train.topology.trace_input import trace_duties

    gap, overlap, by_kind = trace_duties(load_trace(_hand_trace(tmp_path / "tr")))
    assert gap * 1e3 == pytest.approx(10.5 / 8) and overlap * 1e3 == pytest.approx(3.5 / 4)
    assert trace_duties(load_trace(tmp_path / "tr"), warmup_steps=1) == (0.0, 0.0, {})
    # per kind: the all-to-all (2 and 0.5 ms), the all-reduce joined at the backward's end (0.5, 0.5)
    assert by_kind.keys() == {"all_to_allv", "all_reduce"}
    assert by_kind["all_to_allv"] * 1e3 == pytest.approx(1.25) and by_kind["all_reduce"] * 1e3 == pytest.approx(0.5)


def test_a_case_recorded_twice_pools_its_steps():
    """``merge_repeats``: a case recorded in two launches is judged on the steady steps of both
    together (means and medians over the pool, not a mean of the launches' figures); each
    collective on its mean over every instance of both (and beside it the median of the launches'
    medians; instances summed; a 'net' one launch lacks is the other's); each launch's own figures
    kept under 'repeats'. The goals judge means: a stall the median leaves out fails the step."""
    sv = _sim_validation()

    def recording(rep, meas, pred, coll_med, coll_mean):
        steps = [{"step": i, "measured_s": m, "predicted_s": p, "ranks": 4, "steady": i >= 1}
                 for i, (m, p) in enumerate(zip(meas, pred))]
        colls = [{"marker": "output_dist_cross", "comms": "all_to_allv", "mode": "sync", "n": 8,
                  "measured_s": coll_med[0], "predicted_s": coll_med[1], "measured_mean_s": coll_mean[0],
                  "predicted_mean_s": coll_mean[1], "measured_blocked_s": coll_med[0],
                  "predicted_blocked_s": coll_med[1], "measured_net_s": None if rep else 1e-3,
                  "predicted_net_s": None if rep else 2e-3}]
        base = _report_row(4, "twrw", "plain", "busy", 1.0, 0.0, {})
        return base | {"repeat": rep, "trace": f"/t{rep}", "trainer_step_ms": 10.0 + rep} | sv._verdicts(steps, colls)

    # launch 0 stalls once (40 ms): its median step is right, its mean 25 % over the prediction
    one = recording(0, [9, 10, 10, 40], [9, 12, 12, 12], (1e-3, 1.5e-3), (2e-3, 1.5e-3))
    two = recording(1, [9, 12, 12, 12], [9, 12, 12, 12], (3e-3, 2e-3), (4e-3, 2e-3))
    assert one["step_error"] == pytest.approx(0.2) and one["step_mean_error"] == pytest.approx(12 / 20 - 1)
    assert two["step_ok"] and not one["step_ok"]
    merged = sv.merge_repeats([one, two])
    assert merged["measured_step_ms"] == pytest.approx(12e3) and merged["predicted_step_ms"] == pytest.approx(12e3)
    assert merged["step_error"] == pytest.approx(0.0)  # the median: fine
    assert merged["measured_step_mean_ms"] == pytest.approx(16e3) and merged["step_mean_error"] == pytest.approx(-0.25)
    assert not merged["step_ok"]  # judged on the mean
    assert merged["steady_steps"] == 6 and len(merged["per_step"]) == 8
    assert [s["repeat"] for s in merged["per_step"]] == [0] * 4 + [1] * 4
    (c,) = merged["collectives"]
    assert c["n"] == 16 and c["measured_s"] == pytest.approx(2e-3) and c["predicted_s"] == pytest.approx(1.75e-3)
    assert c["measured_mean_s"] == pytest.approx(3e-3) and c["predicted_mean_s"] == pytest.approx(1.75e-3)
    assert c["error"] == pytest.approx(1.75 / 3 - 1) and c["median_error"] == pytest.approx(-0.125)
    assert c["measured_net_s"] == 1e-3 and c["predicted_net_s"] == 2e-3
    assert merged["collectives_within_goal"] == [0, 1] and not merged["collectives_ok"]
    # the launches measured 2 and 4 ms: their standard error is 1 ms, a third of their mean, so the
    # -42 % is within the goal widened by twice it (the run cannot tell it from the model's error)
    assert c["measured_mean_by_launch_s"] == [2e-3, 4e-3] and c["launch_error"] == pytest.approx(1 / 3)
    assert merged["collectives_within_noise"] == [1, 1]
    assert merged["trainer_step_ms"] == pytest.approx(10.5)
    assert [(r["repeat"], r["trace"], r["step_mean_error"]) for r in merged["repeats"]] == [
        (0, "/t0", pytest.approx(-0.4)), (1, "/t1", pytest.approx(0.0))]
    # one recording: its own figures
    alone = sv.merge_repeats([one])
    assert alone["step_error"] == one["step_error"] and len(alone["repeats"]) == 1
    assert [{k: v for k, v in c.items() if k not in ("measured_mean_by_launch_s", "launch_error")}
            for c in alone["collectives"]] == one["collectives"]
    assert alone["collectives"][0]["launch_error"] is None
    assert alone["collectives_within_noise"] == alone["collectives_within_goal"] == [1, 1]


def test_trace_compute_share_is_the_time_the_ranks_compute(tmp_path):
    """The hand trace's step 0: rank 0 computes 1 + 2 + 1 + 0.5 ms and blocks 0.1 + 1 + 0 + 4.5 ms,
    rank 1 computes 3 + 0.5 + 2 + 0.5 and blocks 0.1 + 0.5 + 0 + 3.5: shares 4.5 / 10.1 and
    6 / 10.1, their mean; no steady step, no share."""
    from neo_train.topology.trace_input import trace_compute_share, trace_duties, trace_load

    traces = load_trace(_hand_trace(tmp_path / "tr"))
    assert trace_compute_share(traces) == pytest.approx((4.5 / 10.1 + 6.0 / 10.1) / 2)
    assert trace_compute_share(traces, warmup_steps=1) == 0.0
    assert trace_load(traces) == (*trace_duties(traces), trace_compute_share(traces))  # one reading, the same figures


def _share_body(comm, busy_s):
    from neo_train.topology.calibrate import measure_collectives

    return measure_collectives(comm, sizes=[16, 4096], kinds=("all_to_allv",), iters=2, busy_s=busy_s,
                               overlap_s=busy_s, concurrent=False)


def test_a_calibration_reports_the_share_of_the_time_its_ranks_computed():
    """Every sample carries the share of the first pass's counted iterations the ranks computed
    (the same on every rank): between 0 and 1 when busy, more with longer bursts between the same
    collectives; 0 when idle (no compute)."""
    from neo_train.testing import run_ranks

    short, short_1 = run_ranks(_share_body, 2, 2e-4)
    long, _ = run_ranks(_share_body, 2, 5e-3)
    idle, _ = run_ranks(_share_body, 2, 0.0)
    assert short == short_1 and len({s["compute_share"] for s in short}) == 1
    assert 0 < short[0]["compute_share"] < long[0]["compute_share"] < 1
    assert {s["compute_share"] for s in idle} == {0.0}
