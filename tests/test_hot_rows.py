"""Hot-row replication (issue 13): a table's k hot rows replicated on every rank as a
data-parallel table; hot ids pooled locally, the cold ids through the table's plan.

Exactness: training with replication gives the per-step losses, tables and optimizer state of
training without it (float32 rounding apart: a bag's pooled row is summed as cold part + hot part,
and a hot row's gradient is all-reduced instead of summed by its owner), for SGD, row-wise
AdaGrad and Adam, table-wise / row-wise / table-row-wise, across a change of the hot sets (rows
and state written back to their owners, the rows that stay hot moved locally, only the promoted
rows gathered from their owners). On table-wise plans
the bags with no cold id skip the pooled exchange both ways: the same results, exactly the
skipped rows' bytes fewer (fp32 and the codecs); ``auto`` counts those bytes when choosing k, and
the replicas' gradient sync as the cheaper of the dense all-reduce and the sparse all-gather of
the touched rows (tests/test_data_parallel_sparse.py tests the two exchanges themselves).
"""
from __future__ import annotations

import math
import zlib

import pytest
import torch

from neo_train.config import ModelConfig, TableConfig, preset
from neo_train.data.batch import SparseFeatures
from neo_train.parallel.model_parallel import DistributedModelParallel
from neo_train.sharding import ShardingPlan
from neo_train.sharding.collection import HOT_SUFFIX
from neo_train.testing import run_ranks
from neo_train.train.trainer import make_data, make_dense_optimizer

HOT = {"t0": 16, "t2": 24}  # tiny: t0 has 100 rows, t2 250 (t1 is mean-pooled, t3 has 1 row)
STEPS, SWITCH = 6, 3


def _train(comm, hot, sharding, optimizer, seed):
    cfg = preset("tiny")
    cfg = cfg.replace(train=cfg.train.replace(kernel_backend="reference", sparse_optimizer=optimizer, seed=seed))
    local = 2 if sharding == "table_row_wise" else None
    plan = ShardingPlan.uniform(cfg.model, sharding, comm.world_size, local)
    syncs, promoted = [], 0  # the replicas' gather from the owners: all-reduced values per sync
    all_reduce = comm.all_reduce

    def logged(x, *args, tag="", **kw):
        if tag == "hot_rows_sync":
            syncs.append(x.numel())
        return all_reduce(x, *args, tag=tag, **kw)

    comm.all_reduce = logged
    m = DistributedModelParallel(cfg, plan, comm, hot_rows=hot)
    opt = make_dense_optimizer(cfg.train, m.dense_parameters())
    data = make_data(cfg, "train", comm.rank, comm.world_size)
    losses, hot_ids_seen = [], 0
    gen = torch.Generator().manual_seed(seed)
    for step in range(STEPS):
        if hot and step == SWITCH:  # a new hot set: rows partly kept, partly promoted / demoted
            old = m.embeddings.hot_rows
            new = {}
            for t, k in hot.items():
                keep = old[t][: k // 2]
                rest = torch.tensor([i for i in torch.randperm(cfg.model.table(t).num_rows, generator=gen).tolist()
                                     if i not in set(keep.tolist())][: k - keep.numel()])  # fmt: skip
                new[t] = torch.cat([keep, rest])
                promoted += int((~torch.isin(new[t], old[t])).sum())
            m.embeddings.set_hot_rows(new)
        b = next(data)
        if hot:
            for t in hot:
                ids = torch.cat([b.sparse.by_feature()[f][0] for f in cfg.model.table(t).feature_names])
                hot_ids_seen += int(torch.isin(ids, m.embeddings.hot_rows[t]).sum())
        out = m(b.dense, b.sparse)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(-1), b.labels.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        comm.all_reduce(t, op="avg", tag="test_loss")
        losses.append(t.item())
    return losses, m.gather_state_dict()["tables"], hot_ids_seen, syncs, promoted


CASES = [  # (optimizer, sharding, world size); the rest of the sweep under -m slow
    ("rowwise_adagrad", "table_wise", 2),
    ("adam", "row_wise", 3),
    ("sgd", "table_row_wise", 4),
]
SLOW = [(o, s, w) for o in ("sgd", "rowwise_adagrad", "adam") for s in ("table_wise", "row_wise")
        for w in (2, 3, 4) if (o, s, w) not in CASES]  # fmt: skip


@pytest.mark.parametrize("optimizer,sharding,W", CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW])
def test_replication_trains_like_no_replication(optimizer: str, sharding: str, W: int) -> None:
    seed = zlib.crc32(f"{optimizer}-{sharding}-{W}".encode()) % 1000
    base = run_ranks(_train, W, None, sharding, optimizer, seed)
    hot = run_ranks(_train, W, HOT, sharding, optimizer, seed)
    assert sum(h[2] for h in hot) > 50, "too few hot ids in the batches: the test would not exercise the split"
    # the switch gathers only the promoted rows (t0 and t2 alike: D = 8, the same state per row)
    syncs, promoted = hot[0][3], hot[0][4]
    assert len(syncs) == 2 and 0 < promoted < sum(HOT.values())
    assert syncs[1] == syncs[0] // sum(HOT.values()) * promoted, (syncs, promoted)
    torch.testing.assert_close(torch.tensor(hot[0][0]), torch.tensor(base[0][0]), rtol=1e-5, atol=1e-6)
    tables_a, tables_b = base[0][1], hot[0][1]
    assert set(tables_b) == set(tables_a) and not any(n.endswith(HOT_SUFFIX) for n in tables_b)
    for name, entry in tables_a.items():
        for key, value in entry.items():
            torch.testing.assert_close(tables_b[name][key], value, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"table {name} {key}: {m}")  # fmt: skip


