"""The flow simulator against hand-computed times, aggregated against per-flow simulation, trace
input, the Model-A workload, and speed."""
import argparse
import dataclasses
import json
import math
import re
import time

import numpy as np
import pytest

from neo_train.topology.collectives import (
    all_to_all,
    dps_all_reduce,
    hierarchical_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    uniform_matrix,
)
from neo_train.topology.fattree import FatTree
from neo_train.topology.flat import FlatNetwork
from neo_train.topology.flows import max_min_rates
from neo_train.topology.network import GBPS
from neo_train.topology.opera import OperaNetwork
from neo_train.topology.simulator import Comm, Compute, Transfer, simulate

B = 100 * GBPS


def one(name, src, dst, nbytes, after=()):
    return Comm(name, (Transfer(src, dst, nbytes),), after)


# ---- hand-computed cases -------------------------------------------------------------------------

def test_one_flow_on_an_idle_link():
    r = simulate([one("x", [0], [1], [1e9])], FlatNetwork(2, B, hop_latency=1e-6))
    assert math.isclose(r.total, 1e9 / B + 2e-6)  # bytes / B + two hops of latency
    r = simulate([one("x", [0], [4], [1e9])], FatTree(16, B, hop_latency=1e-6))
    assert math.isclose(r.total, 1e9 / B + 6e-6)  # across pods: six links


def test_two_flows_sharing_a_link_get_half_each():
    net = FlatNetwork(3, B, hop_latency=0.0)
    r = simulate([one("a", [0], [1], [1e9]), one("b", [0], [2], [0.5e9])], net)
    # both at B/2 until b is done (0.5e9 / (B/2)), then a alone at B for its last 0.5e9
    assert math.isclose(r.phase("b").end, 1e9 / B)
    assert math.isclose(r.phase("a").end, 1.5e9 / B)


def test_max_min_textbook_case():
    # links: 0 (cap 1), 1 (cap 2); flow 0 on link 0, flow 1 on both, flow 2 on link 1
    rate, res = max_min_rates(3, np.array([0, 1, 1, 2]), np.array([0, 0, 1, 1]), np.ones(4), np.array([1.0, 2.0]))
    assert np.allclose(rate, [0.5, 0.5, 1.5]) and np.allclose(res, 0)
    # a bundle of 2 members on one link of capacity 1: each member gets 1/2
    rate, _ = max_min_rates(1, np.array([0]), np.array([0]), np.array([2.0]), np.array([1.0]))
    assert np.allclose(rate, [0.5])
    # a flow on a link of capacity 0 gets nothing, and does not hold the others back
    rate, _ = max_min_rates(2, np.array([0, 0, 1]), np.array([0, 1, 1]), np.ones(3), np.array([0.0, 4.0]))
    assert np.allclose(rate, [0.0, 4.0])


def test_compute_overlaps_independent_communication():
    net = FlatNetwork(2, B, hop_latency=0.0)
    comm = one("c", [0], [1], [0.5 * B])  # 0.5 s
    r = simulate([Compute("k", 1.0), comm], net)
    assert math.isclose(r.total, 1.0) and math.isclose(r.phase("c").end, 0.5)
    r = simulate([Compute("k", 1.0), one("c", [0], [1], [0.5 * B], after=("k",))], net)
    assert math.isclose(r.total, 1.5)
    assert math.isclose(r.busy_time("compute"), 1.0)


def test_lower_bounds_match_the_formulas():
    N, S = 16, 1.6e9
    net = FatTree(N, B, hop_latency=1e-6)
    bound = 2 * (N - 1) / N * S / B
    for build in (ring_all_reduce, dps_all_reduce):
        r = simulate([build(N, S, name="ar")], net)
        p = r.phase("ar")
        assert math.isclose(p.lower_bound, bound)
        assert bound <= p.duration <= bound * 1.01 + 2 * (N - 1) * 6e-6
    M = uniform_matrix(N, 1e6)
    M[3, :] *= 2  # host 3 sends twice as much
    M[3, 3] = 0
    p = simulate([all_to_all(M, name="a2a")], net).phase("a2a")
    assert math.isclose(p.lower_bound, 2e6 * (N - 1) / B)  # bytes the busiest host sends / B
    assert p.duration >= p.lower_bound


