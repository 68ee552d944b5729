"""The data-parallel gradient exchange (sharding/data_parallel.py): each rank's touched rows
either all-reduced as a dense (rows, D) buffer or all-gathered as (id, row) pairs and summed in
rank order, chosen per step from the exchanged counts alike on every rank.

Both exchanges train the same tables and optimizer state (within float32 rounding: the dense
all-reduce sums in the ring's order) for SGD, row-wise AdaGrad and Adam, on 2 and 3 ranks, over
steps where a rank touches no row, every rank touches the same rows, every row is touched (auto
picks dense), few rows are touched (auto picks sparse) and no rank touches anything; the replicas
stay bitwise identical on every rank; each step's bytes go to the exchange it chose.
"""
from __future__ import annotations

import zlib

import pytest
import torch

from neo_train.config import ModelConfig, TableConfig
from neo_train.data.batch import SparseFeatures
from neo_train.sharding import ShardingPlan
from neo_train.testing import BackwardMark, run_ranks


def _model(dims: tuple[int, int, int]) -> ModelConfig:
    a, b, m = dims
    return ModelConfig((
        TableConfig("a", 30, a, pooling_factor=2.0),  # weighted ids (see _batch)
        TableConfig("b", 20, b, pooling_factor=2.0, feature_names=("b1", "b2")),  # one table, two features
        TableConfig("m", 9, m, pooling="mean", pooling_factor=2.0),  # mean pooling: per-id weights 1/L
    ), bottom_mlp=(4,), interaction="cat")  # fmt: skip


MODELS = {"reference": _model((4, 6, 2)), "fbgemm": _model((4, 8, 4))}  # fbgemm: dims multiples of 4
MODEL = MODELS["reference"]
FEATURES = {"a": "a", "b1": "b", "b2": "b", "m": "m"}
B = 4
# per step: what the ranks' batches hold. auto's choice: dense costs 2 (W-1)/W 4 (sum R_t (D_t + 1)
# + W T) bytes, sparse (W-1) max_j n_j 4 (max D_t + 1): with the reference dims dense once a rank
# touches >= 46 rows at W = 2, >= 31 at W = 3; "all_rows" touches all 59, "few" <= 9. After a
# dense step the next is dense without a counts exchange, so "few" right after "all_rows" is too.
STEPS = ("one_idle", "same", "all_rows", "few", "few", "nobody", "random", "all_rows", "few")
AUTO = {2: "dense", 3: "dense", 4: "sparse", 5: "sparse", 7: "dense", 8: "dense"}  # step -> auto's exchange