def _refusals(comm):
    cfg = preset("tiny")
    cfg = cfg.replace(train=cfg.train.replace(kernel_backend="reference"))
    tw = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size)
    cw = tw.with_overrides(cfg.model, {"t2": "column_wise"})
    errors = []
    for plan, hot in ((tw, {"nope": 3}), (tw, {"t0": 100}), (tw, {"t0": 0}), (tw, {"t1": 4}), (cw, {"t2": 4})):
        try:
            DistributedModelParallel(cfg, plan, comm, hot_rows=hot)
            errors.append("")
        except ValueError as e:
            errors.append(str(e))
    m = DistributedModelParallel(cfg, tw, comm, hot_rows={"t0": 4})
    for bad in ({"t2": torch.arange(4)}, {"t0": torch.arange(3)}, {"t0": torch.tensor([0, 1, 2, 100])},
                {"t0": torch.tensor([0, 1, 1, 2])}):  # fmt: skip
        try:
            m.embeddings.set_hot_rows(bad)
            errors.append("")
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_bad_hot_row_settings_are_refused_naming_the_table() -> None:
    errors = run_ranks(_refusals, 2)[0]
    expected = [
        "unknown table 'nope'", "table 't0': k must be in [1, 100), got 100", "table 't0': k must be in [1, 100), got 0",
        "table 't1' uses mean pooling", "table 't2' is column_wise",
        "table 't2' has no hot-row replication", "table 't0' replicates 4 rows, got 3",
        "table 't0': hot ids must be in [0, 100)", "table 't0': hot ids must be distinct",
    ]  # fmt: skip
    assert len(errors) == len(expected)
    for got, want in zip(errors, expected):
        assert want in got, (want, got)


def _trainer_run(comm, hot_rows, ckpt_dir, steps, pipeline=True):
    from neo_train.train import Trainer

    cfg = preset("tiny")
    cfg = cfg.replace(
        train=cfg.train.replace(steps=steps, pipeline=pipeline, checkpoint_dir=ckpt_dir, checkpoint_every=4 if ckpt_dir else 0,
                                log_every=2),
        dist=cfg.dist.replace(hot_rows=hot_rows, hot_rows_window=3),
    )  # fmt: skip
    plan = ShardingPlan.uniform(cfg.model, "row_wise", comm.world_size)
    trainer = Trainer(cfg, comm=comm, plan=plan, progress=False)
    result = trainer.run()
    tables = trainer.gather_state_dict()["tables"]
    switches = trainer.hot.switches if trainer.hot is not None else 0
    return result.losses, tables, switches, result.comm_bytes_per_step, trainer.step_breakdown(steps)


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "plain"])
def test_trainer_with_hot_rows_switching_every_window_trains_like_without(pipeline: bool) -> None:
    """The trainer end to end (``dist.hot_rows = K``): profiles its batches, switches the hot sets
    every 3 steps (the pipelined run with the next batch's ids already split by the old sets), and
    trains like the run without replication; the input dist carries fewer ids."""
    off = run_ranks(_trainer_run, 2, "off", "", 9, pipeline)
    on = run_ranks(_trainer_run, 2, "16", "", 9, pipeline)
    assert on[0][2] == 3 and off[0][2] == 0  # switched after steps 3, 6 and 9
    torch.testing.assert_close(torch.tensor(on[0][0]), torch.tensor(off[0][0]), rtol=1e-5, atol=1e-6)
    for name, entry in off[0][1].items():
        for key, value in entry.items():
            torch.testing.assert_close(on[0][1][name][key], value, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"table {name} {key}: {m}")  # fmt: skip
    assert on[0][3]["input_dist"] < off[0][3]["input_dist"], (on[0][3], off[0][3])
    # the step breakdown books what the backward waited in its exchanges, not the work they
    # overlapped (the replicas' exchange spans the rest of the backward): no phase below zero
    for r in on + off:
        assert min(r[4].values()) >= 0, r[4]


def test_resume_with_hot_rows_continues_like_an_uninterrupted_run(tmp_path) -> None:
    """A checkpoint holds no replica: the owners' rows are written back first, and a resumed run
    gathers the replicas from them again."""
    whole = run_ranks(_trainer_run, 2, "16", "", 8)
    ckpt = str(tmp_path / "ck")
    first = run_ranks(_trainer_run, 2, "16", ckpt, 4)  # checkpoint at step 4
    resumed = run_ranks(_trainer_run, 2, "16", ckpt, 8)  # resumes at step 4
    assert len(first[0][0]) == 4 and len(resumed[0][0]) == 8
    torch.testing.assert_close(torch.tensor(resumed[0][0]), torch.tensor(whole[0][0]), rtol=1e-5, atol=1e-6)
    for name, entry in whole[0][1].items():
        for key, value in entry.items():
            torch.testing.assert_close(resumed[0][1][name][key], value, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"table {name} {key}: {m}")  # fmt: skip