def test_ring_all_reduce_on_opera_is_bounded_below_and_within_a_factor():
    net = OperaNetwork(8, 2, 4, host_bandwidth=B, tries=2, bulk_threshold=0, rotorlb="fluid")
    N, S = net.hosts, 64e6
    p = simulate([ring_all_reduce(N, S, name="ar")], net).phase("ar")
    bound = 2 * (N - 1) / N * S / B
    assert math.isclose(p.lower_bound, bound)
    # each of the 2(N-1) steps may wait for a circuit / the VLB intermediate: at most ~T_c/(u+1) each
    assert bound <= p.duration <= bound + 2 * (N - 1) * (net.vlb_delay + 5e-6) + 1e-3


def test_a_direct_only_opera_flow_waits_for_its_circuit():
    net = OperaNetwork(8, 1, 4, host_bandwidth=B, hop_latency=0.0, vlb=False, bulk_threshold=0, tries=2)
    for a in range(8):
        for c in range(8):
            start, end = net.up_window(a, c)
            if a != c and 0 < start < end:  # down at t = 0, up later in the first cycle
                r = simulate([one("x", [a], [c], [1e3])], net)
                assert math.isclose(r.total, start + 1e3 / B, rel_tol=1e-9)
                return
    pytest.fail("no rack pair whose circuit is down at t = 0")


def test_vlb_does_not_wait_for_the_circuit():
    kw = dict(host_bandwidth=B, hop_latency=0.0, bulk_threshold=0, tries=2)
    direct, vlb = OperaNetwork(8, 1, 4, vlb=False, **kw), OperaNetwork(8, 1, 4, vlb=True, **kw)
    a, c = next((a, c) for a in range(8) for c in range(8) if a != c and 0 < direct.up_window(a, c)[0])
    t_direct = simulate([one("x", [a], [c], [1e6])], direct).total
    t_vlb = simulate([one("x", [a], [c], [1e6])], vlb).total
    assert t_vlb < t_direct
    assert t_vlb >= 1e6 / B  # still NIC-bound


# ---- aggregation and fast-forward against the plain simulation -----------------------------------

def _mixed_schedule(N: int, owners: np.ndarray, parts: str = "abcdef") -> list:
    M = np.zeros((N, N))
    M[owners, :] = 3e6
    np.fill_diagonal(M, 1e6)
    phases = {
        "a": Compute("k", 2e-4),
        "b": all_to_all(M, name="a2a"),
        "c": ring_all_reduce(N, 32e6, name="ring", after=("k",)),
        "d": dps_all_reduce(N, 32e6, name="dps", after=("a2a",) if "b" in parts else ()),
        "e": hierarchical_all_reduce(N, 8e6, devices_per_host=4, name="hier", after=("ring",) if "c" in parts else ()),
        "f": ring_all_gather(N, 8e6, name="ag", after=("k",)),
    }
    return [phases[k] for k in parts]


OPERA_BULK = OperaNetwork(8, 4, 4, host_bandwidth=B, devices_per_host=4, bulk_threshold=0, tries=2)
OPERA_LOWLAT = OperaNetwork(8, 4, 4, host_bandwidth=B, devices_per_host=4, bulk_threshold=2.5e6, tries=2)
OPERA_STATIC = OperaNetwork(4, 4, 4, host_bandwidth=B, devices_per_host=4, bulk_threshold=0)


@pytest.mark.parametrize("net,parts", [
    (FatTree(16, B, devices_per_host=4), "abcdef"),
    (FlatNetwork(16, B, devices_per_host=4), "abcdef"),
    (OPERA_BULK, "abd"), (OPERA_BULK, "abce"), (OPERA_LOWLAT, "abd"), (OPERA_STATIC, "abdf"),
], ids=["fattree", "flat", "opera-a2a-dps", "opera-a2a-rings", "opera-lowlat", "opera-static"])
def test_aggregated_bundles_match_per_flow_simulation(net, parts):
    """Exact where the bundles' members are symmetric: static networks, and on Opera collectives
    whose hosts play alike parts, or are classed apart (a ring's hosts by their place in it)."""
    N = net.hosts
    sched = _mixed_schedule(N, np.arange(0, N, 2) if isinstance(net, FatTree) else np.arange(N), parts)
    agg = simulate(sched, net, aggregate=True, fast_forward=False)
    flows = simulate(sched, net, aggregate=False, fast_forward=False)
    assert agg.stats["bundles_max"] < flows.stats["bundles_max"]
    for p, q in zip(agg.phases, flows.phases):
        assert math.isclose(p.end, q.end, rel_tol=1e-6), (p.name, p.end, q.end)


