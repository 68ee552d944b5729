"""Training through schedule algorithms: a 4-rank run whose all-to-alls follow the Opera rotor
schedule (direct circuits for big blocks, two-hop relays for small ones) gives exactly the native
run's losses; the run's trace replays."""
import pytest

from neo_train.comm import ScheduleCommunicator, TracingCommunicator
from neo_train.comm.schedules.registry import TopologyHint
from neo_train.config import preset
from neo_train.sharding import ShardingPlan
from neo_train.testing import run_ranks
from neo_train.train import Trainer


def _body(comm, rules, trace_dir):
    cfg = preset("tiny")
    cfg = cfg.replace(train=cfg.train.replace(steps=5, kernel_backend="reference"))
    stats = None
    if rules:
        # a 256-byte bulk threshold: this tiny model's blocks take both the direct and the relay path
        comm = ScheduleCommunicator(comm, rules, hint=TopologyHint(local_world_size=2, hosts_per_rack=2, bulk_threshold_bytes=256))
        stats = comm.stats
    if trace_dir:
        comm = TracingCommunicator(comm)
    plan = ShardingPlan.uniform(cfg.model, "table_wise", 4, 2).with_overrides(cfg.model, {"t0": "row_wise", "t2": "table_row_wise"})
    losses = Trainer(cfg, comm=comm, plan=plan, progress=False).run().losses
    if trace_dir:
        comm.dump(trace_dir)
    return losses, dict(stats or {})


def _replay(comm, paths):
    from neo_train.comm.replay import replay

    return replay(paths, comm, "all_to_all_v:pairwise").to_dict()


def test_opera_aligned_all_to_all_trains_like_native(tmp_path):
    native = run_ranks(_body, 4, "", "", local_world_size=2)
    opera = run_ranks(_body, 4, "all_to_all_v:opera", str(tmp_path), local_world_size=2)
    assert opera[0][0] == native[0][0] and len(native[0][0]) == 5  # bit-identical losses
    assert any(alg == "opera" and n > 0 for (op, alg), n in opera[0][1].items()), opera[0][1]
    paths = [str(tmp_path / f"trace_rank{r}.json") for r in range(4)]
    reports = run_ranks(_replay, 4, paths, local_world_size=2)
    assert reports[0] and len(reports) == 4


def _bytes_body(comm, fwd_codec, eval_every):
    cfg = preset("tiny")
    cfg = cfg.replace(
        train=cfg.train.replace(steps=4, kernel_backend="reference", eval_every=eval_every, eval_batches=2),
        dist=cfg.dist.replace(forward_comm_dtype=fwd_codec, backward_comm_dtype=fwd_codec),
    )
    plan = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size)
    return Trainer(cfg, comm=comm, plan=plan, progress=False).run().comm_bytes_per_step


def test_metrics_record_bytes_per_step_by_collective_tag():
    """TrainResult.comm_bytes_per_step (the --metrics-out file's): per training step, by tag.
    fp16 exchanges halve the pooled embeddings' bytes both ways and leave the ids' alone; an
    evaluation every 2 steps adds nothing (its collectives are not a training step's); a
    table-wise output dist sends every local table's pooled rows for the whole global batch."""
    fp32 = run_ranks(_bytes_body, 2, "fp32", 0)
    fp16 = run_ranks(_bytes_body, 2, "fp16", 0)
    with_eval = run_ranks(_bytes_body, 2, "fp32", 2)
    a, h = fp32[0], fp16[0]
    for tag in ("input_dist", "output_dist", "output_dist_bwd"):
        assert a.get(tag, 0) > 0, (tag, a)
    assert h["output_dist"] * 2 == a["output_dist"] and h["output_dist_bwd"] * 2 == a["output_dist_bwd"]
    assert h["input_dist"] == a["input_dist"]
    assert with_eval[0] == a, (with_eval[0], a)
    cfg = preset("tiny")
    plan = ShardingPlan.uniform(cfg.model, "table_wise", 2)
    mine = sum(t.dim for t in cfg.model.tables if plan[t.name].ranks == [0])
    assert a["output_dist"] == 2 * cfg.train.batch_size * mine * 4, (a["output_dist"], mine)
