"""``shard_model``: model parallelism as a transform applied to a plain DLRM built by
``neo_train.modules`` (issue 15). The model knows nothing of distribution; the transform swaps its
embedding collection for a sharded one and wraps the dense part in DDP.

Checked: a plain model the caller built (embeddings on the meta device, shapes only) trains to the
same per-step losses as ``DistributedModelParallel(cfg, plan, comm)``, and both equal the
unsharded model on the concatenated batch; a model whose interaction expects other feature widths
is refused, naming the widths.
"""
from __future__ import annotations

import pytest
import torch

from neo_train.config import preset
from neo_train.data.batch import Batch
from neo_train.kernels import SparseOptimizerSpec
from neo_train.modules import DLRM
from neo_train.modules.embedding import EmbeddingBagCollection
from neo_train.parallel.model_parallel import DistributedModelParallel, plain_dlrm, shard_model
from neo_train.sharding import ShardingPlan
from neo_train.testing import run_ranks
from neo_train.train.trainer import build_model, make_data, make_dense_optimizer

STEPS = 3


def _cfg():
    cfg = preset("tiny")
    return cfg.replace(train=cfg.train.replace(kernel_backend="reference", seed=7))


def _losses(model, cfg, rank: int, world: int, comm=None, data=None) -> list[float]:
    opt = make_dense_optimizer(cfg.train, model.dense_parameters())
    data = make_data(cfg, "train", rank, world) if data is None else data
    out = []
    for _ in range(STEPS):
        b = next(data)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(b.dense, b.sparse), b.labels.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        if comm is not None:
            comm.all_reduce(t, op="avg", tag="test_loss")
        out.append(t.item())
    return out


def _worker(comm):
    cfg = _cfg()
    plan = ShardingPlan.uniform(cfg.model, "row_wise", comm.world_size)
    torch.manual_seed(cfg.train.seed)  # the dense init a plain model built by hand draws
    spec = SparseOptimizerSpec.from_train(cfg.train)
    plain = DLRM(cfg.model, EmbeddingBagCollection(cfg.model.tables, spec, backend="reference", device="meta",
                                                        seed=cfg.train.seed))
    assert all(b.device.type == "meta" for b in plain.embeddings.buffers())
    a = _losses(shard_model(plain, plan, comm, cfg), cfg, comm.rank, comm.world_size, comm)
    b = _losses(DistributedModelParallel(cfg, plan, comm), cfg, comm.rank, comm.world_size, comm)
    return a, b


def test_shard_model_on_a_plain_dlrm_matches_dmp_and_unsharded():
    (a0, b0), (a1, b1) = run_ranks(_worker, 2)
    assert a0 == b0 == a1 == b1
    # unsharded on the concatenated batch of both ranks: each rank's mean, averaged
    cfg = _cfg()
    datas = [make_data(cfg, "train", r, 2) for r in range(2)]
    ref = _losses(build_model(cfg), cfg, 0, 1, data=(Batch.concat([next(d) for d in datas]) for _ in range(STEPS)))
    assert a0 == pytest.approx(ref, rel=1e-5, abs=1e-6)


def test_plain_dlrm_draws_the_unsharded_models_dense_init():
    cfg = _cfg()
    a, b = build_model(cfg), plain_dlrm(cfg)
    dense = [(n, p) for n, p in a.named_parameters() if not n.startswith("embeddings.")]
    assert dense and all(torch.equal(p, dict(b.named_parameters())[n]) for n, p in dense)


def _mismatch(comm):
    cfg = _cfg()
    cfg = cfg.replace(model=cfg.model.replace(interaction="cat"))  # any widths (dot needs them all equal)
    plan = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size)
    wrong = DLRM(cfg.model, torch.nn.Identity(), [t.dim + 1 for t in cfg.model.tables for _ in t.feature_names])
    with pytest.raises(ValueError, match="feature widths"):
        shard_model(wrong, plan, comm, cfg)
    return True


def test_shard_model_refuses_a_model_expecting_other_widths():
    assert run_ranks(_mismatch, 1) == [True]