@pytest.mark.parametrize("net", [OPERA_BULK, OPERA_STATIC], ids=["opera", "opera-static"])
def test_aggregated_bundles_close_when_different_collectives_overlap(net):
    """A ring beside an all-to-all leaves a rack's hosts unlike (one sends off-rack): hosts are
    classed by their part in each collective, not by their neighbours' (a finer split would undo
    the aggregation), so a bundle's members may differ a little and share the slowest one's rate."""
    N = net.hosts
    sched = _mixed_schedule(N, np.arange(N))
    agg = simulate(sched, net, aggregate=True, fast_forward=False)
    flows = simulate(sched, net, aggregate=False, fast_forward=False)
    for p, q in zip(agg.phases, flows.phases):
        assert math.isclose(p.end, q.end, rel_tol=0.03), (p.name, p.end, q.end)


def test_fast_forward_matches_epoch_by_epoch():
    net = OperaNetwork(16, 2, 4, host_bandwidth=B, bulk_threshold=0, tries=2)
    N = net.hosts
    sched = [all_to_all(uniform_matrix(N, 2e6), name="a2a"), dps_all_reduce(N, 200e6, name="ar")]
    slow = simulate(sched, net, fast_forward=False)
    fast = simulate(sched, net, fast_forward=True)
    assert fast.stats["ff_cycles"] > 0 and fast.stats["steps"] < slow.stats["steps"]
    for p, q in zip(fast.phases, slow.phases):
        assert math.isclose(p.end, q.end, rel_tol=1e-6)


# ---- schedule validation ---------------------------------------------------------------------------

def test_schedule_errors():
    net = FlatNetwork(2)
    with pytest.raises(ValueError, match="unknown phase"):
        simulate([Compute("a", 1, ("zz",))], net)
    with pytest.raises(ValueError, match="cycle"):
        simulate([Compute("a", 1, ("b",)), Compute("b", 1, ("a",))], net)
    with pytest.raises(ValueError, match="duplicate"):
        simulate([Compute("a", 1), Compute("a", 1)], net)
    with pytest.raises(ValueError, match="names host 5 but flat has 2 hosts"):
        simulate([one("x", [0], [5], [1.0])], net)
    with pytest.raises(ValueError, match=">= 0"):
        Transfer([0], [1], [-1.0])


# ---- trace input -----------------------------------------------------------------------------------

