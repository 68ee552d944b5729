"""The pipelined loop (one thread; batch i+1's input dist in flight during batch i's backward)
equals the plain loop, and really overlaps."""
import pytest
import torch

from neo_train.comm import TracingCommunicator
from neo_train.config import preset
from neo_train.sharding import ShardingPlan
from neo_train.testing import run_ranks
from neo_train.train import Trainer


def _cfg(pipeline: bool, **kw):
    cfg = preset("tiny")
    kw = {"steps": 7, "kernel_backend": "reference", "log_every": 3, "eval_every": 4, **kw}
    return cfg.replace(train=cfg.train.replace(pipeline=pipeline, **kw))


def _run(comm, pipeline, overrides):
    cfg = _cfg(pipeline)
    plan = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size).with_overrides(cfg.model, overrides)
    t = Trainer(cfg, comm=comm, plan=plan, progress=False)
    r = t.run()
    return r.losses, r.eval_history, t.gather_state_dict()["tables"], r.step_ms


def _assert_same(plain, piped):
    assert plain[0][0] == piped[0][0] and len(plain[0][0]) == 7  # identical per-step losses
    assert plain[0][1] == piped[0][1]  # and evaluations (one mid-run, with an input dist in flight)
    for name, e in plain[0][2].items():
        for k, v in e.items():
            assert torch.equal(v, piped[0][2][name][k]), f"{name}.{k}"


@pytest.mark.parametrize("world_size,overrides", [
    # every sharding type: TW (the rest), RW, CW, DP; TWRW and TWCW at 3 ranks
    (2, {"t0": "row_wise", "t1": "column_wise", "t2": "data_parallel"}),
    (3, {"t0": "row_wise", "t2": "data_parallel"}),
    (3, {"t0": "table_row_wise", "t1": "column_wise"}),
])
def test_pipelined_equals_plain(world_size, overrides):
    plain = run_ranks(_run, world_size, False, overrides)
    piped = run_ranks(_run, world_size, True, overrides)
    _assert_same(plain, piped)
    assert "pipeline_wait" in piped[0][3] and piped[0][3]["exposed_comm"] > 0
    assert piped[0][3]["pipeline_wait"] > 0 and plain[0][3]["pipeline_wait"] == 0


def test_single_process_prefetch_equals_plain():
    a = Trainer(_cfg(False), progress=False).run()
    b = Trainer(_cfg(True), progress=False).run()
    assert a.losses == b.losses and a.eval == b.eval


def _trace_body(comm, pipeline):
    comm = TracingCommunicator(comm)
    cfg = _cfg(pipeline, eval_every=0)
    plan = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size)
    Trainer(cfg, comm=comm, plan=plan, progress=False).run()
    return [(e["markers"][0], e["startTime_ns"], e["duration_ns"]) for e in comm.entries]


def _steps(entries) -> list[tuple[int, int, int]]:
    """(previous step's backward exchange, forward exchange, backward exchange) positions of
    each training step (a forward exchange ``output_dist`` followed by its backward one
    ``output_dist_bwd``; evaluations have none); -1 for the first step's previous."""
    kinds = [e[0] for e in entries] + ["output_dist"]
    fwd = [k for k, n in enumerate(kinds) if n == "output_dist"]
    steps, prev = [], -1
    for a, nxt in zip(fwd, fwd[1:]):
        if "output_dist_bwd" in kinds[a:nxt]:
            bwd = kinds.index("output_dist_bwd", a, nxt)
            steps.append((prev, a, bwd))
            prev = bwd
    return steps


def _next_ids_in_flight_during_forward(entries) -> list[bool]:
    """For each training step: was an id exchange (``input_dist``) issued after the previous
    step's backward exchange and before this step's forward exchange, and still in flight (not
    yet waited for) when the forward exchange started? The plain loop waits for its batch's ids
    before the lookup; the pipeline's exchange of the next batch travels under the forward."""
    out = []
    for prev, a, _ in _steps(entries):
        ids = [entries[k] for k in range(prev + 1, a) if entries[k][0] == "input_dist"]
        out.append(any(start + (dur or 0) > entries[a][1] for _, start, dur in ids))
    return out


@pytest.mark.parametrize("pipeline", [False, True])
def test_next_batch_ids_are_in_flight_during_the_forward(pipeline):
    """From the recorded collective order and times: fails on the plain loop (the input dist
    is done before the lookup), passes on the pipelined one."""
    for entries in run_ranks(_trace_body, 2, pipeline):
        in_flight = _next_ids_in_flight_during_forward(entries)
        assert len(in_flight) == 7
        assert all(in_flight) if pipeline else not any(in_flight), in_flight


