"""The pipelined loop (next batch's input dist in the background) equals the plain loop."""
import pytest
import torch

from neo_train.config import preset
from neo_train.sharding import ShardingPlan
from neo_train.testing import run_ranks
from neo_train.train import Trainer


def _cfg(pipeline: bool, **kw):
    cfg = preset("tiny")
    return cfg.replace(train=cfg.train.replace(steps=7, kernel_backend="reference", pipeline=pipeline,
                                               log_every=3, eval_every=4, **kw))


def _run(comm, pipeline, sharding):
    cfg = _cfg(pipeline)
    plan = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size).with_overrides(
        cfg.model, {"t0": sharding, "t2": "data_parallel"}
    )
    t = Trainer(cfg, comm=comm, plan=plan, progress=False)
    r = t.run()
    return r.losses, r.eval_history, t.gather_state_dict()["tables"], r.step_ms


@pytest.mark.parametrize("sharding", ["row_wise", "table_row_wise"])
def test_pipelined_equals_plain_on_three_ranks(sharding):
    plain = run_ranks(_run, 3, False, sharding)
    piped = run_ranks(_run, 3, True, sharding)
    assert plain[0][0] == piped[0][0] and len(plain[0][0]) == 7  # identical per-step losses
    assert plain[0][1] == piped[0][1]  # and evaluations (one mid-run, with a prefetch in flight)
    for name, e in plain[0][2].items():
        for k, v in e.items():
            assert torch.equal(v, piped[0][2][name][k]), f"{name}.{k}"
    assert "pipeline_wait" in piped[0][3] and piped[0][3]["exposed_comm"] > 0


def test_single_process_prefetch_equals_plain():
    a = Trainer(_cfg(False), progress=False).run()
    b = Trainer(_cfg(True), progress=False).run()
    assert a.losses == b.losses and a.eval == b.eval
