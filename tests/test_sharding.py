"""Sharded embedding collection vs the unsharded oracle, for every sharding type.

Each rank looks up its own b samples, backpropagates a random upstream gradient and lets the
fused optimizer update the shards; the oracle does the same on the concatenated W*b batch with
the upstream gradient scaled by 1/W (the convention). Pooled outputs and every table + optimizer
state (gathered) must agree to float32 rounding. Awkward sizes throughout: rows not divisible by
W (a 1-row table), dims not divisible by the shard count, mean pooling, a shared table, empty
bags, ranks owning no table (4 tables over up to 4 ranks with TW).
"""
import pytest
import torch

from neo_train.comm import Codec
from neo_train.config import DataConfig, ModelConfig, TableConfig
from neo_train.data import Batch, SyntheticData
from neo_train.kernels import SparseOptimizerSpec, TableSpec, create_embedding_bag
from neo_train.kernels.init import init_table
from neo_train.modules import EmbeddingBagCollection
from neo_train.sharding import ShardedEmbeddingBagCollection, ShardingPlan, ShardingType
from neo_train.testing import run_ranks

TABLES = (
    TableConfig("a", 11, 4, pooling_factor=2.0),
    TableConfig("b", 7, 6, pooling="mean", pooling_factor=3.0, feature_names=("b1", "b2")),
    TableConfig("c", 5, 3, pooling_factor=0.6),
    TableConfig("d", 1, 5),
)
MODEL = ModelConfig(TABLES, bottom_mlp=(4,), interaction="cat")
B, STEPS, SEED = 3, 3, 5


def _opt(kind):
    return SparseOptimizerSpec(kind, lr=0.1)


def _upstream(step, rank, cols):
    return torch.randn(B, cols, generator=torch.Generator().manual_seed(1000 + 10 * step + rank))


def _sharded_body(comm, plan_dict, kind, codec):
    plan = ShardingPlan.from_dict(plan_dict)
    ebc = ShardedEmbeddingBagCollection(
        MODEL, plan, comm, _opt(kind), backend="reference", seed=SEED, fwd_codec=codec, bwd_codec=codec
    )
    data = SyntheticData(MODEL, DataConfig(), B, seed=2, rank=comm.rank, world_size=comm.world_size)
    outs = []
    for s in range(STEPS):
        out = ebc(data.batch(s).sparse)
        (out * _upstream(s, comm.rank, out.shape[1])).sum().backward()
        outs.append(out.detach())
    tables = ebc.gather_tables()
    return outs, tables if comm.rank == 0 else None


def _oracle(W, kind):
    ebc = EmbeddingBagCollection(TABLES, _opt(kind), backend="reference", seed=SEED)
    datas = [SyntheticData(MODEL, DataConfig(), B, seed=2, rank=r, world_size=W) for r in range(W)]
    outs = []
    for s in range(STEPS):
        out = ebc(Batch.concat([d.batch(s) for d in datas]).sparse)
        up = torch.cat([_upstream(s, r, out.shape[1]) for r in range(W)])
        (out * up / W).sum().backward()
        outs.append(out.detach())
    return outs, {t.name: {"weight": ebc.table(t.name), **ebc.table_state(t.name)} for t in TABLES}


def _compare(res, ref, W, tol=(1e-5, 1e-6)):
    ref_outs, ref_tables = ref
    for s in range(STEPS):
        got = torch.cat([res[r][0][s] for r in range(W)])
        torch.testing.assert_close(got, ref_outs[s], rtol=tol[0], atol=tol[1], msg=lambda m: f"step {s}: {m}")
    for name, entry in ref_tables.items():
        for k, v in entry.items():
            torch.testing.assert_close(res[0][1][name][k], v, rtol=tol[0], atol=tol[1], msg=lambda m: f"{name}.{k}: {m}")


