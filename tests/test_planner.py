"""The planner, its cost model and the cluster spec: formulas against hand-computed numbers,
memory feasibility, constraints, coverage, determinism, balance, and full-scale planning time."""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pytest

from neo_train.config import ModelConfig, TableConfig, preset
from neo_train.planning.cost_model import (
    a2a_time,
    dense_flops_per_sample,
    dense_params,
    estimate,
    input_bytes_per_peer,
    lookup_bytes,
    ring_allreduce_time,
    shard_memory_bytes,
    state_bytes_per_row,
    update_bytes,
)
from neo_train.planning.plan import Shard, ShardingPlan, ShardingType, TablePlan
from neo_train.planning.plan_cli import add_plan_arguments, plan_command
from neo_train.planning.planner import (
    PlannerOptions,
    PlanningError,
    TableConstraint,
    check_coverage,
    plan_sharding,
    round_robin_plan,
)
from neo_train.topology import ClusterSpec, preset_cluster

TW, RW, CW, DP = ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE, ShardingType.DATA_PARALLEL
TWRW, TWCW = ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE


def _cluster(nodes: int = 1, gpus: int = 2, **kw) -> ClusterSpec:
    """Round numbers for hand computation: 1 GB/s memory and intra links, no latency."""
    base = dict(name="hand", nodes=nodes, devices_per_node=gpus, device_memory_bytes=1e9, host_memory_bytes=1e10,
                hbm_bandwidth=1e9, intra_node_bandwidth=1e9, intra_node_latency=0.0, inter_node_bandwidth=1e8,
                inter_node_latency=0.0, device_flops=1e12)
    base.update(kw)
    return ClusterSpec(**base)


def _model(tables, **kw) -> ModelConfig:
    return ModelConfig(tuple(tables), bottom_mlp=(16, 8), top_mlp=(16,), interaction="cat", **kw)


# ---- the cluster spec ----------------------------------------------------------------------------

def test_cluster_presets_toml_and_validation(tmp_path):
    z = preset_cluster("zionex")
    assert (z.nodes, z.devices_per_node, z.world_size) == (16, 8, 128)
    assert z.inter_node_bandwidth == 25e9 and z.intra_node_bandwidth == 300e9  # 200 Gbps; NVLink per direction
    big = z.replace(nodes=128)
    assert big.world_size == 1024 and big.hbm_bandwidth == z.hbm_bandwidth
    o = preset_cluster("opera_study")
    assert o.inter_node_bandwidth_per_device == pytest.approx(12.5e9 / 8)  # one 100 Gbps NIC for 8 GPUs
    assert preset_cluster("cpu_local") == preset_cluster("cpu_local")  # deterministic numbers
    z.dump(tmp_path / "c.toml")
    assert ClusterSpec.load(tmp_path / "c.toml") == z
    with pytest.raises(ValueError, match="cluster.nodes"):
        z.replace(nodes=0)
    with pytest.raises(ValueError, match="cluster.hbm_bandwidth"):
        z.replace(hbm_bandwidth=-1.0)
    with pytest.raises(ValueError, match="devices_per_nic"):
        z.replace(devices_per_nic=3)
    with pytest.raises(ValueError, match="unknown field"):
        ClusterSpec.loads(z.dumps() + "bogus = 1\n")
    with pytest.raises(ValueError, match="unknown topology"):
        preset_cluster("nope")


# ---- formulas, by hand ---------------------------------------------------------------------------