def _id_collectives_per_step(entries) -> list[int]:
    """Id exchanges (``input_dist`` collectives) issued between consecutive training steps'
    backward exchanges."""
    kinds = [e[0] for e in entries]
    return [kinds[prev + 1 : bwd].count("input_dist") for prev, _, bwd in _steps(entries)]


@pytest.mark.parametrize("pipeline", [False, True])
def test_one_id_collective_per_step_once_counts_are_known(pipeline):
    """The input dist's all-to-all is sized from earlier batches' counts (``IdExchange``): two
    collectives for the first batch (lengths and header, then ids), one per batch after that
    (this data's counts vary little: no batch outgrows its reserved space)."""
    for entries in run_ranks(_trace_body, 2, pipeline):
        per_step = _id_collectives_per_step(entries)
        assert len(per_step) == 7
        # pipelined, step 0 also issues batch 1's (sized from batch 0's counts, waited for first)
        assert per_step[1:] == [1] * 6, per_step
        assert per_step[0] == (3 if pipeline else 2), per_step


def _same_order_body(comm):
    comm = TracingCommunicator(comm)
    cfg = _cfg(True)
    plan = ShardingPlan.uniform(cfg.model, "row_wise", comm.world_size).with_overrides(cfg.model, {"t1": "table_wise"})
    Trainer(cfg, comm=comm, plan=plan, progress=False).run()
    return [(e["pg_id"], e["comms"], e["markers"][0]) for e in comm.entries]


def test_every_rank_issues_the_same_collectives_in_the_same_order():
    """NCCL's rule (operations on different communicators issued in one order on every rank):
    one thread issues them all, so the sequences are identical."""
    seqs = run_ranks(_same_order_body, 3)
    assert seqs[0] == seqs[1] == seqs[2] and len(seqs[0]) > 20


def _finite_run(comm, pipeline):
    """Every rank's data ends after 5 batches of a 9-step run."""
    import itertools

    from neo_train.data.synthetic import SyntheticData

    cfg = _cfg(pipeline, steps=9, eval_every=0)
    data = SyntheticData(cfg.model, cfg.data, cfg.train.batch_size, seed=1, rank=comm.rank, world_size=comm.world_size)
    plan = ShardingPlan.uniform(cfg.model, "row_wise", comm.world_size)
    r = Trainer(cfg, comm=comm, plan=plan, progress=False, train_data=itertools.islice(data.iterate(0), 5)).run()
    return r.losses, r.steps, r.notes, r.eval


@pytest.mark.parametrize("pipeline", [False, True])
def test_the_run_stops_together_when_the_data_ends(pipeline):
    ranks = run_ranks(_finite_run, 2, pipeline)
    losses, steps, notes, ev = ranks[0]
    assert len(losses) == 5 and steps == 5 and ranks[1][:2] == (losses, steps)
    assert notes == ["the training data ended at step 5 of 9 (the given data)"] and "auc" in ev


def _short_batch(comm):
    from neo_train.data.synthetic import SyntheticData

    cfg = _cfg(True)
    t = Trainer(cfg, comm=comm, plan=ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size), progress=False)
    b = cfg.train.batch_size
    data = SyntheticData(cfg.model, cfg.data, b, seed=0, rank=comm.rank, world_size=comm.world_size)
    full = data.batch(0)
    t.check_batch(full, 0)  # a full batch passes
    short = SyntheticData(cfg.model, cfg.data, b - 1 - comm.rank, seed=0, rank=comm.rank, world_size=comm.world_size).batch(3)
    with pytest.raises(ValueError) as e:
        t.check_batch(short, 3)
    return str(e.value)


def test_a_batch_of_another_size_is_refused_before_any_collective():
    """A rank whose batch is not train.batch_size would mis-size the input dist's all-to-all
    (gloo aborts the process on the size mismatch): the host-side check names the rank, the
    step, both sizes and the fix, before the batch reaches a collective."""
    errs = run_ranks(_short_batch, 2)
    b = _cfg(True).train.batch_size
    for r, msg in enumerate(errs):
        assert f"on rank {r} (the batch of step 3) has {b - 1 - r} samples, train.batch_size is {b}" in msg
        assert "drop_last=True" in msg
