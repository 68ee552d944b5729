"""``--compat flexflow`` (neo_train/topology/flexflow.py): the ISI study's FlexFlow + htsim setup.

Small configurations with hand-computed expectations: the node-serial chain sums the busiest node's
tasks, tables go round-robin by node, all-to-all elements are 8 bytes, the byte shares follow the
closed form (and the study's 0.118 / 0.517 / 0.896), the fat-tree charges the TCP round latency
once per dependent round, and bad input is a one-line error.
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from neo_train.topology.collectives import dps_all_reduce, ring_all_reduce
from neo_train.topology.fattree import FatTree
from neo_train.topology.flexflow import (FlexFlowCompat, build_flexflow_iteration, parse_opera_options,
                                         run_flexflow_iteration)
from neo_train.topology.networks import cluster_for, make_network
from neo_train.topology.simulator import simulate
from neo_train.topology.workload import opera_model_a

B, L, D = 64, 10, 8  # global batch, ids per bag, dim of the small models below
C_PS = 1e6  # picoseconds per looked-up value: a table takes 1e-6 * 64 * 10 * 8 = 5.12 ms
T_TABLE = C_PS * 1e-12 * B * L * D


def _cluster(nodes: int, **kw):
    # one GPU per node, dense compute free: only the tables' time is on the chain
    return cluster_for("opera_study", nodes, 1, device_flops=1e30, **kw)


def _small(tables: int, layers: int = 2, width: int = 1):
    return opera_model_a(tables, rows=100, dim=D, bag=L, layers=layers, width=width)


def test_node_serial_chain_is_the_busiest_nodes_tables():
    # 5 tables on 2 nodes round-robin: node 0 holds tables 0, 2, 4, node 1 tables 1, 3
    cc = FlexFlowCompat(table_ps_per_value=C_PS, round_latency=0.0)
    it = build_flexflow_iteration(_small(5), _cluster(2), "ring", B, cc)
    assert it.slots == 3 and math.isclose(it.table_seconds, T_TABLE)
    assert math.isclose(it.compute["emb_fwd"], 3 * T_TABLE / 3) and math.isclose(it.compute["emb_bwd"], 3 * T_TABLE * 2 / 3)
    names = [p.name for p in it.phases]
    assert "emb_fwd_2" in names and "emb_fwd_3" not in names
    # a 1000 Gbps NIC makes the all-to-all (2 KB a flow) and the all-reduce vanish beside 15 ms
    res, row = run_flexflow_iteration(_small(5), _cluster(2, inter_node_bandwidth=1e14), "flat", "ring",
                                      global_batch=B, compat=cc)
    assert row["iteration_s"] == pytest.approx(3 * T_TABLE, rel=0.01)
    # node-serial: the embedding backward starts after the forward chain, one task after another
    fwd_end = res.phase("emb_fwd_2").end
    assert res.phase("emb_bwd_0").start >= fwd_end
    assert res.phase("emb_bwd_1").start == pytest.approx(res.phase("emb_bwd_0").end)


def test_node_serial_chain_waits_for_the_gradients():
    # one table per node: its backward waits for the gradient all-to-all, which a slow NIC makes long
    cc = FlexFlowCompat(table_ps_per_value=C_PS, round_latency=0.0)
    cl = _cluster(2, inter_node_bandwidth=1e6)  # 1 MB/s: the 2 KB gradient takes 2 ms
    res, _ = run_flexflow_iteration(_small(2), cl, "flat", "ring", global_batch=B, compat=cc)
    a2a = res.phase("a2a_bwd_0")  # beside the (tiny) all-reduce's bytes
    assert (B // 2) * D * 8 / 1e6 < a2a.duration < 1.1 * (B // 2) * D * 8 / 1e6
    assert res.phase("emb_bwd_0").start == pytest.approx(a2a.end)


def test_round_robin_placement_and_8_byte_elements():
    # 7 tables on 3 nodes: slots {0,1,2}, {3,4,5}, {6}; the last slot's all-to-all comes from node 0 only
    it = build_flexflow_iteration(_small(7), _cluster(3), "ring", 3 * B, FlexFlowCompat())
    assert it.slots == 3
    comm = {p.name: p for p in it.phases}
    last = comm["a2a_fwd_2"].rounds[0]
    assert set(last.src.tolist()) == {0} and sorted(last.dst.tolist()) == [1, 2]
    assert np.all(last.nbytes == B * D * 8)  # (global batch / nodes) samples x dim x 8 bytes
    first = comm["a2a_fwd_0"].rounds[0]
    assert sorted(zip(first.src.tolist(), first.dst.tolist())) == [(i, j) for i in range(3) for j in range(3) if i != j]
    bwd = comm["a2a_bwd_2"].rounds[0]  # the gradients go back to the owner
    assert set(bwd.dst.tolist()) == {0} and sorted(bwd.src.tolist()) == [1, 2]
    assert it.network_bytes["all_to_all"] == 2 * 7 * (3 * B) * D * 8 * 2 / 3


@pytest.mark.parametrize("nodes,study", [(16, 0.118), (128, 0.517)])
def test_model_a_byte_shares_closed_form(nodes, study):
    from neo_train.planning.cost_model import dense_params

    model = opera_model_a()
    P, T, Bg, Dm, N = dense_params(model), 1000, 524_288, 80, nodes
    for ar in ("ring", "dps"):
        it = build_flexflow_iteration(model, cluster_for("opera_study", N), ar, Bg, FlexFlowCompat())
        a2a = 2 * T * Bg * Dm * 8 * (N - 1) / N
        allr = 2 * (N - 1) * 4 * P
        assert it.network_bytes["all_to_all"] == pytest.approx(a2a, rel=1e-12)
        assert it.network_bytes["all_reduce"] == pytest.approx(allr, rel=1e-9)
        share = allr / (a2a + allr)
        assert it.network_bytes["all_reduce"] / sum(it.network_bytes.values()) == pytest.approx(share, rel=1e-9)
        assert abs(share - study) < 0.001
    assert it.slots == -(-1000 // N) and it.dense_params == P


def test_round_latency_once_per_dependent_round():
    S, N, lat, hop = 4e3, 4, 50e-6, 1e-6  # bytes small enough that latency is all there is
    net = FatTree(N, hop_latency=hop, routing="ecmp", flow_latency=lat)
    bare = FatTree(N, hop_latency=hop, routing="ecmp")
    for coll, rounds in ((ring_all_reduce, 2 * (N - 1)), (dps_all_reduce, 2)):
        with_lat = simulate([coll(N, S, name="ar")], net).total
        without = simulate([coll(N, S, name="ar")], bare).total
        assert with_lat - without == pytest.approx(rounds * lat, rel=1e-6)
    assert "50 us per flow" in net.describe()
    # make_network passes it to the fat-tree only
    assert make_network("fattree", cluster_for("opera_study", 4), flow_latency=lat).flow_latency == lat
    with pytest.raises(ValueError, match="flow_latency applies to the fat-tree"):
        make_network("flat", cluster_for("opera_study", 4), flow_latency=lat)


def test_compat_charges_the_round_latency_on_the_fattree_ring():
    # tables and bytes are free: the forward all-to-all's round, then the all-reduce's rounds (the
    # gradient all-to-all's one round runs beside them): ring 1 + 2(N-1), DPS 1 + 2 latencies
    cc = FlexFlowCompat(table_ps_per_value=1e-3, round_latency=1e-3)
    cl = cluster_for("opera_study", 4, 1, device_flops=1e30, inter_node_bandwidth=1e14)
    ring = run_flexflow_iteration(_small(4), cl, "fattree", "ring", global_batch=4 * B, compat=cc)[1]
    dps = run_flexflow_iteration(_small(4), cl, "fattree", "dps", global_batch=4 * B, compat=cc)[1]
    assert ring["iteration_s"] == pytest.approx((1 + 2 * 3) * 1e-3, rel=0.01)
    assert dps["iteration_s"] == pytest.approx((1 + 2) * 1e-3, rel=0.01)
    assert ring["network"] == "fattree-ecmp"


def test_grouped_all_reduces_match_one_per_layer():
    # the default one-per-run-of-equal-layers against FlexFlow's one per layer, ring and DPS
    model = opera_model_a(32, rows=100, dim=16, bag=10, layers=5, width=256)
    cl = cluster_for("opera_study", 8, 1, inter_node_bandwidth=1e9)
    for ar in ("ring", "dps"):
        t = {}
        for per in ("group", "layer"):
            cc = FlexFlowCompat(table_ps_per_value=10.0, round_latency=20e-6, allreduce_per=per)
            res, row = run_flexflow_iteration(model, cl, "fattree", ar, global_batch=8 * 256, compat=cc)
            t[per] = row["iteration_s"]
            if per == "group":  # the 3 middle top Linears (256 x 256) and the 4 bottom ones share one each
                assert {p.name for p in res.phases if p.kind == "all_reduce"} == {"ar_top_5", "ar_top_4-2", "ar_top_1",
                                                                                 "ar_bot_4-1"}
        assert t["group"] == pytest.approx(t["layer"], rel=0.01)


def test_table_time_scales_with_batch_bag_and_dim():
    cc = FlexFlowCompat(table_ps_per_value=114.0)
    assert cc.table_seconds(524_288, 100, 80) == pytest.approx(114e-12 * 524_288 * 100 * 80)
    assert cc.table_seconds(1_048_576, 100, 40) == pytest.approx(cc.table_seconds(524_288, 100, 80))


@pytest.mark.parametrize("kw,what", [
    (dict(table_ps_per_value=0.0), "table_ps_per_value"), (dict(table_ps_per_value=float("nan")), "table_ps_per_value"),
    (dict(round_latency=-1e-6), "round_latency"), (dict(round_latency=2.0), "round_latency"),
    (dict(table_fwd_share=1.0), "table_fwd_share"), (dict(wire_bytes=3), "wire_bytes"),
    (dict(routing="random"), "routing"), (dict(allreduce_per="tensor"), "allreduce_per"),
    (dict(opera_options=(("a", 1), ("a", 2))), "opera option"),
])
def test_knobs_out_of_range(kw, what):
    with pytest.raises(ValueError, match=what):
        FlexFlowCompat(**kw)


def test_bad_compat_inputs():
    with pytest.raises(ValueError, match="unknown compat mode 'tensorflow'"):
        FlexFlowCompat.named("tensorflow")
    with pytest.raises(ValueError, match="allreduce must be one of"):
        build_flexflow_iteration(_small(4), _cluster(2), "hier_ring", B)
    with pytest.raises(ValueError, match="only concatenates"):
        build_flexflow_iteration(_small(4).replace(interaction="dcn"), _cluster(2), "ring", B)
    with pytest.raises(ValueError, match="multiple of the world size"):
        build_flexflow_iteration(_small(4), _cluster(2), "ring", B + 1)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_opera_options(["rotorlb"])
    assert parse_opera_options(["rotorlb=slotted", "vlb=false", "tries=3", "reconfig-delay=2e-5"]) == (
        ("rotorlb", "slotted"), ("vlb", False), ("tries", 3), ("reconfig_delay", 2e-5))
    with pytest.raises(ValueError, match="given for a fattree network"):
        run_flexflow_iteration(_small(4), _cluster(2), "fattree", "ring", global_batch=B,
                               compat=FlexFlowCompat(opera_options=(("tries", 2),)))


def test_opera_options_pass_through():
    cl = cluster_for("opera_study", 16)
    base = make_network("opera", cl)
    slow = make_network("opera", cl, opera_options={"reconfig_delay": 30e-6})
    assert slow.superslice == pytest.approx(base.superslice + 20e-6)
    with pytest.raises(ValueError, match="bogus"):
        make_network("opera", cl, opera_options={"bogus": 1})
    with pytest.raises(ValueError, match="opera options"):
        make_network("fattree", cl, opera_options={"reconfig_delay": 30e-6})


def _args(*argv):
    from neo_train.topology.study import add_simulate_arguments

    p = argparse.ArgumentParser()
    add_simulate_arguments(p)
    return p.parse_args(list(argv))


def test_simulate_command_compat(tmp_path, capsys):
    from neo_train.topology.study import simulate_command

    args = _args("--compat", "flexflow", "--nodes", "4", "--network", "fattree", "--tables", "8",
                 "--global-batch", "4096", "--table-ps-per-value", "50", "--round-latency-us", "30",
                 "--out", str(tmp_path))
    assert simulate_command(args) == 0
    out = capsys.readouterr().out
    assert "emb_fwd" in out and "ar_top_1" in out and "per-flow ECMP, 30 us per flow" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["compat"] == "flexflow" and summary["slots"] == 2 and summary["network"] == "fattree-ecmp"
    assert summary["table_ps_per_value"] == 50 and summary["round_latency_s"] == pytest.approx(30e-6)


@pytest.mark.parametrize("argv,what", [
    (("--table-ps-per-value", "50"), "apply to --compat flexflow only"),
    (("--opera-ring", "engine"), "apply to --compat flexflow only"),
    (("--compat", "flexflow", "--placement", "planner"), "--placement planner"),
    (("--compat", "flexflow", "--input-dist"), "--input-dist"),
    (("--compat", "flexflow", "--allreduce", "hier_ring"), "hier_"),
    (("--compat", "flexflow", "--network", "fattree", "--opera-option", "tries=2"), "applies to --network opera"),
    (("--model", "model_a", "--embedding-dim", "40"), "--embedding-dim applies to"),
])
def test_simulate_command_compat_refusals(argv, what):
    from neo_train.topology.study import simulate_command

    with pytest.raises(ValueError, match=what):
        simulate_command(_args("--nodes", "4", *argv))


def test_unknown_compat_name_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        _args("--compat", "tensorflow")
    assert "invalid choice: 'tensorflow'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_slotted_rotorlb_ends_with_float_residue_at_an_intermediate():
    """Model-A at dimension 40 on 128-node Opera (DPS): every phase ends at 2.43 s, but one
    intermediate's queue kept 1.2e-6 relayed bytes of float residue (joined minus drained) with
    no drain: the engine used to step epochs forever. Slotted and fluid RotorLB agree."""
    from neo_train.topology.study import model_for, run_iteration

    model, cluster = model_for("opera_model_a", dim=40), cluster_for("opera_study", 128)
    cc = FlexFlowCompat.named("flexflow")
    _, slotted = run_iteration(model, cluster, "opera", "dps", compat=cc)
    _, fluid = run_iteration(model, cluster, "opera", "dps", compat=cc, opera_options={"rotorlb": "fluid"})
    assert slotted["iteration_s"] == pytest.approx(fluid["iteration_s"], rel=1e-3)
    assert 2.3 < slotted["iteration_s"] < 2.6


def test_opera_ring_rounds_follow_htsim_rotorlb():
    """Opera + ring in the compat mode (default ``opera_ring='htsim'``): each ring all-reduce lasts
    its 2(N-1) rounds (one under 1500 B per node) x htsim's RotorLB round for every ring's step
    together, and reports its bytes; 'engine' flow-simulates the rings: shorter rounds."""
    from neo_train.topology.rotorlb import htsim_ring_round

    model, cl = _small(4, layers=2, width=256), _cluster(128)
    opts = (("tries", 1),)
    res, row = run_flexflow_iteration(model, cl, "opera", "ring", global_batch=128,
                                      compat=FlexFlowCompat(table_ps_per_value=C_PS, opera_options=opts))
    _, eng = run_flexflow_iteration(model, cl, "opera", "ring", global_batch=128,
                                    compat=FlexFlowCompat(table_ps_per_value=C_PS, opera_options=opts,
                                                          opera_ring="engine"))
    it = build_flexflow_iteration(model, cl, "ring", 128, FlexFlowCompat(table_ps_per_value=C_PS))
    rings = {p.name: p for p in it.phases if getattr(p, "collective", "") == "all_reduce"}
    early = {n for n, p in rings.items() if p.payload / 128 < 1500}  # htsim: one round (the logit)
    assert early == {"ar_top_2"}
    step = sum(float(p.rounds[0].nbytes[p.rounds[0].src == 0].sum()) for n, p in rings.items() if n not in early)
    tau = htsim_ring_round(make_network("opera", cl, opera_options=dict(opts)), step)
    ars = [p for p in res.phases if p.kind == "all_reduce"]
    assert sorted(p.name for p in ars) == sorted(rings)
    for p in ars:
        n = 1 if p.name in early else 254
        assert p.rounds == n and p.duration == pytest.approx(n * tau)
    assert sum(p.network_bytes for p in ars) == pytest.approx(row["allreduce_bytes"])
    assert row["opera_ring"] == "htsim" and eng["opera_ring"] == "engine"
    assert row["iteration_s"] > eng["iteration_s"]


def test_simulate_command_opera_ring_flag():
    """``--opera-ring`` reaches the compat mode (the summary row names the model that ran)."""
    from neo_train.topology.study import _compat_from_args

    assert _compat_from_args(_args("--compat", "flexflow")).opera_ring == "htsim"
    assert _compat_from_args(_args("--compat", "flexflow", "--opera-ring", "engine")).opera_ring == "engine"