CASES = [
    ("table_wise", 2, 2), ("table_wise", 4, 4), ("row_wise", 3, 3), ("row_wise", 4, 2),
    ("data_parallel", 3, 3), ("column_wise", 3, 3), ("table_row_wise", 4, 2),
    ("table_column_wise", 4, 2), ("table_row_wise", 3, 1),
]


@pytest.mark.parametrize("sharding, W, L", CASES)
def test_each_sharding_type_matches_the_oracle(sharding, W, L):
    # element-wise AdaGrad: exact for every type (column-wise included)
    plan = ShardingPlan.uniform(MODEL, sharding, W, L)
    res = run_ranks(_sharded_body, W, plan.to_dict(), "adagrad", "fp32", local_world_size=L)
    _compare(res, _oracle(W, "adagrad"), W)


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad", "adam"])
def test_mixed_plan_every_optimizer(kind):
    W, L = 4, 2
    plan = ShardingPlan.uniform(MODEL, "table_wise", W, L).with_overrides(
        MODEL, {"a": "row_wise", "b": "table_row_wise", "c": "data_parallel", "d": "table_wise"}
    )
    res = run_ranks(_sharded_body, W, plan.to_dict(), kind, "fp32", local_world_size=L)
    _compare(res, _oracle(W, kind), W)


def test_column_wise_rowwise_adagrad_equals_split_tables():
    """Neo keeps one row-wise AdaGrad accumulator per column shard, so a column-wise table trains
    exactly like its column shards as separate tables fed the same ids, concatenated."""
    W = 3
    plan = ShardingPlan.uniform(MODEL, "column_wise", W, W)
    res = run_ranks(_sharded_body, W, plan.to_dict(), "rowwise_adagrad", "fp32")
    # the equivalent unsharded model: one table per (table, column shard), features duplicated
    specs, ftm, names, pieces = [], [], [], []
    for ti, t in enumerate(TABLES):
        shards = sorted(plan[t.name].shards, key=lambda s: s.col_start)
        first = len(specs)
        for s in shards:
            specs.append(TableSpec(t.num_rows, s.cols, t.pooling, f"{t.name}@{s.col_start}"))
            pieces.append((ti, s))
        for f in t.feature_names:
            for k in range(len(shards)):
                ftm.append(first + k)
                names.append(f"{f}@{k}")
    k = create_embedding_bag("reference", specs, _opt("rowwise_adagrad"), feature_table_map=ftm, feature_names=names)
    for i, (ti, s) in enumerate(pieces):
        k.set_table(i, init_table(SEED, ti, TABLES[ti].num_rows, TABLES[ti].dim)[:, s.col_start : s.col_end])
    reps = [len(plan[t.name].shards) for t in TABLES for _ in t.feature_names]
    datas = [SyntheticData(MODEL, DataConfig(), B, seed=2, rank=r, world_size=W) for r in range(W)]
    for s in range(STEPS):
        sp = Batch.concat([d.batch(s) for d in datas]).sparse
        parts = sp.by_feature()
        dup = {f"{f}@{j}": parts[f] for f, n in zip(sp.keys, reps) for j in range(n)}
        from neo_train.data import SparseFeatures

        dsp = SparseFeatures.from_features({n: dup[n] for n in names})
        out = k(dsp.values, dsp.offsets(), None)
        up = torch.cat([_upstream(s, r, out.shape[1]) for r in range(W)])
        (out * up / W).sum().backward()
        torch.testing.assert_close(torch.cat([res[r][0][s] for r in range(W)]), out.detach(), rtol=1e-5, atol=1e-6)
    for i, (ti, sh) in enumerate(pieces):
        name = TABLES[ti].name
        col_index = sorted(x.col_start for x in plan[name].shards).index(sh.col_start)
        torch.testing.assert_close(res[0][1][name]["weight"][:, sh.col_start : sh.col_end], k.get_table(i))
        torch.testing.assert_close(res[0][1][name]["momentum"][col_index], k.get_state(i)["momentum"])