def _batch(step: int, kind: str, rank: int) -> SparseFeatures:
    g = torch.Generator().manual_seed(1000 * step + (0 if kind == "same" else rank + 1))
    feats = {}
    for f, t in FEATURES.items():
        rows = MODEL.table(t).num_rows
        if kind == "nobody" or (kind == "one_idle" and rank == 1):
            lens = torch.zeros(B, dtype=torch.int32)
        elif kind == "all_rows":  # every row of the table, twice over, in random bags
            lens = torch.full((B,), 2 * rows // B + 1, dtype=torch.int32)
        elif kind == "few":
            lens = torch.tensor([1, 0, 1, 0], dtype=torch.int32)
        else:
            lens = torch.randint(0, 4, (B,), generator=g, dtype=torch.int32)
        n = int(lens.sum())
        if kind == "all_rows":
            ids = torch.cat([torch.randperm(rows, generator=g), torch.randint(0, rows, (n - rows,), generator=g)])
        elif kind == "few":
            ids = torch.randint(0, 3, (n,), generator=g)  # few distinct rows
        else:
            ids = torch.randint(0, rows, (n,), generator=g)
        w = torch.rand(n, generator=g) + 0.5
        feats[f] = (ids.to(torch.int64), lens, w)
    return SparseFeatures.from_features(feats, batch_size=B)


def _body(comm, optimizer: str, backend: str, modes: tuple[str, ...]):
    from neo_train.comm.timing import TimingCommunicator
    from neo_train.kernels import SparseOptimizerSpec
    from neo_train.sharding import ShardedEmbeddingBagCollection
    from neo_train.train.timing import PhaseTimer

    comm = TimingCommunicator(comm, PhaseTimer())
    model = MODELS[backend]
    plan = ShardingPlan.uniform(model, "data_parallel", comm.world_size)
    spec = SparseOptimizerSpec(optimizer, lr=0.1)
    out = {}
    for mode in modes:
        ebc = ShardedEmbeddingBagCollection(model, plan, comm, spec, backend=backend, seed=5)
        group = ebc.groups["data_parallel"]
        group.grad_sync = mode
        pooled, chosen, sent, counted = [], [], [], []
        for s, kind in enumerate(STEPS):
            before = dict(comm.bytes_by_tag)
            counted.append(mode == "sparse" or (mode == "auto" and not group._dense_next))  # counts exchanged first
            y = ebc(_batch(s, kind, comm.rank))
            up = torch.randn(B, y.shape[1], generator=torch.Generator().manual_seed(7 * s + comm.rank))
            (y * up).sum().backward()
            pooled.append(y.detach().clone())
            chosen.append(group.last_grad_sync)
            sent.append({k: v - before.get(k, 0) for k, v in comm.bytes_by_tag.items() if v != before.get(k, 0)})
        k = group.kernel
        local = [(k.get_table(i), k.get_state(i)) for i in range(len(model.tables))]
        out[mode] = (pooled, chosen, sent, ebc.gather_tables(), local, k.optimizer_step, counted)
    return out


def _check(W: int, optimizer: str, backend: str) -> None:
    res = run_ranks(_body, W, optimizer, backend, ("dense", "sparse", "auto"))
    r0 = res[0]
    assert r0["dense"][1] == ["dense"] * len(STEPS) and r0["sparse"][1] == ["sparse"] * len(STEPS)
    auto = r0["auto"][1]
    assert all(auto[s] == how for s, how in AUTO.items()), auto  # it flips both ways
    tables = MODELS[backend].tables
    # grads, marks, counts, and one value that takes narrower tables' padding when dims differ
    dense_bytes = 4 * (sum(t.num_rows * (t.dim + 1) for t in tables) + W * len(tables) + (len({t.dim for t in tables}) > 1))
    for r in range(W):
        assert res[r]["auto"][1] == auto  # every rank chose alike
        for mode in ("dense", "sparse", "auto"):
            pooled, chosen, sent, _, local, steps, counted = res[r][mode]
            assert steps == len(STEPS)  # the fused optimizer ran every step, touched rows or not
            if mode == "auto":  # counts exchanged first at the start and after a step whose counts chose sparse
                assert counted[0] and not counted[3] and counted[4], counted  # 3: dense at once after "all_rows"
                for s in range(1, len(STEPS)):
                    if chosen[s - 1] == "sparse" or (counted[s - 1] and chosen[s - 1] == "dense"):
                        assert counted[s] == (chosen[s - 1] == "sparse"), (s, counted, chosen)
            for s, how in enumerate(chosen):  # the bytes went to the exchange it chose
                assert sent[s].get("dp_grad_counts", 0) == (8 * len(tables) if counted[s] else 0), (mode, s, sent[s])
                other = "dp_grad_allreduce" if how == "sparse" else "dp_grad_sparse"
                assert other not in sent[s], (mode, s, sent[s])
                if how == "dense":
                    assert sent[s]["dp_grad_allreduce"] == dense_bytes
            for s in range(len(STEPS)):
                torch.testing.assert_close(pooled[s], res[r]["dense"][0][s], rtol=1e-5, atol=1e-6)
            for (w, st), (w0, st0) in zip(local, res[0][mode][4]):  # replicas: bitwise alike
                assert torch.equal(w, w0) and all(torch.equal(v, st0[n]) for n, v in st.items()), (mode, r)
    few = STEPS.index("few")
    assert r0["sparse"][2][few]["dp_grad_sparse"] > 0 and "dp_grad_sparse" not in r0["sparse"][2][STEPS.index("nobody")]
    for mode in ("sparse", "auto"):
        for name, entry in r0["dense"][3].items():
            for key, value in entry.items():
                torch.testing.assert_close(r0[mode][3][name][key], value, rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"{mode}: table {name} {key}: {m}")  # fmt: skip


CASES = [("sgd", 2, "reference"), ("rowwise_adagrad", 3, "reference"), ("adam", 3, "reference"), ("rowwise_adagrad", 2, "fbgemm")]
SLOW = [(o, w, be) for o in ("sgd", "rowwise_adagrad", "adam") for w in (2, 3) for be in ("reference", "fbgemm")
        if (o, w, be) not in CASES and not (o == "adam" and be == "fbgemm")]  # fbgemm has no Adam  # fmt: skip


@pytest.mark.parametrize("optimizer,W,backend", CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW])
def test_sparse_and_dense_exchanges_train_alike(optimizer: str, W: int, backend: str) -> None:
    from neo_train.kernels import available_backends

    if backend not in available_backends():
        pytest.skip(f"backend {backend} is not installed")
    _check(W, optimizer, backend)


