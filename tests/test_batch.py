import pytest
import torch

from neo_train.data import Batch, SparseFeatures


def _random_sparse(g, keys, B, weighted=False):
    feats = {}
    for k in keys:
        lens = torch.randint(0, 4, (B,), generator=g, dtype=torch.int32)
        vals = torch.randint(0, 100, (int(lens.sum()),), generator=g)
        w = torch.rand(vals.shape, generator=g) if weighted else None
        feats[k] = (vals, lens, w)
    return SparseFeatures.from_features(feats), feats


def test_layout_is_feature_major_with_offsets():
    sf = SparseFeatures(("a", "b"), torch.tensor([1, 2, 3, 4, 5]), torch.tensor([2, 0, 1, 2], dtype=torch.int32))
    assert sf.batch_size == 2
    assert sf.offsets().tolist() == [0, 2, 2, 3, 5]
    assert sf.feature_value_counts() == [2, 3]
    parts = sf.by_feature()
    assert parts["b"][0].tolist() == [3, 4, 5] and parts["b"][1].tolist() == [1, 2]


@pytest.mark.parametrize("weighted", [False, True])
def test_select_and_concat(weighted):
    g = torch.Generator().manual_seed(0)
    a, fa = _random_sparse(g, ["x", "y", "z"], 4, weighted)
    b, fb = _random_sparse(g, ["x", "y", "z"], 3, weighted)
    both = SparseFeatures.concat_batches([a, b])
    assert both.batch_size == 7
    for k in ("x", "y", "z"):
        v, l, w = both.by_feature()[k]
        assert torch.equal(v, torch.cat([fa[k][0], fb[k][0]]))
        assert torch.equal(l, torch.cat([fa[k][1], fb[k][1]]))
        if weighted:
            assert torch.equal(w, torch.cat([fa[k][2], fb[k][2]]))
    sel = a.select(["z", "x"])
    assert sel.keys == ("z", "x") and torch.equal(sel.by_feature()["z"][0], fa["z"][0])
    with pytest.raises(KeyError):
        a.select(["nope"])


def test_batch_concat():
    g = torch.Generator().manual_seed(1)
    parts = []
    for B in (2, 5):
        sf, _ = _random_sparse(g, ["p", "q"], B)
        parts.append(Batch(torch.randn(B, 3, generator=g), sf, torch.randint(0, 2, (B,), generator=g).float()))
    whole = Batch.concat(parts)
    assert whole.batch_size == 7 and torch.equal(whole.dense[2:], parts[1].dense)


@pytest.mark.parametrize("weighted", [False, True])
def test_kjt_round_trip_is_lossless(weighted):
    pytest.importorskip("torchrec", reason="torchrec not installed: KJT interop not testable")
    g = torch.Generator().manual_seed(2)
    sf, _ = _random_sparse(g, ["u", "v", "w"], 5, weighted)
    kjt = sf.to_kjt()
    assert kjt.keys() == ["u", "v", "w"]
    assert torch.equal(kjt["v"].values(), sf.by_feature()["v"][0])
    back = SparseFeatures.from_kjt(kjt)
    assert back.keys == sf.keys and torch.equal(back.values, sf.values) and torch.equal(back.lengths, sf.lengths)
    assert (back.weights is None) == (not weighted)
    if weighted:
        assert torch.equal(back.weights, sf.weights)


def test_bad_input():
    with pytest.raises(ValueError, match="feature 'b': negative bag length"):
        SparseFeatures(("a", "b"), torch.tensor([1, 2]), torch.tensor([1, 1, -1, 1], dtype=torch.int32)).validate()
    with pytest.raises(ValueError, match="lengths sum to 3 but there are 2 values"):
        SparseFeatures(("a",), torch.tensor([1, 2]), torch.tensor([1, 2], dtype=torch.int32)).validate()
    with pytest.raises(ValueError, match="not a multiple"):
        SparseFeatures(("a", "b"), torch.tensor([1]), torch.tensor([1, 0, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="int32/int64"):
        SparseFeatures(("a",), torch.tensor([1.0]), torch.tensor([1], dtype=torch.int32))


def test_per_feature_counts_travel_as_host_metadata():
    """Counts taken on the host ride along to the device, so splitting by feature there needs no
    device-to-host copy of the lengths (a host sync on a GPU)."""
    sf = SparseFeatures(("a", "b"), torch.tensor([1, 2, 3, 4, 5]), torch.tensor([2, 0, 1, 2], dtype=torch.int32))
    assert sf._counts is None
    moved = sf.to("cpu")
    assert moved._counts == (2, 3) and moved.feature_value_counts() == [2, 3]
    built = SparseFeatures.from_features(moved.by_feature())
    assert built._counts == (2, 3) and torch.equal(built.values, sf.values) and torch.equal(built.lengths, sf.lengths)
    with pytest.raises(ValueError, match="counts"):
        SparseFeatures(("a",), torch.tensor([1, 2]), torch.tensor([2], dtype=torch.int32), None, (3,))
