import pytest

from neo_train.config import ModelConfig, TableConfig
from neo_train.sharding import Shard, ShardingPlan, ShardingType, TablePlan
from neo_train.planning.plan import column_splits, even_splits

MODEL = ModelConfig(
    (TableConfig("a", 10, 4), TableConfig("b", 3, 5), TableConfig("c", 100, 8), TableConfig("d", 1, 2)),
    bottom_mlp=(4,), interaction="cat",
)


def test_even_splits():
    assert even_splits(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert even_splits(2, 2) == [(0, 1), (1, 2)]
    assert column_splits(8, 4) == [(0, 4), (4, 8)]  # multiples of 4 where the dim allows
    assert column_splits(12, 2) == [(0, 8), (8, 12)]
    assert column_splits(5, 2) == [(0, 3), (3, 5)]
    plan = ShardingPlan.table_plan("table_row_wise", "t", 10, 8, 4, 2, ranks=(r for r in (2, 3)))
    assert [s.rank for s in plan.shards] == [2, 3]  # a generator of ranks is read once


@pytest.mark.parametrize("st", [t.value for t in ShardingType])
@pytest.mark.parametrize("W, L", [(1, 1), (2, 2), (3, 3), (4, 2), (8, 4)])
def test_uniform_plans_validate_and_round_trip(st, W, L):
    plan = ShardingPlan.uniform(MODEL, st, W, L)
    plan.validate(MODEL, W, L)
    assert ShardingPlan.from_json(plan.to_json()) == plan
    for tp in plan.tables:
        assert tp.sharding == ShardingType(st)


def test_row_wise_covers_rows_even_when_fewer_rows_than_ranks():
    plan = ShardingPlan.uniform(MODEL, "row_wise", 4)
    assert [(s.row_start, s.row_end) for s in plan["b"].shards] == [(0, 1), (1, 2), (2, 3)]
    assert len(plan["d"].shards) == 1
    cw = ShardingPlan.uniform(MODEL, "column_wise", 4)
    assert [(s.col_start, s.col_end) for s in cw["d"].shards] == [(0, 1), (1, 2)]
    assert [(s.col_start, s.col_end) for s in cw["c"].shards] == [(0, 4), (4, 8)]


def test_table_wise_balances_by_lookup_work():
    plan = ShardingPlan.uniform(MODEL, "table_wise", 2)
    assert plan["c"].shards[0].rank != plan["a"].shards[0].rank  # the two busiest tables apart


def test_overrides_and_file_round_trip(tmp_path):
    plan = ShardingPlan.uniform(MODEL, "table_wise", 4, 2).with_overrides(MODEL, {"c": "table_row_wise", "a": "data_parallel"})
    plan.validate(MODEL, 4, 2)
    assert plan["c"].sharding == ShardingType.TABLE_ROW_WISE and len({s.rank // 2 for s in plan["c"].shards}) == 1
    path = tmp_path / "plan.json"
    plan.to_json(str(path))
    assert ShardingPlan.from_json(str(path)) == plan
    with pytest.raises(ValueError, match="table 'zz'"):
        plan.with_overrides(MODEL, {"zz": "row_wise"})


def _plan_with(table_plan: TablePlan, W=2, L=2) -> ShardingPlan:
    base = ShardingPlan.uniform(MODEL, "table_wise", W, L)
    return ShardingPlan(W, L, tuple(table_plan if tp.table == table_plan.table else tp for tp in base.tables))


@pytest.mark.parametrize(
    "plan, match",
    [
        (ShardingPlan(2, 2, ShardingPlan.uniform(MODEL, "table_wise", 2).tables[:3]), r"does not place table\(s\) 'd'$"),
        (_plan_with(TablePlan("a", ShardingType.TABLE_WISE, (Shard(2, 0, 10, 0, 4),))), "table 'a'.*rank 2"),
        (_plan_with(TablePlan("c", ShardingType.ROW_WISE, (Shard(0, 0, 50, 0, 8), Shard(1, 60, 100, 0, 8)))), r"table 'c'.*rows \[50, 60\)"),
        (_plan_with(TablePlan("c", ShardingType.ROW_WISE, (Shard(0, 0, 60, 0, 8), Shard(0, 60, 100, 0, 8)))), "table 'c'.*one rank"),
        (_plan_with(TablePlan("a", ShardingType.COLUMN_WISE, (Shard(0, 0, 10, 0, 3),))), r"table 'a'.*columns \[3, 4\)"),
        (_plan_with(TablePlan("a", ShardingType.DATA_PARALLEL, (Shard(0, 0, 10, 0, 4),))), "table 'a'.*every rank"),
        (_plan_with(TablePlan("c", ShardingType.TABLE_ROW_WISE, (Shard(1, 0, 50, 0, 8), Shard(2, 50, 100, 0, 8))), W=4, L=2), "table 'c'.*span nodes"),
        (ShardingPlan(2, 2, ShardingPlan.uniform(MODEL, "table_wise", 2).tables + (TablePlan("zz", ShardingType.TABLE_WISE, (Shard(0, 0, 1, 0, 1),)),)), r"table\(s\) 'zz' that the model does not have"),
    ],
)
def test_bad_plans_name_the_table(plan, match):
    with pytest.raises(ValueError, match=match):
        plan.validate(MODEL)



def test_a_plan_for_another_model_says_so_in_one_short_line():
    """A plan of 40 tables none of which the model has: "another model", the first names and a
    count, not 40 names (a Model-A plan listed 1000 in one error)."""
    other = ModelConfig(tuple(TableConfig(f"x{i}", 10, 4) for i in range(40)), bottom_mlp=(4,), interaction="cat")
    plan = ShardingPlan.uniform(other, "table_wise", 2)
    with pytest.raises(ValueError, match=r"plan is for another model: none of its 40 tables \('x0', .* and 32 more\) "
                                         r"is in this model's 4 \('a', 'b', 'c', 'd'\)$"):
        plan.validate(MODEL)
    extra = ShardingPlan(2, 2, ShardingPlan.uniform(MODEL, "table_wise", 2).tables + plan.tables)
    with pytest.raises(ValueError, match=r"table\(s\) 'x0', 'x1', .* and 32 more that the model does not have$"):
        extra.validate(MODEL)

def test_world_size_mismatch():
    plan = ShardingPlan.uniform(MODEL, "row_wise", 4, 2)
    with pytest.raises(ValueError, match="world size 4, but the job has 2 ranks"):
        plan.validate(MODEL, 2, 2)
    with pytest.raises(ValueError, match="multiple of the local world size"):
        ShardingPlan(3, 2)
    with pytest.raises(ValueError, match="not valid JSON"):
        ShardingPlan.from_json("{nope")
    with pytest.raises(ValueError, match="unknown sharding type"):
        ShardingPlan.uniform(MODEL, "diagonal", 2)


def test_plan_report_names_one_node_count_for_its_fix(capsys):
    """`neo-train plan --preset model_f --table-dtype fp16` printed the memory-sum estimate
    (--nodes 82) beside the figure planning again found (--nodes 129): the fix the report names is
    now the checked one, the smallest node count that plans (and one fewer does not)."""
    import argparse
    import re

    from neo_train.config import preset
    from neo_train.planning.plan_cli import add_plan_arguments, plan_command
    from neo_train.planning.planner import PlannerOptions, PlanningError, _plan_once
    from neo_train.topology.spec import preset_cluster

    args = add_plan_arguments(argparse.ArgumentParser()).parse_args(["--preset", "model_f", "--table-dtype", "fp16"])
    assert plan_command(args) == 1
    out = capsys.readouterr().out
    counts = set(re.findall(r"--nodes (\d+)", out))
    assert len(counts) == 1, out
    assert "smallest change that would fit (checked by planning again): --nodes" in out
    n = int(counts.pop())
    cfg, c = preset("model_f"), preset_cluster("zionex")
    m = cfg.model
    opts = PlannerOptions(batch_size=cfg.train.batch_size, table_dtype="fp16", optimizer=cfg.train.sparse_optimizer,
                          dense_optimizer=cfg.train.dense_optimizer, fwd_comm_dtype=cfg.dist.forward_comm_dtype,
                          bwd_comm_dtype=cfg.dist.backward_comm_dtype, memory_fraction=0.95)
    _plan_once(m, c.replace(nodes=n), opts, {})
    with pytest.raises(PlanningError):
        _plan_once(m, c.replace(nodes=n - 1), opts, {})


# ---- `neo-train plan`: bad flags are one-line errors, found before planning ---------------------

def _cli(argv, capsys):
    from neo_train.cli import main

    rc = main(argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out + err, (rc, out, err)
    return rc, out, lines[0]


_PLAN = ["plan", "--preset", "tiny", "--topology", "cpu_local", "--gpus-per-node", "2"]


@pytest.mark.parametrize("flag", ["--out", "--summary-json"])
def test_plan_output_that_is_a_directory_is_refused_before_planning(tmp_path, capsys, flag):
    rc, out, line = _cli([*_PLAN, flag, str(tmp_path)], capsys)
    assert rc == 2 and line == f"neo-train: error: {flag} {tmp_path} is a directory; give a file path"
    assert "planning" not in out  # said before the planner ran
    rc, out, line = _cli([*_PLAN, flag, str(tmp_path / "missing" / "p.json")], capsys)
    assert rc == 2 and line.startswith(f"neo-train: error: {flag} {tmp_path / 'missing' / 'p.json'}: directory ")
    assert "does not exist" in line and "planning" not in out


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-0.5", "1.01", "lots"])
def test_plan_memory_fraction_must_be_a_finite_share(capsys, value):
    rc, _, line = _cli([*_PLAN, "--memory-fraction", value], capsys)
    assert rc == 2 and "argument --memory-fraction" in line and "(0, 1]" in line and value in line, line


def test_plan_memory_fraction_one_and_out_file_are_accepted(tmp_path, capsys):
    from neo_train.cli import main

    out = tmp_path / "plan.json"
    assert main([*_PLAN, "--memory-fraction", "1", "--out", str(out)]) == 0, capsys.readouterr()
    assert ShardingPlan.from_json(str(out)).world_size == 2