@pytest.mark.parametrize("codec, tol", [("fp16", (2e-3, 2e-3)), ("bf16", (2e-2, 2e-2))])
def test_quantized_communication_error_is_bounded(codec, tol):
    W = 2
    plan = ShardingPlan.uniform(MODEL, "row_wise", W, W).with_overrides(MODEL, {"a": "table_wise", "c": "column_wise"})
    res = run_ranks(_sharded_body, W, plan.to_dict(), "sgd", codec)
    ref = _oracle(W, "sgd")
    _compare(res, ref, W, tol)
    # and the quantized run is really different from fp32 (the codec was applied)
    exact = run_ranks(_sharded_body, W, plan.to_dict(), "sgd", "fp32")
    assert any(not torch.equal(res[0][0][s], exact[0][0][s]) for s in range(STEPS))


@pytest.mark.slow
@pytest.mark.parametrize("sharding", [t.value for t in ShardingType])
def test_eight_ranks(sharding):
    W, L = 8, 4
    plan = ShardingPlan.uniform(MODEL, sharding, W, L)
    res = run_ranks(_sharded_body, W, plan.to_dict(), "adagrad", "fp32", local_world_size=L)
    _compare(res, _oracle(W, "adagrad"), W)


class _SpyCodec(Codec):
    """Identity on the wire; records what the backward exchanges encode."""

    name = "spy"

    def __init__(self):
        self.seen = []

    def encode(self, x):
        self.seen.append(x.detach().clone())
        return x

    def decode(self, y, dtype):
        return y.to(dtype)


def _codec_sees_body(comm, sharding):
    plan = ShardingPlan.uniform(MODEL, sharding, comm.world_size)
    ebc = ShardedEmbeddingBagCollection(MODEL, plan, comm, _opt("sgd"), backend="reference", seed=SEED)
    spy = _SpyCodec()
    for g in ebc.groups.values():
        g.ctx.bwd_codec = spy
    sparse = SyntheticData(MODEL, DataConfig(), B, seed=2, rank=comm.rank, world_size=comm.world_size).batch(0).sparse
    out = ebc(sparse)
    out.backward(torch.full(out.shape, 0.75))
    return [t for t in spy.seen if t.numel()]


@pytest.mark.parametrize("sharding", ["table_wise", "row_wise"])
def test_backward_codec_carries_the_unscaled_gradient(sharding):
    """The 1/W of the convention is applied after the backward exchange has decoded the
    gradient: a narrow codec (fp16) at large W would otherwise carry subnormals."""
    for seen in run_ranks(_codec_sees_body, 4, sharding):
        assert seen and all(torch.all(t == 0.75) for t in seen), [t.unique() for t in seen]


