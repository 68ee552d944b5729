"""Comms traces: what TracingCommunicator records (fields, phases, consistent sizes), the param
basic-trace JSON round trip through load_trace, replay on gloo ranks (native and scheduled), and
malformed traces rejected with errors naming the entry and field."""
import argparse
import json
from pathlib import Path

import pytest
import torch

from neo_train.cli import build_parser
from neo_train.comm.replay import ReplayReport, check_traces, replay, replay_command
from neo_train.comm.trace import TraceError, TracingCommunicator, load_trace
from neo_train.testing import run_ranks

PARAM_KEYS = {"comms", "req", "in_msg_size", "out_msg_size", "dtype", "in_split", "out_split",
              "startTime_ns", "pg_id", "world_size", "global_ranks", "markers"}


def _direct_body(comm, out_dir):
    """Every collective once, straight through the Communicator, uneven and zero sizes."""
    W, r = comm.world_size, comm.rank
    tc = TracingCommunicator(comm, r, W)
    ins = [(r + j) % 3 for j in range(W)]
    outs = [(i + r) % 3 for i in range(W)]
    tc.all_to_all_v(torch.ones(sum(ins), 4), ins, outs, tag="input_dist")
    sizes = [0] + [2] * (W - 1)
    tc.all_gather_v(torch.ones(sizes[r], 3, dtype=torch.int64), sizes, tag="output_dist_bwd")
    tc.reduce_scatter_v(torch.ones(sum(sizes), 3), sizes, tag="output_dist")
    h = tc.all_reduce(torch.ones(5, dtype=torch.float64), op="avg", async_op=True, tag="dense_allreduce")
    fut = tc.all_reduce(torch.ones(2), async_op=True, tag="dense_allreduce").future()
    h.wait()
    fut.wait()
    assert tc.split_sizes(ins, tag="input_dist") == outs
    sub = tc.subgroup([0, W - 1], name="pair")
    if sub is not None:
        sub.all_reduce(torch.ones(3), tag="metrics")
    tc.barrier()
    return str(tc.dump(out_dir))


def test_direct_collectives_are_recorded_in_param_format(tmp_path):
    W = 3
    paths = run_ranks(_direct_body, W, str(tmp_path))
    assert paths == [str(tmp_path / f"trace_rank{r}.json") for r in range(W)]
    raw = json.loads(Path(paths[1]).read_text())
    assert isinstance(raw, list) and all(PARAM_KEYS <= set(e) for e in raw if e["comms"] != "barrier")
    assert {"comms", "req", "pg_id", "world_size", "global_ranks", "markers"} <= set(raw[-1])  # param: no sizes
    comms = [e["comms"] for e in raw]
    assert comms == ["all_to_allv", "all_gather", "reduce_scatter", "all_reduce", "all_reduce", "all_to_allv", "barrier"]
    a2a = raw[0]
    assert a2a["in_split"] == [4 * ((1 + j) % 3) for j in range(W)]  # elements: rows x 4
    assert a2a["out_split"] == [4 * ((i + 1) % 3) for i in range(W)]
    assert a2a["dtype"] == "float" and raw[1]["dtype"] == "long" and raw[3]["dtype"] == "double"
    assert raw[1]["out_split"] == [0, 6, 6] and raw[1]["in_msg_size"] == 6
    assert raw[2]["in_split"] == [0, 6, 6] and raw[2]["out_msg_size"] == 6
    assert raw[3]["reduce_op"] == "avg" and raw[3]["markers"] == ["dense_allreduce"]
    assert all(e["duration_ns"] is not None and e["duration_ns"] > 0 for e in raw)  # async ones too
    # an asynchronous launch records where gloo got the collective (the backend's mark) inside it
    assert [e["comms"] for e in raw if "issue_ns" in e] == ["all_reduce", "all_reduce"]
    assert all(e["async"] and 0 <= e["issue_ns"] <= e["call_ns"] for e in raw if "issue_ns" in e)
    assert [e["req"] for e in raw] == list(range(len(raw)))
    assert all(e["world_size"] == W and e["global_ranks"] == [0, 1, 2] for e in raw)
    # rank 0 also ran the subgroup's all-reduce, on its own process group
    raw0 = json.loads(Path(paths[0]).read_text())
    sub = [e for e in raw0 if e["markers"] == ["metrics"]]
    assert len(sub) == 1 and sub[0]["global_ranks"] == [0, 2] and sub[0]["world_size"] == 2
    assert sub[0]["pg_id"] != raw0[0]["pg_id"]
    # round trip: load_trace keeps every entry and its fields
    for p in paths:
        entries = load_trace(p)
        assert [e["comms"] for e in entries] == [e["comms"] for e in json.loads(Path(p).read_text())]
    check_traces([load_trace(p) for p in paths], paths)