def test_sparse_sum_is_in_rank_order() -> None:
    """A row every rank touches: the sparse exchange's sum is ((g_0 + g_1) + g_2), the same bits
    on every rank (checked against a sum done here in that order)."""
    res = run_ranks(_rank_order_body, 3)
    grads = [r[0] for r in res]
    want = (grads[0] + grads[1]) + grads[2]
    for r in res:
        assert torch.equal(r[1], want)


def _rank_order_body(comm):
    from neo_train.kernels import SparseOptimizerSpec
    from neo_train.sharding import ShardedEmbeddingBagCollection

    model = ModelConfig((TableConfig("a", 5, 3, pooling_factor=1.0),), bottom_mlp=(3,), interaction="cat")
    plan = ShardingPlan.uniform(model, "data_parallel", comm.world_size)
    ebc = ShardedEmbeddingBagCollection(model, plan, comm, SparseOptimizerSpec("sgd", lr=1.0), backend="reference", seed=1)
    group = ebc.groups["data_parallel"]
    group.grad_sync = "sparse"
    seen = []
    update = group.apply_global_update
    group.apply_global_update = lambda grad, *a: (seen.append(grad.clone()), update(grad, *a))
    group.kernel.set_table(0, torch.zeros(5, 3))  # SGD, lr 1, from zeros: the row becomes -(the summed gradient)
    ids = torch.tensor([2], dtype=torch.int64)
    y = ebc(SparseFeatures.from_features({"a": (ids, torch.tensor([1], dtype=torch.int32), None)}))
    g = torch.randn(1, 3, generator=torch.Generator().manual_seed(zlib.crc32(b"order") + comm.rank)) * 10 ** comm.rank
    (y * g).sum().backward()
    return seen[0][0] * (1.0 / comm.world_size), -group.kernel.get_table(0)[2]  # the row's gradient here (with the 1/W), the sum


@pytest.mark.parametrize("dims", [(4, 6, 2), (4, 4, 4)], ids=["mixed_dims", "uniform"])
def test_touched_rows_summed_densely_equal_the_sorted_sums(dims) -> None:
    """Few rows (R <= the batch's ids N, as hot-row replicas have) are summed into a buffer of
    every row instead of sorting the ids: the same touched rows, bit-identical sums and counts,
    the same tail (key 0, zero rows) past them; for N below, at and above R, repeated and absent
    rows, a table nobody touched, weighted and mean-pooled features; the same sums from a
    gradient that is a column slice of a wider tensor."""
    res = run_ranks(_dense_vs_sorted_body, 1, dims)
    assert res[0] == 6