def test_shard_formulas_by_hand():
    # lookup: ids*8 + (bags+1)*8 + ids*D*e + bags*D*4 = 20*8 + 11*8 + 20*4*4 + 10*4*4 = 160+88+320+160
    assert lookup_bytes(10, 20, 4, 4) == 728
    assert lookup_bytes(10, 20, 4, 4, weighted=True) == 728 + 20 * 4
    # update: bags*D*4 + ids*(8 + D*4) + U*(2*D*e + 2*state), U = min(20, 5) = 5, rowwise state 4:
    # 160 + 20*24 + 5*(32 + 8) = 160 + 480 + 200
    assert update_bytes(10, 20, 5, 4, 4, "rowwise_adagrad") == 840
    assert [state_bytes_per_row(8, k) for k in ("sgd", "rowwise_adagrad", "adagrad", "adam")] == [0, 4, 32, 64]
    # memory: 100 rows x 8 fp32 + adam 2 floats/element = 3200 + 6400
    assert shard_memory_bytes(100, 8, 4, "adam") == 9600
    assert shard_memory_bytes(100, 8, 2, "rowwise_adagrad") == 1600 + 400  # fp16 halves the weights only
    # input: b lengths (4 B) + b*L ids (8 B) per feature: 2*4 + 2*3*8
    assert input_bytes_per_peer(2, 1, 3.0) == 56
    assert input_bytes_per_peer(2, 1, 3.0, id_fraction=0.5) == 8 + 24  # a row shard gets half the ids
    # ring all-reduce: 2(W-1)/W * n / B + 2(W-1)*alpha = 1.5 * 1000 / 100 + 6 * 0.5
    assert ring_allreduce_time(1000, 4, 100.0, 0.5) == pytest.approx(15.0 + 3.0)
    assert ring_allreduce_time(1000, 1, 100.0, 0.5) == 0.0


def test_a2a_time_by_hand():
    # 2 nodes x 2 devices; rank 0 owns 100 bytes per peer. intra 1000 B/s, inter 100 B/s, alpha 0.01
    c = _cluster(nodes=2, gpus=2, intra_node_bandwidth=1000.0, inter_node_bandwidth=100.0,
                 intra_node_latency=0.01, inter_node_latency=0.01)
    own = np.array([100.0, 0, 0, 0])
    node = np.array([100.0, 100.0, 0.0, 0.0])  # each rank's node sum
    t = a2a_time(own, node, 100.0, c, rounds=1)
    # rank 0 sends 1*100 intra (0.1 s), 2*100 inter (2 s); rank 1 receives 100 intra (0.1 s);
    # ranks 2, 3 receive 100 inter (1 s)
    np.testing.assert_allclose(t, [2.0 + 0.01, 0.1 + 0.01, 1.0 + 0.01, 1.0 + 0.01])


def test_dense_part_matches_the_model():
    import torch

    from neo_train.modules import DLRM

    for inter in ("dot", "cat", "dcn"):
        m = ModelConfig((TableConfig("a", 10, 8), TableConfig("b", 10, 8)), bottom_mlp=(16, 8), top_mlp=(16,),
                        interaction=inter, dcn_num_layers=2)
        dlrm = DLRM(m, torch.nn.Identity())
        assert dense_params(m) == sum(p.numel() for p in dlrm.dense_parameters()), inter
    # dot, 1 table: Linears 13x16, 16x8, (8+1)x16, 16x1 -> forward 2*(208+128+144+16) = 992,
    # plus the (F+1)^2*D*2 = 2*2*2*8 = 64 of the interaction; forward+backward = 3x
    m = ModelConfig((TableConfig("a", 10, 8),), bottom_mlp=(16, 8), top_mlp=(16,), interaction="dot")
    assert dense_flops_per_sample(m) == 3 * (992 + 64)


def test_estimate_table_wise_by_hand():
    # 1 node x 2 ranks, 1 GB/s everywhere, no latency; table 100 x 8, L = 2, b = 4, sgd, fp32.
    # TW on rank 0: bags = W*b = 8, ids = W*b*L = 16.
    m = _model([TableConfig("t", 100, 8, pooling_factor=2.0)])
    c = _cluster()
    plan = ShardingPlan(2, 2, (TablePlan("t", TW, (Shard(0, 0, 100, 0, 8),)),))
    e = estimate(m, plan, c, batch_size=4, optimizer="sgd")
    # lookup: 16*8 + 9*8 + 16*8*4 + 8*8*4 = 128 + 72 + 512 + 256 = 968 bytes
    np.testing.assert_allclose(e.phases["lookup"], [968e-9, 0.0])
    # update: 8*8*4 + 16*(8 + 32) + min(16, 100)*(2*8*4) = 256 + 640 + 1024 = 1920 bytes
    np.testing.assert_allclose(e.phases["fused_update"], [1920e-9, 0.0])
    # input: each source sends b*4 + b*L*8 = 16 + 64 = 80 bytes to rank 0 (rank 0 receives 80)
    np.testing.assert_allclose(e.phases["input_a2a"], [80e-9, 80e-9])
    # output: rank 0 sends b*D*4 = 128 bytes to rank 1; the backward mirrors it
    np.testing.assert_allclose(e.phases["output_a2a"], [128e-9, 128e-9])
    np.testing.assert_allclose(e.phases["backward_exchange"], [128e-9, 128e-9])
    np.testing.assert_allclose(e.phases["dp_allreduce"], 0.0)
    # memory: 100*8*4 weights + 2*bags*D*4 = 512 buffers + ids*8 = 128 routed ids, plus the dense replica
    np.testing.assert_allclose(e.memory - e.dense_memory, [3200 + 512 + 128, 0.0])
    assert e.critical_rank == 0 and e.imbalance == pytest.approx(e.embedding_time.max() / e.embedding_time.mean())