def _train_body(comm, out_dir):
    from neo_train.config import preset
    from neo_train.sharding import ShardingPlan
    from neo_train.train import Trainer

    cfg = preset("tiny")
    cfg = cfg.replace(train=cfg.train.replace(kernel_backend="reference", steps=2))
    tc = TracingCommunicator(comm, comm.rank, comm.world_size)
    t = Trainer(cfg, comm=tc, plan=ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size), progress=False)
    losses = [t.train_step(next(t.train_data), s) for s in range(2)]
    t.global_means(losses)
    return str(tc.dump(out_dir))


@pytest.fixture(scope="module")
def train_traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    return run_ranks(_train_body, 2, str(out))


def test_a_training_step_is_traced_with_its_phases(train_traces):
    for p in train_traces:
        entries = load_trace(p)
        phases = {e["markers"][0] for e in entries}
        assert {"input_dist", "output_dist", "output_dist_bwd", "dense_allreduce", "metrics"} <= phases, phases
        for e in entries:
            if e["comms"] == "all_to_allv":
                assert sum(e["in_split"]) == e["in_msg_size"] and sum(e["out_split"]) == e["out_msg_size"]
        assert all(0 <= e["issue_ns"] <= e["call_ns"] for e in entries if e.get("async"))
        dense = [e for e in entries if e["markers"] == ["dense_allreduce"]]
        assert dense and all(e["comms"] == "all_reduce" and e["duration_ns"] for e in dense)
        # DDP's buckets go over a group of their own
        assert {e["pg_id"] for e in dense}.isdisjoint({e["pg_id"] for e in entries if e["markers"] == ["output_dist"]})
    groups = check_traces([load_trace(p) for p in train_traces], train_traces)
    assert all(ranks == [0, 1] for ranks in groups.values())


def test_a_training_trace_simulates_with_its_own_markers(train_traces, capsys):
    """`neo-train simulate --trace` on a 2-rank training trace: the cluster follows the trace (2 ranks
    on a topology of 8 GPUs per node used to fail), --compute takes the trace's own markers, and a
    marker it lacks (the README's fwd/bwd) is an error listing those it has, not silently ignored."""
    from neo_train.topology.study import add_simulate_arguments, simulate_command
    from neo_train.topology.trace_input import load_trace as load_for_sim
    from neo_train.topology.trace_input import trace_markers, trace_phases

    trace_dir = Path(train_traces[0]).parent
    traces = load_for_sim(trace_dir)
    markers = trace_markers(traces)
    assert {"input_dist", "output_dist", "output_dist_bwd", "dense_allreduce", "metrics"} <= set(markers), markers
    with pytest.raises(ValueError, match=r"^compute: the trace has no phase marker\(s\) 'fwd', 'bwd'; its markers are "
                                         r".*input_dist.*output_dist_bwd"):
        trace_phases(traces, 2, {"fwd": 0.01, "bwd": 0.02})

    parser = argparse.ArgumentParser()
    add_simulate_arguments(parser)
    bad = parser.parse_args(["--trace", str(trace_dir), "--network", "fattree", "--compute", "fwd=0.01,bwd=0.02"])
    with pytest.raises(ValueError, match=r"^--compute: the trace has no phase marker\(s\) 'fwd', 'bwd'"):
        simulate_command(bad)
    secs = {"output_dist": 0.002, "output_dist_bwd": 0.01, "dense_allreduce": 0.005}
    args = parser.parse_args(["--trace", str(trace_dir), "--network", "fattree", "--compute",
                              ",".join(f"{k}={v}" for k, v in secs.items())])
    assert simulate_command(args) == 0
    out = capsys.readouterr().out
    assert "trace: 2 ranks on 1 node(s) of 2 GPUs" in out
    phases = trace_phases(traces, 2, secs)
    runs = [p.name.split(":")[1] for p in phases if p.name.startswith("compute:")]
    expected = sum(secs.get(m, 0.0) for m in runs)
    assert expected > 0 and sum(p.seconds for p in phases if p.name.startswith("compute:")) == pytest.approx(expected)