def _dense_vs_sorted_body(comm, dims):
    from neo_train.kernels import SparseOptimizerSpec
    from neo_train.sharding import ShardedEmbeddingBagCollection

    model = _model(dims)
    plan = ShardingPlan.uniform(model, "data_parallel", comm.world_size)
    ebc = ShardedEmbeddingBagCollection(model, plan, comm, SparseOptimizerSpec("sgd", lr=0.1), backend="reference", seed=3)
    group = ebc.groups["data_parallel"]
    group.grad_sync = "dense"  # no counts exchange in _touched
    R = group._row_off[-1]
    checked = 0
    gen = torch.Generator().manual_seed(11)
    for n_ids, skip in [(R - 1, None), (R, None), (3 * R, None), (2 * R, "a"), (2 * R, "b"), (2 * R, "m")]:
        feats = {}
        for f, t in FEATURES.items():
            rows = model.table(t).num_rows
            lens = torch.randint(0, 2 * n_ids // (len(FEATURES) * B) + 1, (B,), generator=gen)
            if t == skip:
                lens.zero_()
            n = int(lens.sum())
            ids = torch.randint(0, rows, (n,), generator=gen)
            feats[f] = (ids, lens.to(torch.int32), torch.rand(n, generator=gen) + 0.5)
        sp = SparseFeatures.from_features(feats, batch_size=B)
        values, offsets = sp.values, sp.offsets()
        grad = torch.randn(B, sum(group.dims), generator=gen)
        t1 = group._touched(values, offsets, sp.weights, dense=False)
        t2 = group._touched(values, offsets, sp.weights, dense=True)
        r1, r2 = group._touched_grads(grad, t1), group._touched_grads(grad, t2)
        for pad in (group._dmax, 1):  # the gradient as a column slice of a wider tensor, its rows D-aligned or not
            wide = torch.randn(B, pad + grad.shape[1], generator=gen)
            wide[:, pad:] = grad
            assert torch.equal(group._touched_grads(wide[:, pad:], t1), r1)
        n = int(t1.counts.sum())
        assert torch.equal(t1.counts, t2.counts) and n == int(t1.keys[:n].unique().numel()) > 0
        assert torch.equal(t1.keys[:n], t2.keys[:n]) and torch.equal(r1[:n], r2[:n])
        assert t2.keys.numel() == R and not t2.keys[n:].any() and not r2[n:].any()
        if skip is not None:
            ti = list(dict.fromkeys(FEATURES.values())).index(skip)
            assert int(t1.counts[ti]) == 0
        checked += 1
    return checked


@pytest.mark.parametrize("dims", [(4, 6, 2), (4, 4, 4)], ids=["mixed_dims", "uniform"])
def test_gathered_rows_are_summed_in_rank_order_into_the_first_bag_of_their_key(dims) -> None:
    """The sparse exchange's sum (``_sum_gathered``) of three ranks' rows: table t's gathered keys
    ascending as one-id bags of its first feature, each key's sum (rank 0 + rank 1, then + rank
    2) in the bag of its first occurrence, zeros in its repeats' bags and past a table's keys."""
    assert run_ranks(_gathered_body, 1, dims)[0]


def _gathered_body(comm, dims):
    from neo_train.kernels import SparseOptimizerSpec
    from neo_train.sharding import ShardedEmbeddingBagCollection

    model = _model(dims)
    plan = ShardingPlan.uniform(model, "data_parallel", 1)
    ebc = ShardedEmbeddingBagCollection(model, plan, comm, SparseOptimizerSpec("sgd", lr=0.1), backend="reference", seed=3)
    group = ebc.groups["data_parallel"]
    off, D = group._row_off, group._dmax  # tables a, b, m; b's features b1 (its first) and b2
    sent = [{"a": [7, 3], "b": [5]}, {"a": [7], "b": [9, 5]}, {"a": [3], "m": [1]}]  # per rank: table -> rows
    gen = torch.Generator().manual_seed(7)
    flat, n, every, grads = [], [], [], {}
    for j, by_table in enumerate(sent):
        rows, keys = [], []
        for ti, t in enumerate("abm"):
            for r in by_table.get(t, []):
                g = torch.zeros(D)
                g[: group._dims[ti]] = torch.randn(group._dims[ti], generator=gen) * 10**j
                grads.setdefault((t, r), []).append(g)
                rows.append(g)
                keys.append(off[ti] + r)
        flat += [torch.cat(rows), torch.tensor(keys, dtype=torch.int32).view(torch.float32)]  # rank j's part
        n.append(len(keys))
        every.append([len(by_table.get(t, [])) for t in "abm"])
    values, m, g_out = group._sum_gathered(torch.cat(flat), n, every)
    assert m == [4, 3, 1] and values.tolist() == [3, 3, 7, 7, 5, 5, 9, 1]
    want = torch.zeros_like(g_out)
    col = {"a": 0, "b": group._col[1], "m": group._col[3]}
    for ti, (t, bags) in enumerate([("a", [3, None, 7, None]), ("b", [5, None, 9]), ("m", [1])]):
        for i, r in enumerate(bags):
            if r is not None:
                total = grads[(t, r)][0]
                for g in grads[(t, r)][1:]:
                    total = total + g  # rank order
                want[i, col[t] : col[t] + group._dims[ti]] = total[: group._dims[ti]]
    assert g_out.shape == (4, sum(group.dims)) and torch.equal(g_out, want)
    return True


class _Logged:
    """The communicator, logging each dp_grad_* call (tag, async?) and each wait on its handle."""

    def __init__(self, inner, log: list):
        self._inner, self._log = inner, log

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _logged(self, op: str, *args, async_op=False, tag="", **kw):
        got = getattr(self._inner, op)(*args, async_op=async_op, tag=tag, **kw)
        if not tag.startswith("dp_grad_"):
            return got
        self._log.append(("call", tag, async_op))
        if not async_op:
            return got
        from neo_train.comm.interface import Handle

        return Handle(lambda: (self._log.append(("wait", tag)), got.wait())[1])

    def all_gather_v(self, x, sizes, **kw):
        return self._logged("all_gather_v", x, sizes, **kw)

    def all_reduce(self, x, op="sum", **kw):
        return self._logged("all_reduce", x, op, **kw)


def _overlap_body(comm):
    from neo_train.kernels import SparseOptimizerSpec
    from neo_train.sharding import ShardedEmbeddingBagCollection

    log: list = []
    plan = ShardingPlan.uniform(MODEL, "data_parallel", comm.world_size)
    ebc = ShardedEmbeddingBagCollection(MODEL, plan, _Logged(comm, log), SparseOptimizerSpec("sgd", lr=0.1),
                                        backend="reference", seed=5)  # fmt: skip
    group = ebc.groups["data_parallel"]
    out = []
    for s, kind in enumerate(("few", "all_rows", "few")):  # auto: sparse, then dense twice (no counts)
        log.clear()
        h = torch.ones(B, 1, requires_grad=True)
        m = BackwardMark.apply(h * 2.0, log)  # recorded before the lookup: its backward runs after the lookup's
        y = ebc(_batch(s, kind, comm.rank))
        log.append("forward done")
        ((y * torch.randn(y.shape, generator=torch.Generator().manual_seed(s))).sum() + m.sum()).backward()
        out.append((group.last_grad_sync, list(log)))
    return out


def test_the_gradient_exchange_overlaps_the_rest_of_the_backward() -> None:
    """The counts exchange starts in the forward (the touched rows are known from the ids) and
    is read in the backward; the gradient exchange starts in the lookup's backward and is waited
    for once the graph is done, so the backward of what ran before the lookup runs meanwhile."""
    for r in run_ranks(_overlap_body, 2):
        (how0, log0), (how1, log1), (how2, log2) = r
        assert how0 == "sparse" and log0 == [("call", "dp_grad_counts", True), "forward done", ("wait", "dp_grad_counts"),
                                             ("call", "dp_grad_sparse", True), "mark", ("wait", "dp_grad_sparse")], log0  # fmt: skip
        assert how1 == "dense" and log1 == [("call", "dp_grad_counts", True), "forward done", ("wait", "dp_grad_counts"),
                                            ("call", "dp_grad_allreduce", True), "mark", ("wait", "dp_grad_allreduce")], log1  # fmt: skip
        # after a dense step the next is dense at once: no counts exchange
        assert how2 == "dense" and log2 == ["forward done", ("call", "dp_grad_allreduce", True), "mark",
                                            ("wait", "dp_grad_allreduce")], log2  # fmt: skip