def test_estimate_row_wise_and_data_parallel_by_hand():
    m = _model([TableConfig("t", 100, 8, pooling_factor=2.0)])
    c = _cluster()
    rw = ShardingPlan(2, 2, (TablePlan("t", RW, (Shard(0, 0, 50, 0, 8), Shard(1, 50, 100, 0, 8))),))
    e = estimate(m, rw, c, batch_size=4, optimizer="sgd")
    # each owner: bags 8, ids 16 * 50/100 = 8: 8*8 + 9*8 + 8*32 + 8*32 = 648 bytes
    np.testing.assert_allclose(e.phases["lookup"], [648e-9, 648e-9])
    # input per owner: b*4 lengths + b*L*0.5*8 ids = 16 + 32 = 48 bytes each way
    np.testing.assert_allclose(e.phases["input_a2a"], [48e-9, 48e-9])
    # reduce-scatter as an all-to-all: every rank sends and receives (W-1)*b*D*4 = 128 bytes
    np.testing.assert_allclose(e.phases["output_a2a"], [128e-9, 128e-9])
    dp = ShardingPlan(2, 2, (TablePlan("t", DP, (Shard(0, 0, 100, 0, 8), Shard(1, 0, 100, 0, 8))),))
    e = estimate(m, dp, c, batch_size=4, optimizer="sgd")
    np.testing.assert_allclose(e.phases["input_a2a"] + e.phases["output_a2a"], 0.0)
    # all-reduce of R*(D+1)*4 = 3600 bytes: 2*(1/2)*3600 / 1e9
    np.testing.assert_allclose(e.phases["dp_allreduce"], [3.6e-6, 3.6e-6])


def test_estimate_table_row_wise_by_hand():
    # 2 nodes x 2; TWRW on node 0. b*D*4 = 4*8*4 = 128 bytes per peer.
    # intra reduce-scatter on node 0: (G-1)*N*128 = 256 bytes at 1e9; node 1 has nothing to reduce.
    # cross all-to-all at 1e8: node 0 sends (N-1)*128 = 128, node 1 receives 128.
    m = _model([TableConfig("t", 100, 8, pooling_factor=2.0)])
    c = _cluster(nodes=2, gpus=2)
    plan = ShardingPlan(4, 2, (TablePlan("t", TWRW, (Shard(0, 0, 50, 0, 8), Shard(1, 50, 100, 0, 8))),))
    e = estimate(m, plan, c, batch_size=4, optimizer="sgd")
    np.testing.assert_allclose(e.phases["output_a2a"], [256e-9 + 128e-8] * 2 + [128e-8] * 2)


def test_planner_state_matches_estimate():
    """The planner's incremental bookkeeping and a from-scratch estimate agree on every rank."""
    from neo_train.planning.planner import _plan_once

    m = preset("model_a", row_scale=1e-4).model.replace(tables=preset("model_a", row_scale=1e-4).model.tables[:80])
    c = preset_cluster("zionex", nodes=2)
    opts = PlannerOptions(batch_size=64)
    p = _plan_once(m, c, opts, {})
    e = estimate(m, p.build(), c, 64, memory_fraction=opts.memory_fraction)
    np.testing.assert_allclose(p.L.total, e.total, rtol=1e-9)
    np.testing.assert_allclose(p.L.mem + p.L.dense_memory, e.memory, rtol=1e-9)