def _replay_body(comm, paths, rules):
    from neo_train.comm.schedules import TopologyHint

    return replay(paths, comm, rules, hint=TopologyHint(local_world_size=1), iters=2).to_dict()


@pytest.mark.parametrize("rules", ["", "all_to_all_v:bruck, all_reduce:ring, all_gather_v:dps, reduce_scatter_v:ring"])
def test_replay_runs_and_reports_next_to_the_recording(train_traces, rules):
    res = run_ranks(_replay_body, 2, train_traces, rules)
    for r, rep in enumerate(res):
        entries = load_trace(train_traces[r])
        assert len(rep["rows"]) == len(entries)
        for row, e in zip(rep["rows"], entries):
            assert row["comms"] == e["comms"] and row["replayed_us"] > 0
            assert row["recorded_us"] == pytest.approx(e["duration_ns"] / 1e3)
        algs = {row["algorithm"] for row in rep["rows"]}
        assert algs == {"native"} if not rules else {"bruck", "ring", "dps"} <= algs
        if rules:
            a2a = {row["algorithm"] for row in rep["rows"] if row["comms"] == "all_to_allv"}
            assert a2a == {"bruck"}
        assert "input_dist" in rep["by_phase"]
    text = ReplayReport(0, "", []).table()
    assert "total" in text


def test_replay_command_spawns_local_ranks(train_traces, tmp_path, capsys):
    out = tmp_path / "report.json"
    args = build_parser().parse_args(["replay", str(Path(train_traces[0]).parent), "--rules", "all_to_all_v:pairwise",
                                      "--iters", "1", "--json", str(out), "--per-op"])
    assert replay_command(args) == 0
    text = capsys.readouterr().out
    assert "replay of rank 0's trace, rules: all_to_all_v:pairwise" in text and "input_dist" in text
    reports = json.loads(out.read_text())
    assert [r["rank"] for r in reports] == [0, 1]


# ---- malformed traces -----------------------------------------------------------------------------
GOOD = {
    "comms": "all_to_allv", "req": 0, "pg_id": 0, "global_ranks": [0, 1], "world_size": 2,
    "in_msg_size": 6, "out_msg_size": 4, "dtype": "float", "in_split": [2, 4], "out_split": [2, 2],
    "startTime_ns": 1, "duration_ns": 5, "markers": ["input_dist"],
}


def _write(tmp_path, entries, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(entries))
    return p


