import pytest
import torch

from neo_train.config import ModelConfig, TableConfig, preset
from neo_train.data import SparseFeatures, SyntheticData
from neo_train.kernels import SparseOptimizerSpec
from neo_train.modules import DLRM, DCNInteraction, DotInteraction, EmbeddingBagCollection, init_table


def test_dot_interaction_is_the_strict_upper_triangle():
    g = torch.Generator().manual_seed(0)
    B, D, F = 3, 4, 3
    dense, pooled = torch.randn(B, D, generator=g), torch.randn(B, F * D, generator=g)
    out = DotInteraction(D, [D] * F)(dense, pooled)
    vecs = [dense] + list(pooled.split(D, dim=1))
    expect = [dense] + [(vecs[i] * vecs[j]).sum(1, keepdim=True) for i in range(F + 1) for j in range(i + 1, F + 1)]
    torch.testing.assert_close(out, torch.cat(expect, dim=1))
    with pytest.raises(ValueError, match="dim"):
        DotInteraction(D, [D, D + 1])


@pytest.mark.parametrize("B,D,F", [(1, 1, 1), (5, 3, 2), (7, 16, 8), (33, 4, 26)])
def test_dot_interaction_backward_is_the_gradient(B, D, F):
    """The written-out backward against autograd through the pairwise products (float64, fresh
    random inputs and output gradient), and torch.autograd.gradcheck on a small case."""
    g = torch.Generator().manual_seed(B * 100 + F)
    dense = torch.randn(B, D, generator=g, dtype=torch.float64, requires_grad=True)
    pooled = torch.randn(B, F * D, generator=g, dtype=torch.float64, requires_grad=True)
    m = DotInteraction(D, [D] * F)
    out = m(dense, pooled)
    vecs = [dense] + list(pooled.split(D, dim=1))
    expect = torch.cat([dense] + [(vecs[i] * vecs[j]).sum(1, keepdim=True)
                                  for i in range(F + 1) for j in range(i + 1, F + 1)], dim=1)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, (dense, pooled), grad)
    want = torch.autograd.grad(expect, (dense, pooled), grad)
    torch.testing.assert_close(out, expect)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    if B * F <= 10:
        assert torch.autograd.gradcheck(lambda d, p: m(d, p), (dense, pooled))


@pytest.mark.parametrize("low_rank", [0, 2])
def test_dcn_follows_the_cross_formula(low_rank):
    torch.manual_seed(0)
    m = DCNInteraction(3, [2, 1], num_layers=2, low_rank=low_rank)
    with torch.no_grad():
        for p in m.b:
            p.normal_()
    dense, pooled = torch.randn(4, 3), torch.randn(4, 3)
    x0 = torch.cat([dense, pooled], 1)
    x = x0
    for i in range(2):
        W = m.W[i] if low_rank == 0 else m.U[i] @ m.V[i]
        x = x0 * (x @ W.T + m.b[i]) + x
    torch.testing.assert_close(m(dense, pooled), x)


def _ebc(tables, **kw):
    return EmbeddingBagCollection(tables, SparseOptimizerSpec("sgd", lr=0.1), backend="reference", **kw)


def test_collection_matches_per_table_embedding_bags():
    tables = (TableConfig("a", 10, 3), TableConfig("b", 7, 5, pooling="mean", feature_names=("b1", "b2")))
    ebc = _ebc(tables, seed=4)
    g = torch.Generator().manual_seed(1)
    feats = {}
    for name, rows in (("a", 10), ("b1", 7), ("b2", 7)):
        lens = torch.randint(0, 4, (6,), generator=g, dtype=torch.int32)
        feats[name] = (torch.randint(0, rows, (int(lens.sum()),), generator=g), lens, None)
    sf = SparseFeatures.from_features(feats)
    out = ebc(sf)
    assert out.shape == (6, 3 + 5 + 5)
    for (name, (v, l, _)), (lo, hi), ti, mode in zip(feats.items(), [(0, 3), (3, 8), (8, 13)], [0, 1, 1], ["sum", "mean", "mean"]):
        bag = torch.nn.EmbeddingBag.from_pretrained(init_table(4, ti, tables[ti].num_rows, tables[ti].dim), mode=mode)
        offs = torch.cat([torch.zeros(1, dtype=torch.long), l.long().cumsum(0)[:-1]])
        torch.testing.assert_close(out[:, lo:hi], bag(v, offs))


def test_collection_rejects_bad_ids_and_features():
    ebc = _ebc((TableConfig("a", 10, 3), TableConfig("b", 4, 3)))
    ok = SparseFeatures(("a", "b"), torch.tensor([1, 2]), torch.tensor([1, 1], dtype=torch.int32))
    ebc(ok)
    bad = SparseFeatures(("a", "b"), torch.tensor([1, 9]), torch.tensor([1, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="feature 'b'.*id 9 out of range"):
        ebc(bad)
    with pytest.raises(ValueError, match="do not match the model's features"):
        ebc(SparseFeatures(("b", "a"), torch.tensor([1, 2]), torch.tensor([1, 1], dtype=torch.int32)))
    with pytest.raises(ValueError, match="negative bag length"):
        ebc(SparseFeatures(("a", "b"), torch.tensor([1, 2]), torch.tensor([3, -1], dtype=torch.int32)))
    with pytest.raises(ValueError, match="lengths sum to"):
        ebc(SparseFeatures(("a", "b"), torch.tensor([1, 2, 3]), torch.tensor([1, 1], dtype=torch.int32)))


def test_modulo_id_mode_hashes_into_the_table():
    tables = (TableConfig("a", 10, 3), TableConfig("b", 4, 3))
    strict, modulo = _ebc(tables), _ebc(tables, id_mode="modulo")
    wrapped = SparseFeatures(("a", "b"), torch.tensor([13, 9]), torch.tensor([1, 1], dtype=torch.int32))
    direct = SparseFeatures(("a", "b"), torch.tensor([3, 1]), torch.tensor([1, 1], dtype=torch.int32))
    torch.testing.assert_close(modulo(wrapped), strict(direct))


@pytest.mark.parametrize("interaction", ["dot", "cat", "dcn"])
def test_dlrm_forward_and_backward(interaction):
    cfg = preset("tiny")
    mcfg = cfg.model.replace(interaction=interaction)
    ebc = _ebc(mcfg.tables)
    model = DLRM(mcfg, ebc, ebc.feature_dims)
    batch = SyntheticData(mcfg, cfg.data, 16).batch(0)
    before = ebc.table("t0").clone()
    logits = model(batch.dense, batch.sparse)
    assert logits.shape == (16,)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.dense_parameters())
    assert not torch.equal(before, ebc.table("t0")), "the fused optimizer must update touched rows"
    with pytest.raises(ValueError, match=r"expects \(B, 13\)"):
        model(batch.dense[:, :12], batch.sparse)


def test_dot_config_needs_matching_dims():
    with pytest.raises(ValueError, match="table 'x'"):
        ModelConfig((TableConfig("x", 5, 4),), bottom_mlp=(8,), interaction="dot")