# ---- planning ------------------------------------------------------------------------------------

def _skewed(n: int = 24) -> ModelConfig:
    """A few heavy tables (wide, long bags) among many light ones."""
    rng = np.random.default_rng(3)
    tables = []
    for i in range(n):
        heavy = i % 6 == 0
        tables.append(TableConfig(f"s{i}", int(rng.integers(1_000, 200_000)), 128 if heavy else int(rng.choice([8, 16, 32])),
                                  pooling_factor=40.0 if heavy else float(rng.integers(1, 5))))
    return _model(tables)


def test_too_big_for_one_device_is_not_table_wise():
    # 1 GB usable per device: a 2 GB table must be split; the rest may go whole
    m = _model([TableConfig("big", 4_000_000, 128), TableConfig("small", 1000, 16)])
    c = _cluster(nodes=1, gpus=4, device_memory_bytes=1.2e9)
    res = plan_sharding(m, c, PlannerOptions(batch_size=16, memory_fraction=1.0))
    assert res.fits and res.plan["big"].sharding != TW
    assert res.estimate.memory.max() <= c.device_memory_bytes
    res.plan.validate(m, 4, 4)


def test_impossible_model_names_the_table_and_the_fix():
    m = _model([TableConfig("ok", 1000, 16), TableConfig("giant", 40_000_000, 128)])  # 20 GB + state
    c = _cluster(nodes=1, gpus=4, device_memory_bytes=2e9)
    with pytest.raises(PlanningError) as info:
        plan_sharding(m, c, PlannerOptions(batch_size=8))
    msg = str(info.value)
    assert info.value.table == "giant" and "'giant'" in msg
    assert "smallest change that would fit" in msg and "--nodes" in msg
    # pinned to table-wise, the first fix is to allow row-wise sharding
    with pytest.raises(PlanningError, match="allow row_wise"):
        plan_sharding(_model([TableConfig("wide", 5_000_000, 128)]), c, PlannerOptions(batch_size=8, auto_cache=False),
                      {"wide": TableConstraint(allowed=(TW,))})
    # non-strict: a best-effort plan, fits=False, the fix verified by planning again
    res = plan_sharding(m, c, PlannerOptions(batch_size=8), strict=False)
    assert not res.fits and "giant" in res.explanation and "checked by planning again" in res.explanation


def test_planning_is_deterministic():
    m, c = _skewed(), _cluster(nodes=2, gpus=4)
    a = plan_sharding(m, c, PlannerOptions(batch_size=64)).plan.to_json()
    b = plan_sharding(m, c, PlannerOptions(batch_size=64)).plan.to_json()
    assert a == b


def test_constraints_allowed_types_pinned_ranks_and_column_width():
    m = _model([TableConfig("a", 10_000, 64, pooling_factor=30.0), TableConfig("b", 5_000, 32),
                TableConfig("c", 8_000, 16), TableConfig("d", 3_000, 64, pooling_factor=5.0)])
    c = _cluster(nodes=2, gpus=2)
    cons = {
        "a": TableConstraint(allowed=(CW,), min_col_width=32),
        "b": TableConstraint(allowed=(RW,)),
        "c": TableConstraint(ranks=(3,)),
        "d": TableConstraint(allowed=(TW, CW), ranks=(1, 2)),
    }
    plan = plan_sharding(m, c, PlannerOptions(batch_size=32), cons).plan
    assert plan["a"].sharding == CW and all(s.cols >= 32 for s in plan["a"].shards) and len(plan["a"].shards) == 2
    assert plan["b"].sharding == RW
    assert {s.rank for s in plan["c"].shards} == {3}
    assert plan["d"].sharding in (TW, CW) and {s.rank for s in plan["d"].shards} <= {1, 2}
    with pytest.raises(ValueError, match="'zzz'"):
        plan_sharding(m, c, PlannerOptions(), {"zzz": TableConstraint()})
    with pytest.raises(ValueError, match="table 'a'.*rank"):
        plan_sharding(m, c, PlannerOptions(), {"a": TableConstraint(ranks=(9,))})


