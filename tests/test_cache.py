"""The embedding row cache (kernels/cache.py) against its inner backend holding every row resident.

Exactness is bit-for-bit (torch.equal): rows are independent under every sparse optimizer and
each row's weight and state travel together, so no tolerance is needed. Every cached run checks
that the cache really evicted (a test with a cache that never evicts would prove nothing).
"""
from __future__ import annotations

import math
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from neo_train.kernels import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec, available_backends
from neo_train.kernels import create_embedding_bag
from neo_train.kernels import cache
from neo_train.kernels.cache import CachedEmbeddingBag

# 3 tables of awkward sizes (dims multiples of 4 for fbgemm), one mean-pooled, read by 4 features:
# table 1 ("b", mean) by features 1 and 3.
TABLES = [TableSpec(97, 4, "sum", "a"), TableSpec(1000, 8, "mean", "b"), TableSpec(13, 12, "sum", "c")]
FTM = [0, 1, 2, 1]
B, STEPS = 16, 8
FACTORS = (0.2, 0.5, 1.0)

Batch = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None", torch.Tensor]


def _batches(seed: int, weighted: bool, n: int = STEPS, tables: list[TableSpec] = TABLES,
             ftm: list[int] = FTM) -> list[Batch]:
    """n batches (values, offsets, per-sample weights | None, target): bag lengths 0..4 (empty
    bags included), Zipf-ish ids (rows * u^3: low ids hot), fresh per step."""
    g = torch.Generator().manual_seed(seed)
    F = len(ftm)
    rows = torch.tensor([tables[t].rows for t in ftm]).repeat_interleave(B)  # (F*B,)
    total_dim = sum(tables[t].dim for t in ftm)
    out = []
    for _ in range(n):
        lengths = torch.randint(0, 5, (F * B,), generator=g)
        offsets = torch.zeros(F * B + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        u = torch.rand(int(offsets[-1]), generator=g)
        values = (rows.repeat_interleave(lengths) * u**3).to(torch.int64)
        psw = torch.rand(values.numel(), generator=g) + 0.5 if weighted else None
        out.append((values, offsets, psw, torch.randn(B, total_dim, generator=g)))
    return out


def _cache_rows(batches: list[Batch], factor: float, tables: list[TableSpec] = TABLES,
                ftm: list[int] = FTM) -> list[int]:
    """ceil(factor * rows) per table, raised to one batch's unique rows where that is more."""
    need = [0] * len(tables)
    for values, offsets, _, _ in batches:
        bounds = offsets[::B].tolist()
        for t in range(len(tables)):
            ids = [values[bounds[f] : bounds[f + 1]] for f, ft in enumerate(ftm) if ft == t]
            need[t] = max(need[t], torch.cat(ids).unique().numel())
    return [max(n, math.ceil(factor * s.rows)) for n, s in zip(need, tables)]


def _train(m: FusedEmbeddingBag, batches: list[Batch], prefetch: bool = False) -> list[torch.Tensor]:
    """Forward, sum-of-squares loss, backward per batch; with ``prefetch`` the next batch is
    prefetched between a batch's forward and its backward (the training pipeline's order)."""
    outs = []
    for i, (values, offsets, psw, target) in enumerate(batches):
        out = m(values, offsets, psw)
        if prefetch and i + 1 < len(batches):
            m.prefetch(batches[i + 1][0], batches[i + 1][1])
        ((out - target) ** 2).sum().backward()
        outs.append(out.detach())
    return outs


def _cached(backend: str, opt: SparseOptimizerSpec, cache_rows: list[int], policy: str, store: str,
            tmp_path: Path, weight_dtype: torch.dtype = torch.float32) -> CachedEmbeddingBag:
    """A cached kernel over TABLES; store "host" or "mmap" (its own directory under tmp_path)."""
    storage_dir = None if store == "host" else tmp_path / f"store_{policy}_{'_'.join(map(str, cache_rows))}"
    return CachedEmbeddingBag(TABLES, opt, cache_rows=cache_rows, policy=policy, inner_backend=backend,
                              storage_dir=storage_dir, feature_table_map=FTM, weight_dtype=weight_dtype)


def _assert_same(ref: FusedEmbeddingBag, ref_outs: list[torch.Tensor], m: FusedEmbeddingBag,
                 outs: list[torch.Tensor]) -> None:
    for step, (a, b) in enumerate(zip(ref_outs, outs)):
        assert torch.equal(a, b), f"output of step {step} differs"
    for t in range(len(ref.tables)):
        assert torch.equal(ref.get_table(t), m.get_table(t)), f"table {t}"
        want, got = ref.get_state(t), m.get_state(t)
        assert want.keys() == got.keys()
        for k in want:
            assert torch.equal(want[k], got[k]), f"table {t} state {k}"
    assert ref.optimizer_step == m.optimizer_step


def _check_exact(backend: str, opt: SparseOptimizerSpec, policy: str, store: str, weighted: bool,
                 tmp_path: Path, seed: int, prefetch: bool = False,
                 weight_dtype: torch.dtype = torch.float32) -> None:
    """Every factor of FACTORS: cached training == resident training, bit for bit; factors below
    1 must have evicted."""
    batches = _batches(seed, weighted)
    ref = create_embedding_bag(backend, TABLES, opt, feature_table_map=FTM, weight_dtype=weight_dtype)
    ref_outs = _train(ref, batches)
    assert ref.optimizer_step == STEPS
    for factor in FACTORS:
        m = _cached(backend, opt, _cache_rows(batches, factor), policy, store, tmp_path, weight_dtype=weight_dtype)
        outs = _train(m, batches, prefetch=prefetch)
        _assert_same(ref, ref_outs, m, outs)
        stats = m.stats()
        assert (stats["evictions"] > 0) == (factor < 1.0), (factor, stats)
        assert stats["hits"] + stats["misses"] == stats["unique_rows"]
        if prefetch:
            assert stats["prefetched_rows"] > 0


OPTIMIZERS = {  # id: (optimizer, per-sample weights)
    "sgd": (SparseOptimizerSpec("sgd", lr=0.1), False),
    "adagrad-psw": (SparseOptimizerSpec("adagrad", lr=0.1), True),
    "rowwise_adagrad": (SparseOptimizerSpec("rowwise_adagrad", lr=0.1), False),
    "adam-psw": (SparseOptimizerSpec("adam", lr=0.05), True),
    "rowwise_adagrad-wd-psw": (SparseOptimizerSpec("rowwise_adagrad", lr=0.1, weight_decay=0.01), True),
}


def _seed(request: pytest.FixtureRequest) -> int:
    """A different, reproducible seed for every parametrisation."""
    return zlib.crc32(request.node.name.encode())


@pytest.mark.parametrize("store", ["host", "mmap"])
@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("case", list(OPTIMIZERS))
def test_exact_vs_resident_reference(case, policy, store, tmp_path, request):
    opt, weighted = OPTIMIZERS[case]
    _check_exact("reference", opt, policy, store, weighted, tmp_path, _seed(request))


def _need_fbgemm() -> None:
    if "fbgemm" not in available_backends():
        pytest.skip("fbgemm_gpu unavailable")


@pytest.mark.parametrize("store", ["host", "mmap"])
@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad"])
def test_exact_vs_resident_fbgemm(kind, policy, store, tmp_path, request):
    _need_fbgemm()
    opt = SparseOptimizerSpec(kind, lr=0.1)
    _check_exact("fbgemm", opt, policy, store, kind == "adagrad", tmp_path, _seed(request))


@pytest.mark.parametrize("backend,kind,policy", [
    ("reference", "adam", "lru"), ("reference", "rowwise_adagrad", "lfu"), ("fbgemm", "rowwise_adagrad", "lru"),
    ("triton", "adam", "lfu"),
])  # fmt: skip
def test_exact_with_prefetch(backend, kind, policy, tmp_path):
    """Batch i+1 prefetched between batch i's forward and backward: still exact."""
    if backend == "fbgemm":
        _need_fbgemm()
    if backend == "triton" and ("triton" not in available_backends() or os.environ.get("TRITON_INTERPRET") != "1"):
        pytest.skip("triton runs on CPU tensors only in its interpreter (TRITON_INTERPRET=1)")
    _check_exact(backend, SparseOptimizerSpec(kind, lr=0.1), policy, "host", True, tmp_path, seed=7, prefetch=True)


@pytest.mark.parametrize("dtype,store", [(torch.float16, "host"), (torch.bfloat16, "mmap")])
def test_half_weights_exact(dtype, store, tmp_path):
    _check_exact("reference", SparseOptimizerSpec("adagrad", lr=0.1), "lru", store, False, tmp_path, 3,
                 weight_dtype=dtype)


# ---- pinning, errors, policies ---------------------------------------------------------------
ONE = [TableSpec(10, 4, "sum", "one")]


def _bag(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One feature, one bag holding ``ids``."""
    return torch.tensor(ids, dtype=torch.int64), torch.tensor([0, len(ids)], dtype=torch.int64)


def test_pinned_rows_are_not_evicted_and_prefetch_defers():
    opt = SparseOptimizerSpec("adagrad", lr=0.1)
    ref = create_embedding_bag("reference", ONE, opt)
    m = CachedEmbeddingBag(ONE, opt, cache_rows=[4])
    for mod in (ref, m):  # rows 5..8 fill the cache
        mod(*_bag([5, 6, 7, 8])).sum().backward()
    outs = [mod(*_bag([0, 1, 2])) for mod in (ref, m)]
    assert m.resident_rows(0).tolist() == [0, 1, 2, 8]  # LRU evicted 5, 6, 7; 8 is unpinned
    m.prefetch(*_bag([3, 4]))  # two misses, one unpinned slot: deferred, nothing moves
    assert m.stats()["prefetch_deferred"] == 1 and m.stats()["prefetched_rows"] == 0
    assert m.resident_rows(0).tolist() == [0, 1, 2, 8]
    m.prefetch(*_bag([3]))  # fits: evicts 8 (dirty: written back), pinned until the next lookup
    assert m.resident_rows(0).tolist() == [0, 1, 2, 3]
    assert m.stats()["prefetched_rows"] == 1
    m.prefetch(*_bag([9]))  # every slot pinned (batch [0, 1, 2] and the prefetched 3)
    assert m.stats()["prefetch_deferred"] == 2
    for out in outs:  # batch [0, 1, 2]'s backward still finds its rows
        (out * 2).sum().backward()
    before = m.stats()
    for mod in (ref, m):
        mod(*_bag([3, 9])).sum().backward()
    after = m.stats()
    assert after["hits"] - before["hits"] == 0  # 3 was prefetched (a miss of this batch), 9 fetched now
    assert after["misses"] - before["misses"] == 1
    assert torch.equal(ref.get_table(0), m.get_table(0))
    assert torch.equal(ref.get_state(0)["sum"], m.get_state(0)["sum"])


def test_prefetch_of_a_batch_larger_than_the_cache_defers():
    m = CachedEmbeddingBag(ONE, SparseOptimizerSpec("sgd"), cache_rows=[3])
    m.prefetch(*_bag([0, 1, 2, 3, 4, 4]))
    assert m.stats()["prefetch_deferred"] == 1 and m.resident_rows(0).numel() == 0
    with pytest.raises(ValueError, match="needs 5 unique rows"):
        m(*_bag([0, 1, 2, 3, 4, 4]))


def test_cache_too_small_names_table_rows_and_factor():
    m = CachedEmbeddingBag(TABLES, SparseOptimizerSpec("sgd"), cache_rows=[97, 5, 13], feature_table_map=FTM)
    values = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7], dtype=torch.int64)  # feature 1 reads table "b"
    offsets = torch.tensor([0, 0, 8, 8, 8])
    with pytest.raises(ValueError, match=r"table 'b' needs 8 unique rows .* holds 5 rows.* at least 0\.008 \(= 8/1000"):
        m(values, offsets)
    assert m.resident_rows(0).numel() == m.resident_rows(1).numel() == 0  # nothing changed


def test_cache_rows_clamped_and_bad_arguments():
    m = CachedEmbeddingBag(TABLES, SparseOptimizerSpec("sgd"), cache_rows=[0, 5000, 4], feature_table_map=FTM)
    assert m.cache_rows == (1, 1000, 4) and m.tier == "host" and m.policy == "lru"
    with pytest.raises(ValueError, match="policy"):
        CachedEmbeddingBag(ONE, SparseOptimizerSpec("sgd"), cache_rows=[4], policy="fifo")
    with pytest.raises(ValueError, match="2 cache_rows for 1 tables"):
        CachedEmbeddingBag(ONE, SparseOptimizerSpec("sgd"), cache_rows=[4, 4])
    if "fbgemm" in available_backends():
        with pytest.raises(ValueError, match=r"cached.*'fbgemm'.*adam"):
            CachedEmbeddingBag([TableSpec(10, 4)], SparseOptimizerSpec("adam"), cache_rows=[4], inner_backend="fbgemm")


@pytest.mark.parametrize("policy,resident", [("lru", [1, 2, 3]), ("lfu", [0, 2, 3])])
def test_lru_and_lfu_pick_different_victims(policy, resident):
    """Row 0 is looked up 4 times first, then 1, 2, 3 once each in a cache of 3: LRU evicts the
    oldest (0), LFU the least frequent (1: count 1, older than 2)."""
    m = CachedEmbeddingBag(ONE, SparseOptimizerSpec("sgd"), cache_rows=[3], policy=policy)
    with torch.no_grad():
        for ids in ([0, 0, 0, 0], [1], [2], [3]):
            m(*_bag(ids))
    assert m.resident_rows(0).tolist() == resident
    assert m.stats()["evictions"] == 1


# ---- statistics ------------------------------------------------------------------------------
def test_stats_account_rows_bytes_and_dirty_writebacks():
    table = [TableSpec(50, 8, "sum", "s")]
    opt = SparseOptimizerSpec("adagrad", lr=0.1)
    batches = _batches(11, False, n=10, tables=table, ftm=[0])
    m = CachedEmbeddingBag(table, opt, cache_rows=_cache_rows(batches, 0.2, table, [0]))
    row_bytes = 8 * 4 + 8 * 4  # float32 weight + adagrad "sum", per row
    hits = misses = 0
    for values, offsets, _, target in batches:  # count hits / misses independently
        before = set(m.resident_rows(0).tolist())
        uniq = set(values.tolist())
        hits += len(uniq & before)
        misses += len(uniq - before)
        ((m(values, offsets) - target) ** 2).sum().backward()
    s = m.stats()
    assert (s["hits"], s["misses"]) == (hits, misses)
    assert s["hits"] + s["misses"] == s["unique_rows"] and s["lookups"] == sum(b[0].numel() for b in batches)
    assert s["misses"] > m.cache_rows[0] and s["evictions"] == s["misses"] - m.resident_rows(0).numel()
    assert s["bytes_read"] == s["misses"] * row_bytes
    m.flush()  # every fetched row was looked up under grad: each is written back exactly once
    s = m.stats()
    assert s["writebacks"] == s["misses"] and s["bytes_written"] == s["writebacks"] * row_bytes
    with torch.no_grad():  # evaluation: fetches and evicts, dirties nothing
        for values, offsets, _, _ in _batches(12, False, n=4, tables=table, ftm=[0]):
            m(values, offsets)
    m.flush()
    after = m.stats()
    assert after["evictions"] > s["evictions"] and after["writebacks"] == s["writebacks"]
    assert after["fetch_s"] > 0


# ---- accessors and stores --------------------------------------------------------------------
def test_set_get_round_trip_while_resident(tmp_path):
    """set_table/set_state on rows that are resident (and dirty): read back exactly, and the next
    training steps see them (compared with a resident kernel given the same values, learning
    rate and Adam step)."""
    opt = SparseOptimizerSpec("adam", lr=0.05)
    batches = _batches(5, False, n=6)
    ref = create_embedding_bag("reference", TABLES, opt, feature_table_map=FTM)
    m = _cached("reference", opt, _cache_rows(batches, 0.3), "lfu", "mmap", tmp_path)
    outs = [_train(mod, batches[:3]) for mod in (ref, m)]
    g = torch.Generator().manual_seed(0)
    for t, spec in enumerate(TABLES):
        assert m.resident_rows(t).numel() > 0
        w = torch.randn(spec.rows, spec.dim, generator=g)
        st = {k: torch.rand(v.shape, generator=g) for k, v in ref.get_state(t).items()}
        for mod in (ref, m):
            mod.set_table(t, w)
            mod.set_state(t, st)
        assert torch.equal(m.get_table(t), w)
        assert all(torch.equal(m.get_state(t)[k], v) for k, v in st.items())
    for mod in (ref, m):
        mod.set_learning_rate(0.02)
        mod.set_optimizer_step(10)
    assert m.optimizer_step == 10
    outs = [o + _train(mod, batches[3:]) for o, mod in zip(outs, (ref, m))]
    _assert_same(ref, outs[0], m, outs[1])


def test_write_rows_in_chunks_equals_set_table():
    """Chunked write_rows (one cached kernel) and set_table (another) over resident, dirty rows
    both equal set_table on a resident kernel, weights and optimizer state, through more training."""
    opt = SparseOptimizerSpec("rowwise_adagrad", lr=0.1)
    batches = _batches(9, False, n=3)
    ref = create_embedding_bag("reference", TABLES, opt, feature_table_map=FTM)
    a, b = (CachedEmbeddingBag(TABLES, opt, cache_rows=_cache_rows(batches, 0.3), feature_table_map=FTM)
            for _ in range(2))
    for m in (ref, a, b):
        _train(m, batches[:2])  # rows resident and dirty in a and b
    g = torch.Generator().manual_seed(1)
    for t, spec in enumerate(TABLES):
        w = torch.randn(spec.rows, spec.dim, generator=g)
        ref.set_table(t, w)
        a.set_table(t, w)
        for start in range(0, spec.rows, 7):  # chunks that do not divide the rows
            b.write_rows(t, start, w[start : start + 7])
        assert torch.equal(a.get_table(t), w) and torch.equal(b.get_table(t), w)
    ref_outs = _train(ref, batches[2:])
    for m in (a, b):
        _assert_same(ref, ref_outs, m, _train(m, batches[2:]))
    with pytest.raises(ValueError, match="outside"):
        b.write_rows(0, 95, torch.zeros(3, 4))


def test_mmap_store_files_survive_flush(tmp_path):
    opt = SparseOptimizerSpec("adagrad", lr=0.1)
    batches = _batches(4, False, n=4)
    m = CachedEmbeddingBag(TABLES, opt, cache_rows=_cache_rows(batches, 0.2), feature_table_map=FTM,
                           storage_dir=tmp_path / "kernel0")
    assert m.tier == "ssd"
    _train(m, batches)
    m.flush()
    for t, spec in enumerate(TABLES):
        weight = np.fromfile(tmp_path / "kernel0" / f"table{t}.weight", dtype=np.float32).reshape(spec.rows, spec.dim)
        state = np.fromfile(tmp_path / "kernel0" / f"table{t}.sum", dtype=np.float32).reshape(spec.rows, spec.dim)
        assert torch.equal(torch.from_numpy(weight), m.get_table(t))
        assert torch.equal(torch.from_numpy(state), m.get_state(t)["sum"])
        assert (state != 0).any()  # trained rows reached the file


# ---- row maps ---------------------------------------------------------------------------------
@pytest.mark.parametrize("numpy", [True, False], ids=["numpy", "torch"])
def test_dense_and_sorted_row_maps_agree_with_a_dict(numpy):
    """Both row -> slot maps against a plain dict over random moves: victims free or holding a
    row, k from 1 to every slot, lookups with repeated and non-resident ids; in both spellings
    of the bookkeeping (numpy, as on CPU; torch, as on a GPU)."""
    g = torch.Generator().manual_seed(0)
    rows, C = 50, 7
    ops = cache._Ops(torch.device("cpu"), numpy)
    maps = [cache._DenseRowMap(rows, C, ops), cache._SortedRowMap(rows, C, ops)]
    slot_row = torch.full((C,), -1)
    for _ in range(60):
        k = int(torch.randint(1, C + 1, (1,), generator=g))
        slots = torch.randperm(C, generator=g)[:k]
        absent = torch.tensor([r for r in range(rows) if r not in set(slot_row.tolist())])
        fetched = absent[torch.randperm(absent.numel(), generator=g)[:k]]
        old = slot_row[slots]
        slot_row[slots] = fetched
        evicted = torch.where(old >= 0, old, fetched)  # as _replace passes it: a free slot "evicts" the row it receives
        for m in maps:
            m.moved(*(ops.ids(x.clone()) for x in (evicted, fetched, slots, slot_row)))
        where = {r: s for s, r in enumerate(slot_row.tolist()) if r >= 0}
        ids = torch.randint(0, rows, (30,), generator=g)
        want = [where.get(r, C) for r in ids.tolist()]
        for m in maps:
            assert m.lookup(ops.ids(ids)).tolist() == want, type(m).__name__
        assert all(len(m.lookup(ops.ids(ids[:0]))) == 0 for m in maps)


@pytest.mark.parametrize("policy,prefetch,store", [
    ("lru", False, "host"), ("lru", True, "mmap"), ("lfu", False, "mmap"), ("lfu", True, "host"),
])  # fmt: skip
@pytest.mark.parametrize("factor", [0.0, 0.5])
def test_sorted_row_map_fallback_matches_dense(policy, prefetch, store, factor, tmp_path, monkeypatch, request):
    """Tables past DENSE_MAP_MAX_ROWS (lowered here: table "b", 1000 rows) use the sorted map:
    training, statistics and resident rows equal the all-dense kernel's and the resident
    kernel's, with caches of exactly one batch's unique rows (factor 0) and larger, repeated ids
    and empty bags (``_batches``)."""
    opt = SparseOptimizerSpec("rowwise_adagrad", lr=0.1)
    batches = _batches(_seed(request), True)
    rows = _cache_rows(batches, factor)
    ref = create_embedding_bag("reference", TABLES, opt, feature_table_map=FTM)
    ref_outs = _train(ref, batches)
    dense = _cached("reference", opt, rows, policy, store, tmp_path / "dense")
    monkeypatch.setattr(cache, "DENSE_MAP_MAX_ROWS", 100)
    mixed = _cached("reference", opt, rows, policy, store, tmp_path / "mixed")
    assert [type(c.map) for c in dense._slots] == [cache._DenseRowMap] * 3
    assert [type(c.map) for c in mixed._slots] == [cache._DenseRowMap, cache._SortedRowMap, cache._DenseRowMap]
    for m in (dense, mixed):
        _assert_same(ref, ref_outs, m, _train(m, batches, prefetch=prefetch))
        assert m.stats()["evictions"] > 0
    assert {k: v for k, v in dense.stats().items() if k != "fetch_s"} == {
        k: v for k, v in mixed.stats().items() if k != "fetch_s"}  # fmt: skip
    for t in range(len(TABLES)):
        assert torch.equal(dense.resident_rows(t), mixed.resident_rows(t))


def test_lfu_sort_path_picks_the_composite_keys_victims():
    """LFU counts so large that the composite victim key would overflow take the sorting path;
    it must pick the same victims (the counts shifted by a constant keep their order)."""
    opt = SparseOptimizerSpec("sgd", lr=0.1)
    table = [TableSpec(200, 4, "sum", "s")]
    batches = _batches(21, False, n=12, tables=table, ftm=[0])
    a, b = (CachedEmbeddingBag(table, opt, cache_rows=_cache_rows(batches, 0.2, table, [0]), policy="lfu")
            for _ in range(2))
    for m in (a, b):
        _train(m, batches[:4])
    c = b._slots[0]  # every row, resident (its count is the slot's) or not: the counts' order is unchanged
    c.freq += 2**56
    c.slot_freq[c.slot_row >= 0] += 2**56
    for m in (a, b):
        _train(m, batches[4:])
    span = (b._tick + 2) * b.cache_rows[0]  # the composite key's frequency unit
    assert (int(b._slots[0].slot_freq.max()) + 1) * span >= 2**62 > (int(a._slots[0].slot_freq.max()) + 1) * span
    assert a.stats()["evictions"] > 0
    assert torch.equal(a.resident_rows(0), b.resident_rows(0))
    assert {k: v for k, v in a.stats().items() if k != "fetch_s"} == {
        k: v for k, v in b.stats().items() if k != "fetch_s"}  # fmt: skip


# ---- the bookkeeping's two spellings, the LRU count-then-select, the prefetched plan -----------
@pytest.mark.parametrize("policy,prefetch,store,opt", [
    ("lru", False, "host", SparseOptimizerSpec("adam", lr=0.05)),
    ("lru", True, "mmap", SparseOptimizerSpec("rowwise_adagrad", lr=0.1)),
    ("lfu", True, "host", SparseOptimizerSpec("adagrad", lr=0.1)),
    ("lfu", False, "mmap", SparseOptimizerSpec("adam", lr=0.05)),
])  # fmt: skip
@pytest.mark.parametrize("factor", [0.0, 0.3])
def test_torch_bookkeeping_and_lru_top_k_match_numpy(policy, prefetch, store, opt, factor, tmp_path, monkeypatch,
                                                    request):
    """On CPU the bookkeeping is numpy; a GPU runs its torch spelling (NUMPY_ON_CPU off runs it on
    CPU), and LRU on CPU counts ticks where the torch spelling takes a top-k (LRU_WINDOW 1 sends
    every CPU selection to its top-k fallback). All of them: exact against the resident kernel
    (weights and optimizer state through evictions, the SSD tier included) and the same
    victims (statistics, resident rows)."""
    batches = _batches(_seed(request), True, n=12)
    rows = _cache_rows(batches, factor)
    ref = create_embedding_bag("reference", TABLES, opt, feature_table_map=FTM)
    ref_outs = _train(ref, batches)
    kernels = {}
    for name, numpy, window in [("numpy", True, cache.LRU_WINDOW), ("torch", False, cache.LRU_WINDOW),
                                ("top-k", True, 1)]:  # fmt: skip
        monkeypatch.setattr(cache, "NUMPY_ON_CPU", numpy)
        monkeypatch.setattr(cache, "LRU_WINDOW", window)
        m = kernels[name] = _cached("reference", opt, rows, policy, store, tmp_path / name)
        assert isinstance(m._slots[0].tick, np.ndarray) == numpy
        _assert_same(ref, ref_outs, m, _train(m, batches, prefetch=prefetch))
        assert m.stats()["evictions"] > 0
    stats = [{k: v for k, v in m.stats().items() if k != "fetch_s"} for m in kernels.values()]
    assert stats[0] == stats[1] == stats[2]
    for t in range(len(TABLES)):
        assert torch.equal(kernels["numpy"].resident_rows(t), kernels["torch"].resident_rows(t))
        assert torch.equal(kernels["numpy"].resident_rows(t), kernels["top-k"].resident_rows(t))


def test_prefetched_plan_serves_only_its_own_batch(monkeypatch):
    """The lookup right after a full prefetch of its batch skips the row-map lookup; any other
    lookup (another batch in between, or the prefetched tensors changed in place) plans anew.
    Exact against the resident kernel throughout, with a cache that evicts every step."""
    table = [TableSpec(40, 4, "sum", "p")]
    opt = SparseOptimizerSpec("adam", lr=0.05)
    ref = create_embedding_bag("reference", table, opt)
    m = CachedEmbeddingBag(table, opt, cache_rows=[9])
    plans = []
    plan = m._plan
    monkeypatch.setattr(m, "_plan", lambda *a: plans.append(1) or plan(*a))
    a, b = _bag([0, 1, 2, 3]), _bag([10, 11, 12, 13, 2])
    changed = (torch.tensor([20, 21, 22, 23]), a[1].clone())

    def step(batch, prefetch=None):
        for mod in (ref, m):
            out = mod(*batch)
            if prefetch is not None and mod is m:
                m.prefetch(*prefetch)
            (out * torch.arange(1.0, 5.0)).sum().backward()

    step(a, prefetch=b)
    plans.clear()
    step(b)  # the prefetched batch: no plan
    assert plans == []
    step(a, prefetch=b)  # prefetch b, then look up a: a plans, and b's prefetched plan is dropped
    step(a)
    step(b)  # its prefetch's slots may be gone: plans anew
    assert len(plans) == 4  # the prefetch, then a, a and b
    values = a[0].clone()
    step((values, a[1]), prefetch=(values, a[1]))
    values.copy_(changed[0])  # the prefetched tensor changed before its lookup
    plans.clear()
    step((values, a[1]))
    assert len(plans) == 1
    assert m.stats()["evictions"] > 0
    assert torch.equal(ref.get_table(0), m.get_table(0))
    assert all(torch.equal(v, m.get_state(0)[k]) for k, v in ref.get_state(0).items())
