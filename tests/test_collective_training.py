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