def test_coverage_check_names_the_table():
    m = _model([TableConfig("x", 100, 8), TableConfig("y", 50, 8)])
    good = ShardingPlan.uniform(m, "row_wise", 2)
    check_coverage(m, good)
    missing = ShardingPlan(2, 2, (good["x"],))
    with pytest.raises(ValueError, match="'y' is missing"):
        check_coverage(m, missing)
    gap = ShardingPlan(2, 2, (TablePlan("x", RW, (Shard(0, 0, 40, 0, 8), Shard(1, 60, 100, 0, 8))), good["y"]))
    with pytest.raises(ValueError, match=r"table 'x': rows \[40, 60\) x cols \[0, 8\) are not covered"):
        check_coverage(m, gap)
    overlap = ShardingPlan(2, 2, (good["x"], TablePlan("y", CW, (Shard(0, 0, 50, 0, 5), Shard(1, 0, 50, 3, 8)))))
    with pytest.raises(ValueError, match="table 'y'.*covered 2 times"):
        check_coverage(m, overlap)
    twice = ShardingPlan(2, 2, (good["x"], good["y"], good["x"]))
    with pytest.raises(ValueError, match="'x' appears more than once"):
        check_coverage(m, twice)


def test_planner_beats_round_robin_on_a_skewed_model():
    m, c = _skewed(), _cluster(nodes=2, gpus=4)
    res = plan_sharding(m, c, PlannerOptions(batch_size=64))
    naive = estimate(m, round_robin_plan(m, 8, 4), c, 64)
    assert res.estimate.imbalance <= naive.imbalance
    assert res.estimate.critical_path <= naive.critical_path


def test_fp16_halves_table_memory():
    m = preset("model_f").model
    opts = PlannerOptions()
    for dt in ("fp32", "fp16"):
        assert not plan_sharding(m, preset_cluster("zionex"), PlannerOptions(table_dtype=dt), strict=False,
                                 check_fix=False).fits
    from neo_train.planning.cost_model import TABLE_DTYPES

    rows = np.array([t.num_rows for t in m.tables], dtype=float)
    dims = np.array([t.dim for t in m.tables], dtype=float)
    fp32_adagrad = shard_memory_bytes(rows, dims, TABLE_DTYPES["fp32"], "adagrad").sum()
    fp16_rowwise = shard_memory_bytes(rows, dims, TABLE_DTYPES["fp16"], opts.optimizer).sum()
    assert fp32_adagrad == pytest.approx(96e12, rel=0.01)  # Neo: 96 TB ...
    assert fp16_rowwise == pytest.approx(24e12, rel=0.01)  # ... -> 24 TB


def test_plan_command_writes_a_valid_plan(tmp_path, capsys):
    p = add_plan_arguments(argparse.ArgumentParser())
    out = tmp_path / "plan.json"
    args = p.parse_args(["--preset", "small", "--topology", "cpu_local", "--gpus-per-node", "4", "--out", str(out),
                         "--summary-json", str(tmp_path / "s.json")])
    assert plan_command(args) == 0
    text = capsys.readouterr().out
    assert "fits        yes" in text and "per rank" in text
    plan = ShardingPlan.from_json(str(out))
    plan.validate(preset("small").model, 4, 4)
    assert json.loads((tmp_path / "s.json").read_text())["fits"] is True
    args = p.parse_args(["--preset", "model_f", "--out", str(tmp_path / "f.json")])
    assert plan_command(args) == 1
    assert "NO" in capsys.readouterr().out and not (tmp_path / "f.json").exists()