@pytest.mark.parametrize(
    "change, message",
    [
        ({"in_msg_size": None}, r"entry 1 \(all_to_allv\): missing field 'in_msg_size'"),
        ({"in_split": [2, 3]}, r"entry 1 \(all_to_allv\): field 'in_split' sums to 5, 'in_msg_size' is 6"),
        ({"out_split": [2, 2, 0]}, r"entry 1 \(all_to_allv\): field 'out_split' has 3 entries for a world size of 2"),
        ({"world_size": 3}, r"entry 1 \(all_to_allv\): field 'world_size' is 3 but 'global_ranks' lists 2 ranks"),
        ({"comms": "alltoall_magic"}, r"entry 1: field 'comms' = 'alltoall_magic' is not a collective"),
        ({"dtype": "float7"}, r"entry 1 \(all_to_allv\): field 'dtype': unknown dtype 'float7'"),
        ({"in_msg_size": -6}, r"entry 1 \(all_to_allv\): field 'in_msg_size' must be an integer >= 0"),
        ({"global_ranks": [0, 2], "world_size": 2}, r"entry 1 \(all_to_allv\): field 'global_ranks' \[0, 2\] of process group 0 differs"),
        ({"comms": None}, r"entry 1: missing field 'comms'"),
    ],
)
def test_malformed_entries_are_named(tmp_path, change, message):
    bad = dict(GOOD)
    for k, v in change.items():
        if v is None:
            bad.pop(k)
        else:
            bad[k] = v
    with pytest.raises(TraceError, match=message):
        load_trace(_write(tmp_path, [GOOD, bad]))


def test_malformed_files_are_named(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        load_trace(p)
    with pytest.raises(TraceError, match="expected a JSON list"):
        load_trace(_write(tmp_path, {"entries": []}))
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "missing.json")
    ag = {**GOOD, "comms": "all_gather", "in_msg_size": 3, "out_msg_size": 5, "out_split": [2, 3], "in_split": [], "group_rank": 0}
    with pytest.raises(TraceError, match=r"entry 0 \(all_gather\): field 'in_msg_size' is 3, 'out_split'\[0\] says 2"):
        load_trace(_write(tmp_path, [ag]))
    # param spellings load: 'allreduce' -> all_reduce, groupRanks / markerStack aliases
    ar = {"comms": "allreduce", "world_size": 2, "groupRanks": [0, 1], "in_msg_size": 4, "out_msg_size": 4,
          "dtype": "Float", "markerStack": ["dense"]}
    (e,) = load_trace(_write(tmp_path, [ar]))
    assert e["comms"] == "all_reduce" and e["global_ranks"] == [0, 1] and e["markers"] == ["dense"]


def test_traces_that_disagree_between_ranks_are_named(tmp_path):
    r0 = _write(tmp_path, [GOOD], "a.json")
    r1 = _write(tmp_path, [{**GOOD, "in_msg_size": 4, "in_split": [4, 0], "out_split": [4, 2], "out_msg_size": 6}], "b.json")
    with pytest.raises(TraceError, match=r"b.json: entry 0 \(all_to_allv, #0 on group 0\): field 'in_split'\[0\] = 4, but .*a.json entry 0 expects 2"):
        check_traces([load_trace(r0), load_trace(r1)], [str(r0), str(r1)])
    r1 = _write(tmp_path, [{**GOOD, "comms": "all_reduce", "in_msg_size": 4, "out_msg_size": 4}], "c.json")
    with pytest.raises(TraceError, match=r"c.json: entry 0 \(all_reduce, #0 on group 0\): rank 0 has all_to_allv"):
        check_traces([load_trace(r0), load_trace(r1)], [str(r0), str(r1)])
    with pytest.raises(TraceError, match="different numbers of collectives"):
        check_traces([load_trace(r0), []], [str(r0), "empty"])


# ---- `neo-train replay` with malformed traces: one line from the launcher, before any rank starts --
PAIR = {**GOOD, "in_msg_size": 8, "out_msg_size": 8, "in_split": [4, 4], "out_split": [4, 4]}


def _replay_cli(argv, capsys):
    from neo_train.cli import main

    rc = main(["replay", *map(str, argv)])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in out + err, (rc, out, err)
    assert lines[0].startswith(("neo-train: error: ", "neo-train replay: error: ")), (out, err)  # ours / argparse's
    assert "replay of rank" not in out, (out, err)
    return lines[0]