def test_param_trace_runs(tmp_path):
    # 4 ranks, 2 GPUs per host: an all-to-all-v forward and an all-reduce backward, as param writes them
    W, G = 4, 2
    splits = [[0, 100, 200, 300], [100, 0, 200, 300], [100, 200, 0, 300], [100, 200, 300, 0]]
    for r in range(W):
        entries = [
            {"comms": "all_to_allv", "seqnum": 0, "req": 0, "pg_id": 0, "world_size": W, "dtype": "Float",
             "in_msg_size": sum(splits[r]), "out_msg_size": sum(s[r] for s in splits),
             "in_split": splits[r], "out_split": [s[r] for s in splits], "startTime_ns": 1000 + r,
             "markers": ["forward"], "global_ranks": list(range(W))},
            {"comms": "wait", "req": 0, "startTime_ns": 2000},
            {"comms": "all_reduce", "seqnum": 1, "req": 1, "pg_id": 0, "world_size": W, "dtype": "Float",
             "in_msg_size": 1_000_000, "out_msg_size": 1_000_000, "in_split": [], "out_split": [],
             "startTime_ns": 5000 + r, "markers": ["backward"]},
        ]
        (tmp_path / f"rank{r}.json").write_text(json.dumps(entries))
    from neo_train.topology.trace_input import load_trace, trace_phases

    traces = load_trace(tmp_path)
    assert sorted(traces) == [0, 1, 2, 3]
    phases = trace_phases(traces, G, {"forward": 1e-3, "backward": 2e-3})
    kinds = [getattr(p, "collective", "compute") for p in phases]
    assert kinds == ["compute", "all_to_all", "compute", "all_reduce"]
    net = FlatNetwork(2, B, devices_per_host=G, hop_latency=0.0)
    r = simulate(phases, net)
    a2a = r.phases[1]
    cross = sum(splits[i][j] for i in range(W) for j in range(W) if i // G != j // G) * 4
    assert math.isclose(a2a.network_bytes, cross)
    assert r.total >= 3e-3 + 2 * 4e6 / 2 / B
    # the CLI path
    from neo_train.topology.study import add_simulate_arguments, simulate_command

    p = argparse.ArgumentParser()
    add_simulate_arguments(p)
    args = p.parse_args(["--trace", str(tmp_path), "--nodes", "2", "--gpus-per-node", "2", "--network", "flat",
                         "--compute", "forward=0.001,backward=0.002", "--out", str(tmp_path / "out")])
    assert simulate_command(args) == 0
    assert (tmp_path / "out" / "timeline.csv").exists()


# ---- the Model-A workload ----------------------------------------------------------------------------

def test_model_a_iteration_and_byte_shares():
    from neo_train.planning.cost_model import dense_params
    from neo_train.topology.study import cluster_for, run_iteration
    from neo_train.topology.workload import IterationSpec, build_iteration, opera_model_a

    model = opera_model_a()
    assert dense_params(model) == 702_975_376  # 19 + 19 Linears of 3375, the first top one 83,375 wide
    cluster = cluster_for("opera_study", 16)
    it = build_iteration(IterationSpec(model, cluster, allreduce="ring"))
    dense = sum(it.compute[k] for k in ("bottom_fwd", "top_fwd", "top_bwd", "bottom_bwd"))
    assert math.isclose(dense, float(it.estimate.phases["dense_compute"].max()))
    # pooled embeddings: 524,288 samples x 1000 tables x 80 x 4 bytes each way; 15/16 leave the host
    assert math.isclose(it.network_bytes["all_to_all"], 2 * 524_288 * 1000 * 80 * 4 * 15 / 16)
    # ring all-reduce of 4 * P bytes: 2 (N-1) S over all hosts
    assert math.isclose(it.network_bytes["all_reduce"], 2 * 15 * 4 * 702_975_376, rel_tol=1e-9)
    res, row = run_iteration(model, cluster, "fattree", "ring")
    assert row["iteration_s"] == res.total > 0
    assert 0 < row["allreduce_share"] < 0.5  # at 16 nodes the all-to-all dominates


def test_model_a_at_128_nodes_is_fast():
    from neo_train.topology.study import cluster_for, model_for, run_iteration

    model, cluster = model_for("opera_model_a"), cluster_for("opera_study", 128)
    t = time.perf_counter()
    _, ft = run_iteration(model, cluster, "fattree", "ring")
    _, op = run_iteration(model, cluster, "opera", "dps")
    assert time.perf_counter() - t < 15
    assert op["allreduce_share"] > 0.5  # at 128 nodes the all-reduce dominates the bytes
    assert ft["iteration_s"] > 0 and op["iteration_s"] > 0


@pytest.mark.slow
def test_model_a_at_1024_nodes_under_a_minute():
    from neo_train.topology.study import cluster_for, model_for, run_iteration

    model, cluster = model_for("opera_model_a"), cluster_for("opera_study", 1024)
    t = time.perf_counter()
    _, row = run_iteration(model, cluster, "opera", "dps")
    assert time.perf_counter() - t < 60
    assert row["allreduce_share"] > 0.9


def _traced_step(comm, out):
    import torch

    from neo_train.comm.trace import TracingCommunicator

    tc = TracingCommunicator(comm)
    W = tc.world_size
    tc.all_to_all_v(torch.ones(W * 1000), [1000] * W, [1000] * W, tag="fwd")
    tc.all_reduce(torch.ones(5000), tag="bwd")
    tc.dump(out)
    return 0


def test_trace_recorded_by_neo_train_comm_trace(tmp_path):
    """The tracer's files (trace_rank{r}.json) simulate as they are."""
    pytest.importorskip("neo_train.comm.trace")
    from neo_train.testing import run_ranks
    from neo_train.topology.trace_input import load_trace, trace_phases

    run_ranks(_traced_step, 4, str(tmp_path), local_world_size=2)
    phases = trace_phases(load_trace(tmp_path), 2, {"fwd": 1e-3})
    r = simulate(phases, FlatNetwork(2, B, devices_per_host=2, hop_latency=0.0))
    a2a, ar = r.phases[1], r.phases[3]
    assert (a2a.kind, ar.kind) == ("all_to_all", "all_reduce")
    assert math.isclose(a2a.network_bytes, 2 * 2 * 2 * 1000 * 4)  # 2 ranks x 2 peers off-host x 2 hosts
    assert math.isclose(ar.network_bytes, 2 * 5000 * 4)  # ring over 2 hosts: 2 (N-1) S


def _small_trace(path, W=4):
    """A W-rank trace as neo_train's tracer writes it (trace_rank{r}.json, its phase markers)."""
    for r in range(W):
        entries = [
            {"comms": "all_to_allv", "req": 0, "seqnum": 0, "pg_id": 0, "global_ranks": list(range(W)), "world_size": W,
             "in_msg_size": 1000 * W, "out_msg_size": 1000 * W, "dtype": "float", "in_split": [1000] * W,
             "out_split": [1000] * W, "startTime_ns": 1000 + r, "markers": ["output_dist"]},
            {"comms": "all_reduce", "req": 1, "seqnum": 0, "pg_id": 1, "global_ranks": list(range(W)), "world_size": W,
             "in_msg_size": 5000, "out_msg_size": 5000, "dtype": "float", "in_split": [], "out_split": [],
             "startTime_ns": 5000 + r, "markers": ["dense_allreduce"]},
        ]
        (path / f"trace_rank{r}.json").write_text(json.dumps(entries))
    return path


def _simulate_args(*argv):
    from neo_train.topology.study import add_simulate_arguments

    p = argparse.ArgumentParser()
    add_simulate_arguments(p)
    return p.parse_args([str(a) for a in argv])


@pytest.mark.parametrize("network, nodes", [("fattree", 1), ("flat", 1), ("opera", 16)])
def test_a_trace_smaller_than_a_node_simulates(tmp_path, capsys, network, nodes):
    """A 4-rank trace on the 8-GPU default topology used to fail ('world size 4 is not a positive
    multiple of the 8 devices per host'): the cluster now follows the trace."""
    from neo_train.topology.study import simulate_command

    _small_trace(tmp_path)
    args = _simulate_args("--trace", tmp_path, "--network", network,
                          "--compute", "output_dist=0.001,dense_allreduce=0.002", "--out", tmp_path / "out")
    assert simulate_command(args) == 0
    assert "trace: 4 ranks on 1 node(s) of 4 GPUs (GPUs per node derived from the trace" in capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["nodes"] == nodes  # the nodes the ranks fill; Opera: its smallest study layout
    assert summary["compute_s"] == pytest.approx(0.003)


def test_trace_cluster_shape_rules_and_errors():
    from neo_train.topology.trace_sim import trace_cluster_shape

    assert trace_cluster_shape(4, 8) == (1, 4)  # fewer ranks than a node's GPUs: one node of them
    assert trace_cluster_shape(16, 8) == (2, 8)  # a multiple: the topology's nodes
    assert trace_cluster_shape(12, 8) == (2, 6)  # else the largest divisor up to the topology's
    assert trace_cluster_shape(4, 8, network="opera") == (16, 4)
    assert trace_cluster_shape(4, 8, nodes=16) == (16, 4)  # --nodes: the network's size
    assert trace_cluster_shape(4, 8, gpus_per_node=1) == (4, 1)
    assert trace_cluster_shape(4, 8, nodes=2, gpus_per_node=2) == (2, 2)
    with pytest.raises(ValueError, match=r"^--gpus-per-node 8 does not divide the trace's world size 4 "):
        trace_cluster_shape(4, 8, gpus_per_node=8)
    with pytest.raises(ValueError, match=r"^--nodes 1 is too few for the trace: its 4 ranks at --gpus-per-node 2 "
                                         r"need 2 "):
        trace_cluster_shape(4, 8, nodes=1, gpus_per_node=2)
    with pytest.raises(ValueError, match=r"^--nodes 1 is too few .* 16 ranks at 8 GPUs per node \(derived"):
        trace_cluster_shape(16, 8, nodes=1)


def test_simulate_trace_errors_are_one_line(tmp_path):
    """Inconsistent explicit flags and --compute markers the trace lacks: `neo-train: error: ...`, exit 2."""
    import subprocess
    import sys

    _small_trace(tmp_path)
    base = [sys.executable, "-m", "neo_train", "simulate", "--trace", str(tmp_path), "--network", "fattree"]
    for extra, message in [
        (["--gpus-per-node", "8"], "neo-train: error: --gpus-per-node 8 does not divide the trace's world size 4"),
        (["--compute", "fwd=0.01,bwd=0.02"], "neo-train: error: --compute: the trace has no phase marker(s) 'fwd', "
                                             "'bwd'; its markers are output_dist, dense_allreduce"),
    ]:
        r = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), (extra, r.stderr)