def test_uneven_sizes_and_idle_ranks():
    # 8 ranks, 3 tables: most ranks hold nothing; 3 rows over 8 ranks; 12 columns in 3 shards of 4
    m = _model([TableConfig("rows3", 3, 16), TableConfig("d12", 5000, 12, pooling_factor=4.0),
                TableConfig("plain", 700, 16)])
    c = _cluster(nodes=2, gpus=4)
    cons = {"rows3": TableConstraint(allowed=(RW,)), "d12": TableConstraint(allowed=(CW,), min_col_width=4)}
    res = plan_sharding(m, c, PlannerOptions(batch_size=8, col_shards=(3,)), cons)
    assert [(s.row_start, s.row_end) for s in res.plan["rows3"].shards] == [(0, 1), (1, 2), (2, 3)]
    assert sorted(s.cols for s in res.plan["d12"].shards) == [4, 4, 4]
    check_coverage(m, res.plan)
    e = res.estimate
    assert np.isfinite(e.total).all() and (e.phases["lookup"] == 0).sum() >= 2  # idle ranks still exchange
    assert (e.phases["output_a2a"] > 0).all()
    # no valid column split: the error says so instead of blaming memory
    with pytest.raises(PlanningError, match="admit no placement"):
        plan_sharding(m, c, PlannerOptions(batch_size=8), {"plain": TableConstraint(allowed=(CW,), min_col_width=32)})


def _train_two_steps(comm, cfg, plan_json):
    from neo_train.train import Trainer
    from neo_train.train.trainer import make_data

    trainer = Trainer(cfg, comm=comm, plan=ShardingPlan.from_json(plan_json), progress=False)
    data = make_data(cfg, "train", comm.rank, comm.world_size)
    return trainer.global_means([trainer.train_step(next(data), s) for s in range(2)])


def test_planned_mixed_plan_trains_on_four_ranks():
    """Every sharding type the planner emits runs on the real engine (2 nodes x 2 gloo ranks)."""
    from neo_train.testing import run_ranks

    cfg = preset("tiny")
    tables = (TableConfig("t0", 100, 8), TableConfig("t1", 37, 8, pooling="mean", pooling_factor=3.0),
              TableConfig("t2", 250, 8, pooling_factor=2.0), TableConfig("t3", 3, 8), TableConfig("t4", 64, 8),
              TableConfig("t5", 90, 8, pooling="mean"), TableConfig("t6", 20, 8))
    cfg = cfg.replace(model=cfg.model.replace(tables=tables))
    types = (TW, RW, CW, DP, TWRW, TWCW, TWRW)
    cons = {t.name: TableConstraint(allowed=(st,)) for t, st in zip(tables, types)}
    cluster = preset_cluster("cpu_local", nodes=2, devices_per_node=2)
    plan = plan_sharding(cfg.model, cluster, PlannerOptions(batch_size=cfg.train.batch_size), cons).plan
    assert [plan[t.name].sharding for t in tables] == list(types)
    losses = run_ranks(_train_two_steps, 4, cfg, plan.to_json(), local_world_size=2)
    assert all(np.isfinite(x).all() for x in losses) and all(x == losses[0] for x in losses)


def test_model_a_scaled_plans_quickly():
    # the default run's stand-in for the full-scale test: Model-A's 1000 tables, rows / 1000
    m = preset("model_a", row_scale=1e-3).model
    res = plan_sharding(m, preset_cluster("zionex", nodes=2), PlannerOptions(batch_size=512))
    assert res.fits and res.seconds < 20
    check_coverage(m, res.plan)


def test_model_a_full_scale_128_gpus():
    m = preset("model_a").model
    start = time.perf_counter()
    res = plan_sharding(m, preset_cluster("zionex"), PlannerOptions(batch_size=512))
    assert time.perf_counter() - start < 30
    assert res.fits and res.plan.world_size == 128
    assert res.estimate.imbalance < 1.3


@pytest.mark.slow
def test_model_a_full_scale_1024_gpus():
    m = preset("model_a").model
    start = time.perf_counter()
    res = plan_sharding(m, preset_cluster("zionex", nodes=128), PlannerOptions(batch_size=512))
    assert time.perf_counter() - start < 60
    assert res.fits and res.plan.world_size == 1024


@pytest.mark.slow
def test_planner_benchmark_quick(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "planner.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "planner.py"), "--quick", "--json", str(out),
                           "--plot", str(tmp_path / "p.png")], capture_output=True, text=True, timeout=180, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["a"][0]["gpus"] == 128 and report["a"][0]["fits"]
    assert {r["name"] for r in report["b"]} >= {"neo", "round-robin"}
    assert all(r["measured_step_ms"] > 0 for r in report["b"]) and (tmp_path / "p.png").exists()