@pytest.mark.parametrize("entry0, what", [
    ({**PAIR, "in_msg_size": -8, "in_split": [-4, -4]}, "(all_to_allv): field 'in_msg_size' must be an integer >= 0, got -8"),
    ({**PAIR, "in_split": [-4, 12]}, "(all_to_allv): field 'in_split' must be a list of non-negative integers, got [-4, 12]"),
    (5, ": expected an object, got 5"),
    ({**PAIR, "dtype": "float7"}, "(all_to_allv): field 'dtype': unknown dtype 'float7'"),
    ({**PAIR, "comms": "all_to_some"}, ": field 'comms' = 'all_to_some' is not a collective we replay"),
])
def test_replay_command_names_the_malformed_entry(tmp_path, capsys, entry0, what, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    d = tmp_path / "tr"
    d.mkdir()
    _write(d, [entry0], "trace_rank0.json")
    _write(d, [PAIR], "trace_rank1.json")
    line = _replay_cli([d], capsys)
    assert line.startswith(f"neo-train: error: {d / 'trace_rank0.json'}: entry 0") and what in line, line


def test_replay_command_checks_its_flags_before_starting_ranks(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    d = tmp_path / "tr"
    d.mkdir()
    for r in range(2):
        _write(d, [PAIR], f"trace_rank{r}.json")
    line = _replay_cli([d, "--json", tmp_path], capsys)
    assert line == f"neo-train: error: --json {tmp_path} is a directory; give a file path"
    line = _replay_cli([d, "--json", tmp_path / "missing" / "r.json"], capsys)
    assert line == f"neo-train: error: --json {tmp_path / 'missing' / 'r.json'}: directory {tmp_path / 'missing'} does not exist"
    line = _replay_cli([d, "--bulk-threshold", "lots"], capsys)
    assert line == "neo-train: error: --bulk-threshold: cannot read size 'lots' (e.g. 0, 65536, 64KB, 15MB)"
    line = _replay_cli([d / "trace_rank0.json", d], capsys)
    assert line.startswith(f"neo-train: error: {d} is a directory: give one directory of trace_rank*.json files")
    line = _replay_cli([d, "--timeout-s", "nan"], capsys)
    assert "argument --timeout-s" in line and "finite number > 0" in line


# ---- a CUDA trace times the device (CudaClock), read at dump --------------------------------------

class _Device:
    """A stand-in for a GPU: a stream clock (ms) the test and the fake collectives move, and events
    that read it when recorded, as CUDA events do when the stream reaches them."""

    def __init__(self) -> None:
        self.ms = 0.0

    def event(self):
        dev = self

        class Event:
            def record(self):
                self.ms = dev.ms

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return end.ms - self.ms
        return Event()


class _StreamComm:
    """One rank whose collectives return at once on the host (as NCCL's are enqueued), while the
    device's stream stands at each for ``stand_ms`` (a blocking call) or at its wait."""

    rank, world_size, device = 0, 1, torch.device("cpu")

    def __init__(self, dev: _Device, stand_ms: float) -> None:
        self.dev, self.stand_ms = dev, stand_ms

    def _do(self, x, async_op):
        from neo_train.comm.interface import Handle, mark_issue

        mark_issue()  # as a backend does: a host instant, which a device trace must not mix in
        if not async_op:
            self.dev.ms += self.stand_ms
            return x

        def wait():
            self.dev.ms += self.stand_ms
            return x

        def future():
            fut = torch.futures.Future()
            fut.set_result(x)
            return fut
        return Handle(wait, _future=future)

    def all_to_all_v(self, x, in_splits, out_splits, *, async_op=False, tag=""):
        return self._do(x, async_op)

    def all_reduce(self, x, op="sum", *, async_op=False, tag=""):
        return self._do(x, async_op)

    def all_gather_v(self, x, sizes, *, async_op=False, tag=""):
        return self._do(x, async_op)

    def barrier(self):
        pass

    def subgroup(self, ranks, name="sub"):
        return None


def test_a_cuda_trace_records_the_devices_times_not_the_hosts(tmp_path):
    from neo_train.comm.trace import CudaClock
    from neo_train.topology.trace_input import rank_timelines

    dev = _Device()
    tc = TracingCommunicator(_StreamComm(dev, stand_ms=2.0), clock=CudaClock(dev.event))
    dev.ms = 1.0
    tc.trace_step(0)
    dev.ms = 3.0  # 2 ms of kernels into the step
    tc.all_to_all_v(torch.ones(4, 2), [4], [4], tag="input_dist")  # the stream stands 2 ms: to 5
    dev.ms += 1.0  # 6
    h = tc.all_reduce(torch.ones(3), async_op=True, tag="dense_allreduce")  # launched: the stream goes on
    dev.ms += 4.0  # 10
    h.wait()  # the stream stands 2 ms: to 12
    dev.ms += 0.5  # 12.5
    fut = tc.all_reduce(torch.ones(3), async_op=True, tag="dense_allreduce").future()  # DDP's bucket
    dev.ms += 3.0  # 15.5: the backward's kernels
    t_begin = tc.recorder.now()
    dev.ms += 1.5  # DDP's finalisation waits for the bucket: to 17
    tc.recorder.join_futures(t_begin, tc.recorder.now())
    fut.wait()
    tc.trace_step(None)
    # the host did none of this: its perf_counter would have given microseconds everywhere
    e = load_trace(tc.dump(tmp_path))
    ms = 1_000_000
    assert [x["clock"] for x in e] == ["cuda"] * 3
    assert not any("issue_ns" in x for x in e)
    assert (e[0]["compute_ns"], e[0]["step_start_ns"], e[0]["call_ns"], e[0]["duration_ns"]) == (None, 2 * ms, 2 * ms, 2 * ms)
    assert (e[1]["compute_ns"], e[1]["call_ns"]) == (1 * ms, 0)
    assert (e[1]["wait_compute_ns"], e[1]["wait_ns"], e[1]["duration_ns"]) == (4 * ms, 2 * ms, 6 * ms)
    assert (e[2]["compute_ns"], e[2]["call_ns"], e[2]["joined_by"]) == (ms // 2, 0, "backward")
    assert (e[2]["wait_compute_ns"], e[2]["wait_ns"], e[2]["duration_ns"]) == (3 * ms, 3 * ms // 2, 9 * ms // 2)
    assert "_t0" not in e[2]
    assert tc.entries[1]["wait_ns"] == 2 * ms  # read on access too
    blocks, _ = rank_timelines({0: e})
    assert [b.compute for b in blocks[0]] == pytest.approx([0, 1e-3, 4e-3, 0.5e-3, 3e-3])
    assert [b.blocked for b in blocks[0]] == pytest.approx([2e-3, 0, 2e-3, 0, 1.5e-3])


def test_a_long_cuda_trace_reads_its_times_without_recursion(tmp_path):
    """The end of the last blocking interval is a maximum over all before it: a chain as long as
    the trace, read at dump without recursion (10,000 calls)."""
    from neo_train.comm.trace import CudaClock

    dev = _Device()
    tc = TracingCommunicator(_StreamComm(dev, stand_ms=0.25), clock=CudaClock(dev.event))
    x = torch.ones(1)
    for _ in range(10_000):
        dev.ms += 0.75
        tc.all_reduce(x, tag="metrics")
    e = load_trace(tc.dump(tmp_path))
    assert len(e) == 10_000 and e[0]["compute_ns"] is None
    assert {x["compute_ns"] for x in e[1:]} == {750_000} and {x["call_ns"] for x in e} == {250_000}


def test_a_trace_clock_must_be_host_or_an_available_cuda():
    comm = _StreamComm(_Device(), 1.0)
    with pytest.raises(ValueError, match="clock must be 'host' or 'cuda', got 'gpu'"):
        TracingCommunicator(comm, clock="gpu")
    assert TracingCommunicator(comm).recorder.clock is None  # a CPU communicator: host time
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="clock 'cuda' needs a CUDA device"):
            TracingCommunicator(comm, clock="cuda")