def test_simulate_command_writes_timeline(tmp_path, capsys):
    from neo_train.topology.study import add_simulate_arguments, simulate_command

    p = argparse.ArgumentParser()
    add_simulate_arguments(p)
    args = p.parse_args(["--nodes", "16", "--network", "opera", "--allreduce", "dps", "--tables", "100",
                         "--out", str(tmp_path)])
    assert simulate_command(args) == 0
    text = capsys.readouterr().out
    assert "bound ms" in text and "all-reduce" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["network"] == "opera" and summary["allreduce"] == "dps" and summary["tables"] == 100
    assert summary["fwd_a2a_s"] >= summary["fwd_a2a_bound_s"] > 0


@pytest.mark.slow
def test_opera_study_quick(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "opera_study.py"
    spec = importlib.util.spec_from_file_location("opera_study", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t = time.perf_counter()
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    assert time.perf_counter() - t < 60
    for f in ("strong_scaling.csv", "table_sweep.csv", "byte_shares.csv", "summary.md", "strong_scaling.png",
              "byte_shares.png", "table_sweep.png"):
        assert (tmp_path / f).exists(), f


def test_sub_resolution_completions_still_make_progress():
    """A transfer that completes in less than the float resolution of the simulated clock used
    to loop forever (t + dt == t): the event loop must always make progress."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "neo_train", "simulate", "--nodes", "8", "--network", "fattree",
                        "--nic-gbps", "1e12"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "bytes on the network per iteration" in r.stdout


# ---- malformed traces and flags: one-line errors naming the file, rank, entry and field ----------

def _a2a(**over):
    e = {"comms": "all_to_allv", "in_msg_size": 8, "out_msg_size": 8, "in_split": [4, 4], "out_split": [4, 4],
         "dtype": "float", "world_size": 2, "pg_id": 0, "global_ranks": [0, 1], "startTime_ns": 1000,
         "markers": ["fwd"]}
    e.update(over)
    return e


def _two_ranks(path, entry0):
    """rank0.json with ``entry0`` first, rank1.json a good entry."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "rank0.json").write_text(json.dumps([entry0]))
    (path / "rank1.json").write_text(json.dumps([_a2a()]))
    return path


def _cli_error(argv, capsys):
    """``neo-train ARGV`` in this process: exit code 2 and exactly one stderr line, returned."""
    from neo_train.cli import main

    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in out + err, (rc, out, err)
    assert lines[0].startswith("neo-train: error: "), lines
    return out, lines[0]


_SIM = ["simulate", "--nodes", "2", "--gpus-per-node", "1", "--network", "flat", "--trace"]


@pytest.mark.parametrize("entry0, what", [
    (_a2a(in_msg_size=-8, in_split=[]), "(all_to_allv): in_msg_size must be an integer >= 0, got -8"),
    (_a2a(in_split=[-4, 12]), "(all_to_allv): in_split must be non-negative integers, got [-4, 12]"),
    (_a2a(in_split="44"), "(all_to_allv): in_split must be a list of non-negative integers, got '44'"),
    (_a2a(in_split=[8], out_split=[8]), "(all_to_allv): in_split has 1 entries for a group of 2 ranks"),
    (_a2a(in_msg_size=8.5, in_split=[]), "in_msg_size must be an integer >= 0, got 8.5"),
    (_a2a(global_ranks=[0, -1]), "global_ranks must be non-negative integers, got [0, -1]"),
    (_a2a(pg_id=[1]), "pg_id must be an integer, got [1]"),
    (_a2a(startTime_ns="soon"), "startTime_ns must be a number, got 'soon'"),
    (5, ": expected an object, got 5"),
    (_a2a(dtype="float7"), "(all_to_allv): unknown dtype 'float7' (known: bf16, "),
    (_a2a(comms="all_to_some"), ": unsupported collective 'all_to_some'"),
    ({"comms": "send", "in_msg_size": 4, "dtype": "float"}, "(send): a send needs its dst_rank"),
])
def test_malformed_trace_entries_are_named(tmp_path, capsys, entry0, what):
    d = _two_ranks(tmp_path / "tr", entry0)
    from neo_train.topology.trace_input import load_trace, trace_phases

    with pytest.raises(ValueError) as e:
        load_trace(d)
    assert str(e.value).startswith(f"trace {d / 'rank0.json'} rank 0 entry 0") and what in str(e.value), e.value
    # the same check on a trace built in memory (no file to name)
    traces = {0: [entry0], 1: [_a2a()]}
    with pytest.raises(ValueError) as e:
        trace_phases(traces, 1)
    assert str(e.value).startswith("trace rank 0 entry 0") and what in str(e.value), e.value
    # and from the CLI, before anything is simulated
    out, line = _cli_error([*_SIM, d], capsys)
    assert line == f"neo-train: error: {e.value}".replace("trace rank 0", f"trace {d / 'rank0.json'} rank 0")
    assert "cluster:" not in out


def test_malformed_trace_files_are_named(tmp_path):
    from neo_train.topology.trace_input import load_trace

    p = tmp_path / "t.json"
    for data, message in [
        ({"zero": [_a2a()]}, "key 'zero' is not a rank number"),
        ({"0": 5}, "rank 0: expected a JSON list of entries, got the number 5"),
        ("entries", "expected a list of entries or an object of per-rank lists, got a string"),
        ({}, "holds no ranks"),
    ]:
        p.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=f"^trace {re.escape(str(p))}.*{re.escape(message)}"):
            load_trace(p)
    p.write_bytes(b"\xff\xfe[")
    with pytest.raises(ValueError, match="not valid JSON: not UTF-8 text"):
        load_trace(p)


@pytest.mark.parametrize("spec, what", [
    ("fwd=fast", "--compute: fwd='fast' is not a number of seconds"),
    ("fwd=-1", "--compute: fwd=-1: seconds must be >= 0, got -1"),
    ("fwd=inf", "--compute: fwd=inf: seconds must be a finite number, got inf"),
    ("fwd=nan", "--compute: fwd=nan: seconds must be a finite number, got nan"),
    ("fwd", "--compute: expected marker=seconds, got 'fwd'"),
])
def test_compute_seconds_must_be_numbers(tmp_path, capsys, spec, what):
    d = _two_ranks(tmp_path / "tr", _a2a())
    _, line = _cli_error([*_SIM, d, "--compute", spec], capsys)
    assert line == f"neo-train: error: {what}"


def test_simulate_out_that_is_a_file_is_refused_before_simulating(tmp_path, capsys):
    d = _two_ranks(tmp_path / "tr", _a2a())
    f = tmp_path / "f"
    f.write_text("x")
    out, line = _cli_error([*_SIM, d, "--out", f], capsys)
    assert line == f"neo-train: error: --out {f} is not a directory (a file is there); give a directory path"
    assert "cluster:" not in out and f.read_text() == "x"
    out, line = _cli_error([*_SIM, d, "--out", f / "sub"], capsys)
    assert line == f"neo-train: error: --out {f / 'sub'} lies under {f}, which is a file, not a directory"
    # a directory to be made is fine
    from neo_train.cli import main

    assert main([str(a) for a in [*_SIM, d, "--compute", "fwd=0.001", "--out", tmp_path / "new" / "sim"]]) == 0
    assert (tmp_path / "new" / "sim" / "summary.json").is_file()


# ---- a plan handed from above (issue 15: the workload does not have to run the planner) --------------
def test_handed_plan_is_simulated_as_given():
    from neo_train.planning.plan import ShardingPlan
    from neo_train.topology.study import cluster_for
    from neo_train.topology.workload import IterationSpec, build_iteration, node_round_robin_plan, opera_model_a

    model = opera_model_a(tables=24, rows=1000, layers=3, width=64)
    cluster = cluster_for("opera_study", 4, gpus_per_node=2)
    by_rr = build_iteration(IterationSpec(model, cluster, 4096, placement="round_robin"))
    rr = node_round_robin_plan(model, 4, 2)
    handed = build_iteration(IterationSpec(model, cluster, 4096, plan=ShardingPlan.from_json(rr.to_json())))
    assert handed.plan == by_rr.plan == rr
    assert handed.network_bytes == by_rr.network_bytes and handed.compute == by_rr.compute
    # a different plan (everything on node 0) is what gets simulated: the node-0 GPUs own every table
    skewed = ShardingPlan(8, 2, tuple(dataclasses.replace(tp, shards=(dataclasses.replace(tp.shards[0], rank=i % 2),))
                                      for i, tp in enumerate(rr.tables)))
    it = build_iteration(IterationSpec(model, cluster, 4096, placement="round_robin", plan=skewed))
    assert it.plan == skewed and it.compute != by_rr.compute
    with pytest.raises(ValueError, match="plan is for world size 8, but the job has 16 ranks"):
        IterationSpec(model, cluster_for("opera_study", 8, gpus_per_node=2), 4096, plan=rr)
    with pytest.raises(ValueError, match=r"plan does not place table\(s\) 't23'$"):
        IterationSpec(model, cluster, 4096, plan=ShardingPlan(8, 2, rr.tables[:-1]))


def test_simulate_plan_file(tmp_path, capsys):
    from neo_train.cli import main
    from neo_train.topology.workload import node_round_robin_plan, opera_model_a

    rr = node_round_robin_plan(opera_model_a(tables=16), 2, 8)
    rr.to_json(str(tmp_path / "plan.json"))
    base = ["simulate", "--nodes", "2", "--tables", "16", "--network", "fattree", "--global-batch", "4096"]
    assert main([*base, "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--placement", "round_robin", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a["iteration_s"] == b["iteration_s"] > 0
    _, line = _cli_error([*base, "--plan", tmp_path / "plan.json", "--placement", "planner"], capsys)
    assert "--plan places the tables itself: --placement" in line
    (tmp_path / "bad.json").write_text("{")
    _, line = _cli_error([*base, "--plan", tmp_path / "bad.json"], capsys)
    assert f"--plan {tmp_path / 'bad.json'}: not a readable sharding plan" in line
    _, line = _cli_error(["simulate", "--nodes", "4", "--tables", "16", "--plan", tmp_path / "plan.json"], capsys)
    assert "plan is for world size 16, but the job has 32 ranks" in line
    _, line = _cli_error([*base, "--calibration", tmp_path / "cal.json", "--warmup-steps", "2"], capsys)
    assert "--calibration, --warmup-steps apply to --trace only" in line


def test_schedule_checks_name_cycles_and_deep_chains():
    net = FlatNetwork(2, 100 * GBPS)
    with pytest.raises(ValueError, match=r"dependency cycle b -> d -> c -> b"):
        simulate([Compute("a", 1.0), Compute("b", 1.0, after=("a", "d")), Compute("c", 1.0, after=("b",)),
                  Compute("d", 1.0, after=("c",))], net)
    with pytest.raises(ValueError, match=r"dependency cycle a -> a"):
        simulate([Compute("a", 1.0, after=("a",))], net)
    with pytest.raises(ValueError, match=r"duplicate phase names \['x'\]"):
        simulate([Compute("x", 1.0), Compute("y", 1.0), Compute("x", 2.0)], net)
    with pytest.raises(ValueError, match=r"phase 'y' waits for unknown phase\(s\) \['z'\]"):
        simulate([Compute("y", 1.0, after=("z",))], net)
    # a chain deeper than the recursion limit (a long recorded trace's per-rank chain) is fine
    n = 5000
    chain = [Compute("c0", 1e-3)] + [Compute(f"c{i}", 1e-3, after=(f"c{i - 1}",)) for i in range(1, n)]
    assert simulate(chain, net).total == pytest.approx(n * 1e-3)


def test_opera_rack_layout_for_other_node_counts_comes_from_the_command_line(capsys):
    """Opera off the study's 16 / 128 / 1024 nodes needs k, the ToR ports: the error says how to
    give it, and ``--opera-option k=K`` gives it (racks of k/2 hosts); ``--preset`` names the model
    as in train and plan."""
    from neo_train.cli import main

    _, line = _cli_error(["simulate", "--preset", "tiny", "--nodes", "4"], capsys)
    assert "no preset for 4 nodes" in line and "--opera-option k=K" in line
    assert main(["simulate", "--preset", "tiny", "--nodes", "4", "--opera-option", "k=4"]) == 0
    assert "opera: 2 racks x 2 hosts x 8 devices, u = 2 rotors" in capsys.readouterr().out