def test_zipf_coverage_matches_the_generator_and_auto_picks_the_best_k() -> None:
    """The cost model's coverage against the synthetic generator's ids; ``auto`` picks the k with
    the largest net saving (its neighbours save less), K applies to eligible tables only."""
    import numpy as np

    from neo_train.config import Config
    from neo_train.data.synthetic import power_law_ids
    from neo_train.planning.hot_rows import choose_hot_rows, zipf_coverage

    rng = np.random.default_rng(zlib.crc32(b"zipf_coverage"))
    for rows, alpha, k in ((100_000, 1.05, 256), (5_000, 0.8, 64), (2_000_000, 1.2, 1024)):
        ids = torch.from_numpy(power_law_ids(rng, 400_000, rows, alpha, salt=7))
        counts = torch.bincount(ids, minlength=rows).sort(descending=True).values
        empirical = float(counts[:k].sum()) / ids.numel()
        assert abs(zipf_coverage(k, rows, alpha) - empirical) < 0.02, (rows, alpha, k, empirical)
    cfg = preset("small")
    with pytest.raises(ValueError, match="dist.hot_rows"):
        cfg.replace(dist=cfg.dist.replace(hot_rows="lots"))
    assert isinstance(cfg, Config)
    plan = ShardingPlan.uniform(cfg.model, "table_wise", 4).with_overrides(cfg.model, {cfg.model.tables[0].name: "data_parallel"})
    assert choose_hot_rows(cfg, plan, 4, "off") == {}
    fixed = choose_hot_rows(cfg, plan, 4, "8")
    eligible = {t.name for t in cfg.model.tables[1:] if t.pooling == "sum" and t.num_rows > 8}
    assert set(fixed) == eligible and all(c.k == 8 for c in fixed.values())
    auto = choose_hot_rows(cfg, plan, 4, "auto")
    assert auto and set(auto) <= eligible
    for name, c in auto.items():
        assert c.net_bytes > 0 and 0 < c.coverage < 1
        for other in (c.k // 2, c.k * 2):
            if 1 <= other < cfg.model.table(name).num_rows:
                assert choose_hot_rows(cfg, plan, 4, str(other))[name].net_bytes <= c.net_bytes


def test_plan_command_shows_the_hot_rows_it_would_replicate(capsys) -> None:
    """``neo-train plan --hot-rows auto|K``: k, coverage and bytes per table under the plan."""
    import argparse

    from neo_train.planning.plan_cli import add_plan_arguments, plan_command

    p = add_plan_arguments(argparse.ArgumentParser())
    base = ["--preset", "small", "--topology", "cpu_local", "--gpus-per-node", "4"]
    assert plan_command(p.parse_args(base)) == 0
    assert "hot rows" not in capsys.readouterr().out  # the preset's dist.hot_rows is off
    assert plan_command(p.parse_args(base + ["--hot-rows", "32"])) == 0
    out = capsys.readouterr().out
    timed = [ln for ln in out.splitlines() if ln.strip().startswith("on cpu_local: ")]
    assert len(timed) == 1 and "ms of all-to-all saved per step" in timed[0] and "(window 100): net " in timed[0], out
    lines = [ln for ln in out.splitlines() if "hot rows" in ln or " k " in ln]
    assert lines[0].startswith("hot rows    32: ") and "MB of ids and pooled rows kept local (" in lines[0], lines
    assert "MB of pooled rows of all-hot bags)" in lines[0] and "MB of replica gradient sync (" in lines[0], lines
    assert all(" k       32 " in ln and " sync " in ln and "rows touched)" in ln and ln.endswith(" ms") for ln in lines[1:])
    assert len(lines) > 1, lines
    # at b = 256 no k saves more time on this CPU host than replication costs
    assert plan_command(p.parse_args(base + ["--hot-rows", "auto"])) == 0
    assert "hot rows    auto: no table gains on cpu_local (" in capsys.readouterr().out


# ---- the sparse output exchange: bags with no cold id skip it (table-wise) ---------------------

SKIP_TABLES = (
    TableConfig("a", 40, 4, pooling_factor=3.0),  # hot, multi-hot
    TableConfig("b", 30, 6, pooling_factor=1.0, feature_names=("b1", "b2")),  # hot, one table two features
    TableConfig("c", 20, 4, pooling_factor=2.0),  # not replicated: every bag crosses
    TableConfig("d", 9, 2, pooling_factor=1.0),  # hot, the narrowest (chunks of gcd(4, 6, 2) = 2 values)
)
SKIP_MODEL = ModelConfig(SKIP_TABLES, bottom_mlp=(4,), interaction="cat")
SKIP_HOT = {"a": torch.tensor([3, 0, 17, 39, 8]), "b": torch.tensor([29, 1, 2]), "d": torch.tensor([4])}
SKIP_B, SKIP_STEPS = 5, 3


def _skip_batch(rank: int, step: int) -> tuple:
    """Rank ``rank``'s batch: per feature, bags that are all hot, all cold, mixed and empty
    (the kind cycles with rank, step, feature and bag, so every kind lands on every owner)."""
    feats, skipped = {}, {}
    g = torch.Generator().manual_seed(100 * step + rank)
    for fi, f in enumerate(("a", "b1", "b2", "c", "d")):
        t = {"b1": "b", "b2": "b"}.get(f, f)
        rows = SKIP_MODEL.table(t).num_rows
        hot = SKIP_HOT.get(t, torch.tensor([5, 11]))  # "c" has no replication: the same id kinds, all cold there
        cold = torch.tensor([i for i in range(rows) if i not in set(hot.tolist())])
        vals, lens, skip = [], [], []
        for j in range(SKIP_B):
            kind = (rank + step + fi + j) % 4
            n = int(torch.randint(1, 4, (1,), generator=g)) if t != "d" else 1
            pick = lambda pool, m: pool[torch.randint(0, pool.numel(), (m,), generator=g)]  # noqa: E731
            if kind == 0:
                ids = pick(hot, n)
            elif kind == 1:
                ids = pick(cold, n)
            elif kind == 2:
                ids = torch.cat([pick(hot, 1), pick(cold, 1)]) if t != "d" else pick(hot, 1)
            else:
                ids = torch.zeros(0, dtype=torch.int64)
            vals.append(ids)
            lens.append(ids.numel())
            skip.append(t in SKIP_HOT and not bool((~torch.isin(ids, SKIP_HOT[t])).any()))
        feats[f] = (torch.cat(vals).to(torch.int64), torch.tensor(lens, dtype=torch.int32), None)
        skipped[f] = skip
    return SparseFeatures.from_features(feats), skipped


def _skip_body(comm, hot: bool, codec: str | None, hot_sets: dict | None = None, onto: bool = True):
    from neo_train.comm.timing import TimingCommunicator
    from neo_train.kernels import SparseOptimizerSpec
    from neo_train.sharding import ShardedEmbeddingBagCollection
    from neo_train.train.timing import PhaseTimer

    comm = TimingCommunicator(comm, PhaseTimer())
    plan = ShardingPlan.uniform(SKIP_MODEL, "table_wise", comm.world_size)
    ebc = ShardedEmbeddingBagCollection(SKIP_MODEL, plan, comm, SparseOptimizerSpec("adam", lr=0.05), backend="reference",
                                        seed=3, fwd_codec=codec, bwd_codec=codec,
                                        hot_rows={t: ids.numel() for t, ids in (hot_sets or SKIP_HOT).items()} if hot else None)  # fmt: skip
    if hot:
        ebc.set_hot_rows(hot_sets or SKIP_HOT)
    if not onto:  # the general path: rows scattered into zeros, the replicas assembled onto them
        ebc._scatter_onto = None
    looked_up: list[int] = []  # bags per call of the table-wise group's kernel on this rank
    for g in ebc.groups.values():
        if type(g).__name__ == "TableWiseSharding" and g.kernel is not None:
            g.kernel.register_forward_pre_hook(lambda m, args: looked_up.append(args[1].numel() - 1))
    outs, per_step, skipped, grad_fns = [], [], [], set()
    for s in range(SKIP_STEPS):
        sparse, skip = _skip_batch(comm.rank, s)
        before = dict(comm.bytes_by_tag)
        out = ebc(sparse)
        grad_fns.add(type(out.grad_fn).__name__)
        up = torch.randn(SKIP_B, out.shape[1], generator=torch.Generator().manual_seed(7 * s + comm.rank))
        (out * up).sum().backward()
        outs.append(out.detach())
        per_step.append({k: v - before.get(k, 0) for k, v in comm.bytes_by_tag.items()})
        skipped.append(skip)
    owner = {f: plan[t.name].shards[0].rank for t in SKIP_TABLES for f in t.feature_names}
    return outs, ebc.gather_tables(), per_step, skipped, owner, grad_fns, looked_up


@pytest.mark.parametrize("W", [3, 5])
def test_bags_with_no_cold_id_skip_the_output_exchange_exactly(W: int) -> None:
    """All-hot, all-cold, mixed and empty bags, b = 5, tables of dims 4 / 6 / 4 / 2 (one shared by
    two features, one without replication), W = 5 leaves a rank with no table: the pooled rows and
    the trained tables and Adam state match the run without replication, and each rank's
    output_dist bytes (the rows it owns) and output_dist_bwd bytes (its own bags' gradients)
    drop by exactly the skipped bags' rows (4 B x D each); an owner's lookup pools only the bags
    sent, each of its features padded to the most any of them sends."""
    off = run_ranks(_skip_body, W, False, None)
    on = run_ranks(_skip_body, W, True, None)
    dims = {f: t.dim for t in SKIP_TABLES for f in t.feature_names}
    total_skipped = 0
    for r in range(W):
        for s in range(SKIP_STEPS):
            torch.testing.assert_close(on[r][0][s], off[r][0][s], rtol=1e-6, atol=1e-6)
            # forward: rank r sends its features' rows of every source's bags; backward: it sends
            # the gradients of its own bags' rows, to every owner
            owner = on[r][4]
            sent = sum(dims[f] for src in range(W) for f, flags in on[src][3][s].items() if owner[f] == r
                       for x in flags if x)  # fmt: skip
            got = sum(dims[f] for f, flags in on[r][3][s].items() for x in flags if x)
            total_skipped += sent
            # the owner's lookup: per feature (unit) the bags it sends, all W b when not replicated
            units = [f for f in owner if owner[f] == r]
            sends = [sum(not x for src in range(W) for x in on[src][3][s][f]) for f in units]
            if units:
                assert on[r][6][s] == len(units) * max(max(sends), 1), (r, s, on[r][6][s], sends)
                assert off[r][6][s] == len(units) * W * SKIP_B
            for tag, skipped in (("output_dist", sent), ("output_dist_bwd", got)):
                assert off[r][2][s][tag] - on[r][2][s][tag] == 4 * skipped, (r, s, tag, off[r][2][s], on[r][2][s])
    assert total_skipped > 0
    # the replicas are added in place onto the table-wise group's output, which is not a view of
    # another tensor: autograd records the add itself, no CopySlices copying the whole gradient
    assert all(on[r][5] == {"_AssembleColumnsBackward"} for r in range(W)), [on[r][5] for r in range(W)]
    for name, entry in off[0][1].items():
        for key, value in entry.items():
            torch.testing.assert_close(on[0][1][name][key], value, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"table {name} {key}: {m}")  # fmt: skip


def test_every_feature_replicated_adds_the_cold_rows_onto_the_replicas_output() -> None:
    """Every feature of the table-wise plan replicated: the received cold rows are added straight
    onto the replicas' pooled output (``_ScatterAddRows``), which gives bit for bit what
    scattering them into zeros and adding the replicas' output does (pooled rows, trained tables,
    Adam state), and matches no replication."""
    all_hot = {**SKIP_HOT, "c": torch.tensor([5, 11])}
    off = run_ranks(_skip_body, 3, False, None)
    fast = run_ranks(_skip_body, 3, True, None, all_hot)
    general = run_ranks(_skip_body, 3, True, None, all_hot, False)
    assert all(fast[r][5] == {"_ScatterAddRowsBackward"} for r in range(3)), [fast[r][5] for r in range(3)]
    assert all(general[r][5] == {"_AssembleColumnsBackward"} for r in range(3)), [general[r][5] for r in range(3)]
    for r in range(3):
        for s in range(SKIP_STEPS):
            assert torch.equal(fast[r][0][s], general[r][0][s]), (r, s)
            torch.testing.assert_close(fast[r][0][s], off[r][0][s], rtol=1e-6, atol=1e-6)
    for name, entry in general[0][1].items():
        for key, value in entry.items():
            assert torch.equal(fast[0][1][name][key], value), (name, key)
            torch.testing.assert_close(off[0][1][name][key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_sparse_output_exchange_with_a_codec(codec: str) -> None:
    """The codecs encode the sparse exchange's rows, in chunks of g = gcd of the group's unit
    widths (here 2; g = D when every table has the same dim): the pooled rows stay within the
    codec's rounding of the fp32 ones, and the wire carries exactly the fp32 sparse exchange's
    chunks, encoded (fp16: 2 B a value; int8: g B + 8 B of scale and offset per chunk)."""
    ref = run_ranks(_skip_body, 3, False, None)
    fp32 = run_ranks(_skip_body, 3, True, None)
    coded = run_ranks(_skip_body, 3, True, codec)
    g = 2
    for r in range(3):
        for s in range(SKIP_STEPS):
            torch.testing.assert_close(coded[r][0][s], ref[r][0][s], rtol=5e-2, atol=5e-2)
            for tag in ("output_dist", "output_dist_bwd"):
                chunks = fp32[r][2][s][tag] // (4 * g)
                want = chunks * g * 2 if codec == "fp16" else chunks * (g + 8)
                assert coded[r][2][s][tag] == want, (r, s, tag, coded[r][2][s][tag], want)


def test_auto_counts_the_output_bytes_that_one_hot_bags_save() -> None:
    """Table-wise one-hot tables: a bag whose one id is hot (or that is empty) skips the pooled
    exchange both ways, which ``auto`` now counts (s = 0.05 + 0.95 c of the bags at L = 1, ~c^L
    for multi-hot ones); with the ids' bytes alone (8 B an id against 4 D B of pooled row each
    way) no k of a wide one-hot table pays for its all-reduce. Row-wise tables save no output bytes."""
    from neo_train.config import Config, DataConfig, DistConfig, TrainConfig
    from neo_train.planning.hot_rows import all_hot_fraction, choose_hot_rows

    tables = tuple(TableConfig(f"t{i}", 100_000, 128, pooling_factor=L) for i, L in enumerate((1.0, 1.0, 20.0, 20.0)))
    model = ModelConfig(tables, num_dense_features=13, bottom_mlp=(128,), top_mlp=(16,), interaction="dot")
    cfg = Config(model, TrainConfig(batch_size=512), DataConfig(zipf_alpha=1.05), DistConfig(), name="one_hot")
    W = 4
    tw = choose_hot_rows(cfg, ShardingPlan.uniform(model, "table_wise", W), W, "auto")
    rw = choose_hot_rows(cfg, ShardingPlan.uniform(model, "row_wise", W), W, "auto")
    assert {"t0", "t1"} <= set(tw)
    for name in ("t0", "t1"):
        c = tw[name]
        assert c.saved_output_bytes > 0 and c.saved_input_bytes < c.added_bytes < c.net_bytes + c.added_bytes
        assert c.skip_fraction == pytest.approx(all_hot_fraction(c.coverage, 1.0))
        assert c.saved_output_bytes == pytest.approx(c.skip_fraction * 512 * 128 * 8 * (W - 1) / W)
        assert c.saved_bytes == pytest.approx(c.saved_input_bytes + c.saved_output_bytes)
    assert all(c.saved_output_bytes == 0 and c.skip_fraction == 0 for c in rw.values())
    assert "t0" not in rw  # the ids alone do not pay for a wide one-hot table's all-reduce
    # a narrower codec on the pooled exchange halves what a skipped bag saves
    fp16 = cfg.replace(dist=cfg.dist.replace(forward_comm_dtype="fp16", backward_comm_dtype="fp16"))
    c16 = choose_hot_rows(fp16, ShardingPlan.uniform(model, "table_wise", W), W, str(tw["t0"].k))["t0"]
    assert c16.saved_output_bytes == pytest.approx(tw["t0"].saved_output_bytes / 2)
    assert all_hot_fraction(0.6, 20.0) < 0.06 and all_hot_fraction(0.6, 1.0) == pytest.approx(0.05 + 0.95 * 0.6 * math.exp(-(1 / 0.95 - 1) * 0.4))


def test_auto_counts_the_cheaper_replica_sync() -> None:
    """The replicas' gradient sync costs the cheaper of the dense all-reduce and the sparse
    all-gather of the rows a rank touches (sharding/data_parallel.py): the expected touched rows
    match the generator's ids, and the sparse sync lets ``auto`` replicate more rows of one-hot
    tables at W = 2 (b = 512, Zipf 1.05: k = 512, was 32) while W = 4 stays with the dense one (k = 48)."""
    import numpy as np

    from neo_train.config import Config, DataConfig, DistConfig, TrainConfig
    from neo_train.data.synthetic import power_law_ids
    from neo_train.planning.hot_rows import choose_hot_rows, expected_touched_rows, replica_sync_bytes

    rng = np.random.default_rng(zlib.crc32(b"touched_rows"))
    rows, alpha = 100_000, 1.05
    ids = power_law_ids(rng, 400_000, rows, alpha, salt=3)
    ranked = np.argsort(-np.bincount(ids, minlength=rows), kind="stable")
    for k, n in ((512, 512), (64, 2048), (4096, 512)):
        hot = ranked[:k]
        got = np.mean([np.isin(hot, power_law_ids(rng, n, rows, alpha, salt=3)).sum() for _ in range(200)])
        assert abs(expected_touched_rows(k, rows, alpha, n) - got) < 0.05 * got, (k, n, got)
    assert expected_touched_rows(0, rows, alpha, 512) == 0.0 and expected_touched_rows(8, rows, alpha, 10**9) == pytest.approx(8)

    tables = tuple(TableConfig(f"t{i}", rows, 64, pooling_factor=1.0) for i in range(4))
    model = ModelConfig(tables, num_dense_features=13, bottom_mlp=(64,), top_mlp=(16,), interaction="dot")
    cfg = Config(model, TrainConfig(batch_size=512), DataConfig(zipf_alpha=alpha), DistConfig(), name="one_hot")
    for W, k, sync in ((2, 512, "sparse"), (4, 48, "dense")):
        c = choose_hot_rows(cfg, ShardingPlan.uniform(model, "table_wise", W), W, "auto")["t0"]
        assert (c.k, c.sync) == (k, sync), (W, c)
        dense, sparse = replica_sync_bytes(c.k, 64, c.touched_rows, W)
        assert c.added_bytes == min(dense, sparse) and c.touched_rows == expected_touched_rows(c.k, rows, alpha, 512)
        assert sparse == pytest.approx((W - 1) * c.touched_rows * 4 * 65) and dense == pytest.approx(2 * (W - 1) / W * 4 * c.k * 65)


def _one_hot_cfg(W: int, window: int = 10, b: int = 4096, optimizer: str = "sgd"):
    from neo_train.config import Config, DataConfig, DistConfig, TrainConfig

    tables = tuple(TableConfig(f"t{i}", 100_000, 128, pooling_factor=1.0) for i in range(4))
    model = ModelConfig(tables, num_dense_features=13, bottom_mlp=(128,), top_mlp=(16,), interaction="dot")
    cfg = Config(model, TrainConfig(batch_size=b, sparse_optimizer=optimizer), DataConfig(zipf_alpha=1.05),
                 DistConfig(hot_rows_window=window), name="one_hot")  # fmt: skip
    return cfg, ShardingPlan.uniform(model, "table_wise", W)


@pytest.mark.parametrize("W", [2, 4])
def test_auto_on_a_cluster_maximises_the_step_time_saved(W: int) -> None:
    """With the job's cluster ``auto`` picks the k with the most seconds saved net of the sync,
    the replicas' extra memory traffic and the switches (each term as its formula says); with free
    memory traffic and rare switches it agrees with the bytes, on a CPU host (cpu_local: memory at
    1.5 GB/s, the replicas' cached rows 4x that) it replicates fewer rows than the bytes alone
    would; what the tables save must pay
    for the collectives replication adds, and the cluster must be the job's."""
    from neo_train.planning.cost_formulas import ring_allreduce_time, state_bytes_per_row
    from neo_train.planning.hot_rows import (REPLICA_ROUNDS, choose_hot_rows, exchange_seconds, expected_touched_rows,
                                             replica_work_bytes)  # fmt: skip
    from neo_train.topology.networks import job_cluster

    for optimizer in ("sgd", "rowwise_adagrad"):
        cfg, plan = _one_hot_cfg(W, optimizer=optimizer)
        cluster = job_cluster("", W, W, "cpu")
        assert (cluster.name, cluster.world_size, cluster.nodes) == ("cpu_local", W, 1)
        auto = choose_hot_rows(cfg, plan, W, "auto", cluster)
        by_bytes = choose_hot_rows(cfg, plan, W, "auto")
        assert set(auto) == set(by_bytes) == {"t0", "t1", "t2", "t3"}
        B, lat, hbm = cluster.intra_node_bandwidth, cluster.intra_node_latency, cluster.hbm_bandwidth * cluster.hot_set_speedup
        assert cluster.hot_set_speedup == 4.0
        for name, c in auto.items():
            assert c.net_s > 0 and c.k < by_bytes[name].k  # the replicas' work stops k short of the bytes' choice
            for other in (c.k // 2, c.k * 2):
                assert choose_hot_rows(cfg, plan, W, str(other), cluster)[name].net_s <= c.net_s
            # each term, by hand (one host: the rank's bytes over its loopback link)
            assert c.saved_s == pytest.approx(c.saved_bytes / B) == pytest.approx(exchange_seconds(c.saved_bytes, cluster))
            assert c.sync_s == pytest.approx(c.added_bytes / B)  # the sparse all-gather's bytes or the dense ring's
            if c.sync == "dense":
                assert c.sync_s == pytest.approx(ring_allreduce_time(4 * c.k * 129, W, B, 0.0))
            u_all = expected_touched_rows(c.k, 100_000, 1.05, W * 4096)
            assert c.work_s == pytest.approx(replica_work_bytes(u_all, c.touched_rows, 128, optimizer, W) / hbm)
            state = state_bytes_per_row(128, optimizer)
            assert c.switch_s == pytest.approx(ring_allreduce_time(c.k * (128 * 4 + state), W, B, lat) / 10)
            assert c.net_s == pytest.approx(c.saved_s - c.sync_s - c.work_s - c.switch_s)
        # the replay's work by its parts: forward over U one-row bags, fused update of U rows, less the
        # owner's share of that update, plus the peers' rows added into the replay's gradient
        U, u, D = 1000.0, 700.0, 128
        st = state_bytes_per_row(D, optimizer)
        fwd = U * 8 + (U + 1) * 8 + U * D * 4 + U * D * 4
        upd = U * D * 4 + U * (8 + D * 4) + U * (2 * D * 4 + 2 * st)
        assert replica_work_bytes(U, u, D, optimizer, W) == pytest.approx(fwd + upd - U * 2 * (D * 4 + st) / W + (W - 1) * u * 3 * D * 4)
        # memory traffic for free and a switch every million steps: the time ranks k as the bytes do
        cfg_rare, _ = _one_hot_cfg(W, window=10**6, optimizer=optimizer)
        free = choose_hot_rows(cfg_rare, plan, W, "auto", cluster.replace(hbm_bandwidth=1e18))
        assert {t: c.k for t, c in free.items()} == {t: c.k for t, c in choose_hot_rows(cfg_rare, plan, W, "auto").items()}
    # when the tables save less than the latency of the collectives replication adds, auto replicates nothing
    saved = sum(c.net_s for c in auto.values())
    slow = cluster.replace(intra_node_latency=1.01 * saved / REPLICA_ROUNDS)
    assert choose_hot_rows(cfg, plan, W, "auto", slow) == {} and choose_hot_rows(cfg, plan, W, "64", slow)
    with pytest.raises(ValueError, match="the cluster has 8 devices, the job 2 ranks" if W == 2 else "the job 4 ranks"):
        choose_hot_rows(cfg, plan, W, "auto", job_cluster("", 8, 8, "cpu"))


def test_the_trainer_prices_auto_on_the_job_cluster() -> None:
    """``hot_row_counts`` (what the trainer replicates) prices ``auto`` on the job's cluster:
    ``dist.topology``, else cpu_local for CPU ranks and zionex for GPUs, the auto planner's."""
    from neo_train.planning.hot_rows import choose_hot_rows
    from neo_train.topology.networks import job_cluster
    from neo_train.train.hot_rows import hot_row_counts

    cfg, plan = _one_hot_cfg(2)
    auto = cfg.replace(dist=cfg.dist.replace(hot_rows="auto"))
    for device, name in (("cpu", "cpu_local"), ("cuda", "zionex")):
        cluster = job_cluster("", 2, 2, device)
        assert (cluster.name, cluster.nodes, cluster.devices_per_node) == (name, 1, 2)
        want = {t: c.k for t, c in choose_hot_rows(auto, plan, 2, "auto", cluster).items()}
        assert hot_row_counts(auto, plan, device) == want and want
    assert hot_row_counts(auto, plan, "cpu") != hot_row_counts(auto, plan, "cuda")  # the two clusters price k apart
    plan4 = ShardingPlan.uniform(cfg.model, "table_wise", 4, 2)
    given = auto.replace(dist=auto.dist.replace(topology="opera_study"))
    cluster = job_cluster("opera_study", 4, 2, "cpu")
    assert (cluster.nodes, cluster.devices_per_node, cluster.devices_per_nic) == (2, 2, 2)  # the study's NIC per node
    assert hot_row_counts(given, plan4, "cpu") == {t: c.k for t, c in choose_hot_rows(given, plan4, 4, "auto", cluster).items()}
    assert hot_row_counts(cfg.replace(dist=cfg.dist.replace(hot_rows="32")), plan, "cpu") == {f"t{i}": 32 for i in range(4)}


def _split_reference(parts: dict, hot: dict[str, torch.Tensor], table_of: dict[str, str]) -> dict:
    """The split written out id by id: each hot table's feature keeps its cold ids (and their
    weights) bag by bag, feature#hot gets the hot ids' replica slots; the hot parts follow the
    features, in the features' order."""
    out, hot_feats = dict(parts), [f for f in parts if table_of[f] in hot]
    for f in hot_feats:
        values, lengths, weights = parts[f]
        slot = {i: s for s, i in enumerate(hot[table_of[f]].tolist())}
        cold_v, cold_w, cold_l, hot_v, hot_w, hot_l, j = [], [], [], [], [], [], 0
        for n in lengths.tolist():
            bag = list(range(j, j + n))
            j += n
            cold, hit = [i for i in bag if int(values[i]) not in slot], [i for i in bag if int(values[i]) in slot]
            cold_v += [int(values[i]) for i in cold]
            hot_v += [slot[int(values[i])] for i in hit]
            cold_l.append(len(cold))
            hot_l.append(len(hit))
            if weights is not None:
                cold_w += [weights[i] for i in cold]
                hot_w += [weights[i] for i in hit]
        w = (lambda ws: None if weights is None else torch.stack(ws) if ws else weights[:0])  # noqa: E731
        out[f] = (torch.tensor(cold_v, dtype=values.dtype), torch.tensor(cold_l, dtype=lengths.dtype), w(cold_w))
        out[f + HOT_SUFFIX] = (torch.tensor(hot_v, dtype=values.dtype), torch.tensor(hot_l, dtype=lengths.dtype), w(hot_w))
    return out


def _split_body(comm, search: bool):
    from neo_train.kernels import SparseOptimizerSpec
    from neo_train.sharding import ShardedEmbeddingBagCollection, collection

    if search:  # the binary search the split takes for tables too big for a key -> slot map
        collection.HOT_MAP_MAX_ROWS = 0
    plan = ShardingPlan.uniform(SKIP_MODEL, "table_wise", comm.world_size)
    ebc = ShardedEmbeddingBagCollection(SKIP_MODEL, plan, comm, SparseOptimizerSpec("sgd", lr=0.1), backend="reference",
                                        hot_rows={t: ids.numel() for t, ids in SKIP_HOT.items()})  # fmt: skip
    table_of = {f: t.name for t in SKIP_TABLES for f in t.feature_names}
    g = torch.Generator().manual_seed(zlib.crc32(b"split_hot"))
    checked = {"mode": set(), "dtype": set(), "weights": set()}
    for trial in range(24):
        # a fresh hot set every few trials (the split's sorted keys are rebuilt by set_hot_rows)
        if trial % 6 == 0:
            hot = {t: torch.randperm(SKIP_MODEL.table(t).num_rows, generator=g)[: ids.numel()] for t, ids in SKIP_HOT.items()}
            ebc.set_hot_rows(hot)
        dtype = (torch.int32, torch.int64)[trial % 2]
        weighted = trial % 4 >= 2
        b = int(torch.randint(1, 7, (1,), generator=g))
        feats = {}
        for fi, f in enumerate(("a", "b1", "b2", "c", "d")):
            t = table_of[f]
            rows = SKIP_MODEL.table(t).num_rows
            hot_ids = hot.get(t, torch.tensor([5, 11]))
            cold_ids = torch.tensor([i for i in range(rows) if i not in set(hot_ids.tolist())])
            # per feature: mixed bags, no hot id, only hot ids, every bag empty
            mode = ("mixed", "cold", "hot", "empty")[(trial + fi) % 4]
            checked["mode"].add(mode)
            lens = torch.randint(0, 4, (b,), generator=g) if mode != "empty" else torch.zeros(b, dtype=torch.int64)
            n = int(lens.sum())
            pick = {"cold": cold_ids, "hot": hot_ids}.get(mode, torch.cat([cold_ids, hot_ids, hot_ids, hot_ids]))
            vals = pick[torch.randint(0, pick.numel(), (n,), generator=g)]
            feats[f] = (vals.to(dtype), lens.to(torch.int32), torch.rand(n, generator=g) if weighted else None)
        checked["dtype"].add(dtype)
        checked["weights"].add(weighted)
        parts = SparseFeatures.from_features(feats).by_feature()
        assert (ebc._hot_sorted[3] is None) == search
        got, want = ebc._split_hot(parts, b), _split_reference(parts, hot, table_of)
        assert list(got) == list(want), (list(got), list(want))
        for key in want:
            for name, x, y in zip(("values", "lengths", "weights"), got[key], want[key]):
                assert (x is None) == (y is None), (trial, key, name)
                if y is not None:
                    assert x.dtype == y.dtype and torch.equal(x, y), (trial, key, name, x, y)
    return checked


@pytest.mark.parametrize("search", [False, True], ids=["slot_map", "searchsorted"])
def test_split_hot_matches_a_feature_by_feature_reference(search: bool) -> None:
    """The one-pass split of every hot feature's ids (a key -> slot map, or for big tables one
    searchsorted over all hot tables' keys; one read of the per-feature counts) gives exactly, dtypes and order included, what a split
    written out feature by feature and id by id gives: mixed bags, empty bags, features with no
    hot id, with only hot ids, with no id at all, a table shared by two features (b1, b2), a
    table without replication (c), int32 and int64 ids, with and without per-id weights, across
    changes of the hot sets."""
    checked = run_ranks(_split_body, 1, search)[0]
    assert checked == {"mode": {"mixed", "cold", "hot", "empty"}, "dtype": {torch.int32, torch.int64},
                       "weights": {False, True}}  # fmt: skip