@pytest.mark.parametrize("seed", range(4))
def test_column_permutation_matches_index_select(seed):
    """The run-copy permutation (forward and backward) against index_select on fresh random
    layouts: whole blocks of awkward widths shuffled, the identity, a selection that drops
    columns (hot-row replication, fbgemm's ghost features: their gradient is zero), a selection
    of every other block, and one of many single-column runs."""
    from neo_train.kernels.columns import ColumnPermutation

    g = torch.Generator().manual_seed(seed)
    widths = torch.randint(1, 9, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
    starts = [sum(widths[:i]) for i in range(len(widths))]
    n = sum(widths)
    order = torch.randperm(len(widths), generator=g).tolist()
    blocks = [c for i in order for c in range(starts[i], starts[i] + widths[i])]
    keep = [c for i in order[: max(1, len(order) // 2)] for c in range(starts[i], starts[i] + widths[i])]
    many = torch.randperm(n + 80, generator=g).tolist()
    every_other = [c for i in range(0, len(widths), 2) for c in range(starts[i], starts[i] + widths[i])]
    for cols, width in ((blocks, n), (list(range(n)), n), (keep, n), (every_other, n), (many, n + 80)):
        perm = ColumnPermutation(cols, width)
        x = torch.randn(5, width, generator=g, requires_grad=True)
        y = x.detach().clone().requires_grad_(True)
        out, want = perm(x), y.index_select(1, torch.tensor(cols))
        assert torch.equal(out, want)
        grad = torch.randn(want.shape, generator=g)
        out.backward(grad)
        want.backward(grad)
        assert torch.equal(x.grad, y.grad)
    assert ColumnPermutation(blocks, n).by_runs and ColumnPermutation(keep, n).by_runs
    assert ColumnPermutation(keep, n).inverse_runs is None and ColumnPermutation(every_other, n).by_runs
    assert not ColumnPermutation([0, 1, 1], 3).by_runs  # a repeated column: index_select
    assert ColumnPermutation(list(range(n)), n).identity and not ColumnPermutation(many, n + 80).by_runs


@pytest.mark.parametrize("seed", range(4))
def test_column_assembly_matches_cat_permute_and_add(seed) -> None:
    """``ColumnAssembly`` (the sharded collection's groups -> model-order output, with hot-row
    replicas' columns added onto their features') equals concatenating the inputs, gathering
    the copied columns and adding the rest by index, forward and backward, on fresh random
    layouts: blocks of awkward widths in shuffled order over several inputs, some blocks added
    onto others (twice, for one), a single input in order (returned as is), inputs that need no
    gradient, and bad layouts rejected."""
    from neo_train.kernels.columns import ColumnAssembly

    g = torch.Generator().manual_seed(seed)
    widths = torch.randint(1, 9, (int(torch.randint(2, 10, (1,), generator=g)),), generator=g).tolist()
    starts = [sum(widths[:i]) for i in range(len(widths))]
    width = sum(widths)
    # each block once over 1-4 inputs in a random order, then an input of some blocks again (the
    # added ones, as a replica group), then block 0 a third time
    primary = torch.randperm(len(widths), generator=g).tolist()
    cuts = sorted(set(torch.randint(1, len(primary) + 1, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist()))
    groups = [primary[a:b] for a, b in zip([0, *cuts], [*cuts, len(primary)]) if b > a]
    extra = [i for i in torch.randperm(len(widths), generator=g).tolist() if torch.rand(1, generator=g).item() < 0.4]
    groups += [extra, [0]] if extra else [[0]]
    dest = [[c for i in grp for c in range(starts[i], starts[i] + widths[i])] for grp in groups]
    if seed % 2:  # the first input laid out like the output: the others are added onto it in place
        dest = [list(range(width)), *dest, list(range(width))]  # (the last: an added one laid out alike)
    asm = ColumnAssembly([len(d) for d in dest], dest, width)
    assert asm.onto_first == bool(seed % 2)
    b = int(torch.randint(0, 7, (1,), generator=g))
    xs = [torch.randn(b, len(d), generator=g, requires_grad=k != 1) for k, d in enumerate(dest)]
    ys = [x.detach().clone().requires_grad_(x.requires_grad) for x in xs]
    # a computed (non-leaf) first input, as the collection's groups give: the in-place add may change it
    first = xs[0] * 1.0
    out = asm([first, *xs[1:]])
    if asm.onto_first:
        assert out is first
        asm.in_place = False  # and without: the first input stays as it was
        kept = xs[0] * 1.0
        assert torch.equal(asm([kept, *xs[1:]]), out) and torch.equal(kept, xs[0])
    cat = torch.cat(ys, dim=1)
    flat = [c for d in dest for c in d]
    first = {c: j for j, c in reversed(list(enumerate(flat)))}  # each output column's first writer
    want = cat.index_select(1, torch.tensor([first[c] for c in range(width)]))
    later = [j for j, c in enumerate(flat) if first[c] != j]
    if later:
        want = want.index_add(1, torch.tensor([flat[j] for j in later]), cat.index_select(1, torch.tensor(later)))
    assert torch.allclose(out, want, atol=1e-6) and out.shape == (b, width)
    grad = torch.randn(b, width, generator=g)
    out.backward(grad)
    want.backward(grad)
    for x, y in zip(xs, ys):
        assert (x.grad is None) == (not x.requires_grad)
        if x.requires_grad:
            assert torch.equal(x.grad, y.grad)
    one = torch.randn(3, width, generator=g)
    assert ColumnAssembly([width], [list(range(width))], width)([one]) is one
    with pytest.raises(ValueError, match="come from no input"):
        ColumnAssembly([1], [[0]], 2)
    with pytest.raises(ValueError, match="no inputs"):
        ColumnAssembly([], [], 0)
    with pytest.raises(ValueError, match="distinct columns"):
        ColumnAssembly([2], [[0, 0]], 1)
    with pytest.raises(ValueError, match="do not match the input widths"):
        ColumnAssembly([2], [[0]], 1)


def _position_masks(device: str = "cpu"):
    """Masks of awkward sizes and densities: empty, one entry, none / all / some true."""
    g = torch.Generator().manual_seed(7)
    yield torch.zeros(0, dtype=torch.bool, device=device)
    for n in (1, 2, 7, 1000, 4099):
        for p in (0.0, 0.03, 0.5, 1.0):
            yield (torch.rand(n, generator=g) < p).to(device)


def test_positions_where_are_the_true_positions_in_order() -> None:
    from neo_train.sharding.common import positions_where

    for mask in _position_masks():
        want = [i for i, v in enumerate(mask.tolist()) if v]
        got = positions_where(mask, len(want))
        assert got.dtype == torch.int64 and got.tolist() == want, (mask.numel(), len(want))


@pytest.mark.parametrize("seed", range(3))
def test_unit_major_fbgemm_permute_matches_the_gathers(seed, monkeypatch):
    """The input dist's reorder of received ids, [source][unit][bag] -> [unit][source][bag], by
    fbgemm's permute_2D_sparse_data (where fbgemm imports) equals the plain gathers, for
    lengths, ids and weights (bit-cast through int64), on fresh random layouts with empty bags,
    empty sources and one unit."""
    from neo_train.sharding import common

    if common._fbgemm_permute_2d() is None:
        pytest.skip("fbgemm_gpu does not import here: only the gathers run")
    g = torch.Generator().manual_seed(seed)
    for W, U, b in ((2, 13, 5), (3, 1, 7), (4, 3, 1), (2, 2, 4)):
        lengths = torch.randint(0, 4, (W, U, b), generator=g)
        lengths[int(torch.randint(0, W, (1,), generator=g))] = 0 if seed == 2 else lengths[0]  # an empty source
        n = [int(lengths[i].sum()) for i in range(W)]
        parts, at, base = [], [], 0
        for i in range(W):
            w = torch.rand(n[i], generator=g)
            parts += [lengths[i].reshape(-1), torch.randint(0, 10**6, (n[i],), generator=g), common._weights_as_int64(w)]
            at.append((base, base + U * b, base + U * b + n[i]))
            base += U * b + 2 * n[i]
        recv = torch.cat(parts)
        if sum(n) == 0:
            continue
        for weighted in (False, True):
            fast = common._unit_major(recv, at, n, weighted, W, U, b)
            with monkeypatch.context() as m:
                m.setattr(common, "_fbgemm_permute_2d", lambda: None)
                slow = common._unit_major(recv, at, n, weighted, W, U, b)
            assert torch.equal(fast.lengths, slow.lengths) and fast.lengths.dtype == slow.lengths.dtype == torch.int32
            assert torch.equal(fast.values, slow.values)
            assert (fast.weights is None) == (slow.weights is None) == (not weighted)
            if weighted:
                assert torch.equal(fast.weights, slow.weights)
