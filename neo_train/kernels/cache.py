"""A software-managed embedding row cache over a backing store: Neo's HBM / DRAM / SSD tiers.

    kernel = CachedEmbeddingBag(tables, SparseOptimizerSpec("adam"), cache_rows=[1000, 64],
                                policy="lru", storage_dir="/nvme/job/rank0")
    pooled = kernel(values, offsets)   # rows made resident, then the inner kernel's lookup
    kernel.prefetch(next_values, next_offsets)   # optional: between this forward and backward
    pooled.backward(grad)              # the inner kernel's fused update, on the cached slots

Every table's full rows and their optimizer state live in a backing store (``HostStore``: CPU
tensors, the DRAM tier; ``MmapStore``: one memory-mapped file per table and tensor, the SSD
tier). An inner fused kernel of any backend holds ``cache_rows[t]`` rows ("slots") of table t,
so lookup and fused optimizer run at full speed on the slots; ``row_to_slot`` / ``slot_row``
map between a table's rows and its slots.

Exactness: rows are independent under every sparse optimizer of base.py (Adam's global step is
the inner kernel's, shared by all rows), and a row's weight and state travel together between
store and slot, so training through the cache is bit-identical to the inner backend holding
every row resident, whatever the cache size (at least one batch's unique rows per table),
policy or store.

Pinning. The training pipeline calls ``prefetch`` for batch i+1 after batch i's forward and
before batch i's backward, so:
  * the slots of the latest looked-up batch stay pinned until the next ``_lookup`` (batch i's
    backward updates them in place);
  * prefetched rows stay pinned until the next ``_lookup`` (which is taken to be their batch's);
  * a prefetch that cannot fit a table's missing rows into unpinned slots does nothing for that
    table (counted in ``prefetch_deferred``); that batch's lookup then fetches them.
A lookup releases every pin first (the previous batch's backward has run), so it only fails
when one batch's unique rows of a table exceed its slots: ValueError naming the load factor.
Not supported: a second forward before the first one's backward (gradient accumulation).

Threads: ``prefetch`` may run on another thread while the previous batch's backward runs (it
reads and writes only unpinned slots and the cache's own bookkeeping; the backward touches only
the pinned slots, in the inner kernel). Lookups, prefetches, flushes and the accessors hold one
lock, so an evaluation or a checkpoint that starts while a prefetch is in flight waits for it
(the training pipeline waits for batch i's prefetch before batch i's forward anyway). On CUDA
the prefetch's copies go to that thread's current stream.

Victims are chosen among unpinned slots not holding a row of the batch, free slots first:
``lru`` evicts the least recently used (a per-slot tick, advanced once per lookup/prefetch
call); ``lfu`` the least frequently used (a per-row count of id occurrences at lookup, kept
across evictions as Neo's LFU does), ties broken by tick then slot index. Dirty victims (updated
since their fetch) are written back first. Everything is deterministic.

Statistics (``stats()``, cumulative): ``lookups`` ids looked up; ``unique_rows`` sum over
lookups and tables of the unique rows; ``hits`` unique rows resident when the first of
(prefetch, lookup) touching them for that batch began, i.e. resident at lookup and not brought
in by a prefetch since the previous lookup; ``misses`` rows fetched from the store, by lookups
or prefetches (hits + misses == unique_rows when every prefetch is followed by its batch's
lookup); ``evictions`` resident rows evicted; ``writebacks`` dirty rows written to the store
(evictions and flushes); ``bytes_read`` / ``bytes_written`` the store traffic of those rows,
rows x (D x weight bytes + optimizer state bytes); ``prefetched_rows`` the misses fetched by
prefetches; ``prefetch_deferred`` tables whose prefetch was skipped; ``fetch_s`` host seconds in
``_lookup`` / ``prefetch`` making rows resident (fetch, evict, write back, remap).
"""
from __future__ import annotations

import functools
import math
import mmap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Sequence

import numpy as np
import torch

from .base import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec, state_shapes
from .flat_storage import check_shape
from .init import init_table_rows
from .registry import create_embedding_bag

__all__ = ["CachedEmbeddingBag", "BackingStore", "HostStore", "MmapStore", "CACHE_POLICIES"]

CACHE_POLICIES: tuple[str, ...] = ("lru", "lfu")


def _locked(method: Callable) -> Callable:
    """Run a CachedEmbeddingBag method under its lock (see "Threads" above)."""

    @functools.wraps(method)
    def wrapper(self: "CachedEmbeddingBag", *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper

_STAT_KEYS: tuple[str, ...] = (
    "lookups", "unique_rows", "hits", "misses", "evictions", "writebacks",
    "bytes_read", "bytes_written", "prefetched_rows", "prefetch_deferred",
)  # fmt: skip


# ---- backing stores ---------------------------------------------------------------------------
class BackingStore:
    """Every table's full rows and optimizer state, addressed by row id.

    ``weights[t]`` (rows, D) in the weight dtype and ``states[t][name]`` ((rows, D) or (rows,),
    float32; names as base.state_shapes) are CPU tensors; the cache moves rows with indexed
    copies (``read`` / ``write``) and accessors read or write them whole.
    """

    tier: ClassVar[str] = "abstract"

    def __init__(self, weights: list[torch.Tensor], states: list[dict[str, torch.Tensor]]) -> None:
        self.weights = weights
        self.states = states

    def read(self, t: int, rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Rows (k,) int64 of table t -> (weights (k, D), {name: (k, D) or (k,)})."""
        return self.weights[t].index_select(0, rows), {n: s.index_select(0, rows) for n, s in self.states[t].items()}

    def write(self, t: int, rows: torch.Tensor, weight: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        """Store rows (k,) int64 (unique) of table t: weight (k, D), state like ``read``'s."""
        self.weights[t].index_copy_(0, rows, weight)
        for name, s in self.states[t].items():
            s.index_copy_(0, rows, state[name])

    def sync(self) -> None:
        """Make written rows durable (a no-op in memory)."""


class HostStore(BackingStore):
    """The DRAM tier: plain CPU tensors."""

    tier: ClassVar[str] = "host"

    def __init__(self, tables: Sequence[TableSpec], optimizer: str, weight_dtype: torch.dtype) -> None:
        super().__init__(
            [torch.zeros(s.rows, s.dim, dtype=weight_dtype) for s in tables],
            [{n: torch.zeros(shape) for n, shape in state_shapes(optimizer, s.rows, s.dim).items()} for s in tables],
        )


class MmapStore(BackingStore):
    """The SSD tier: one memory-mapped file per table and tensor in ``directory``
    (``table{t}.weight``: weight dtype, bf16 as its uint16 bits; ``table{t}.{state}``: float32),
    created anew (zero-filled, sparse on disk) by the constructor.

    Why memmap rather than a key-value store: rows are fixed width and addressed by a dense id,
    so row r sits at byte r x row_bytes (direct addressing, no index to keep); a row is read and
    written as raw bytes (no serialisation); the OS page cache keeps hot pages in DRAM and writes
    back dirty ones by itself. A KV store would add hashing, per-row serialisation and its own
    cache on the same path.
    """

    tier: ClassVar[str] = "ssd"
    _NUMPY: ClassVar[dict[torch.dtype, type]] = {
        torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16,
    }  # fmt: skip

    def __init__(
        self, tables: Sequence[TableSpec], optimizer: str, weight_dtype: torch.dtype, directory: str | Path
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._maps: list[np.memmap] = []
        weights = [self._map(f"table{t}.weight", weight_dtype, (s.rows, s.dim)) for t, s in enumerate(tables)]
        self._weight_maps = list(self._maps)
        states, self._state_maps = [], []
        for t, s in enumerate(tables):
            shapes = state_shapes(optimizer, s.rows, s.dim)
            states.append({n: self._map(f"table{t}.{n}", torch.float32, sh) for n, sh in shapes.items()})
            self._state_maps.append(dict(zip(shapes, self._maps[-len(shapes):] if shapes else [])))
        super().__init__(weights, states)

    def read(self, t: int, rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """As BackingStore.read, after asking the kernel to read every page the rows sit on
        (MADV_WILLNEED over runs of pages): the disk then serves them in parallel instead of one
        page fault at a time (random reads of a cold store were fault-bound)."""
        r = rows.numpy()
        for mm in (self._weight_maps[t], *self._state_maps[t].values()):
            _will_need(mm, r)
        return super().read(t, rows)

    def write(self, t: int, rows: torch.Tensor, weight: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        """As BackingStore.write; a row shares its page with others, so a cold page is read
        before it is changed: those reads are asked for together first, as in ``read``."""
        r = rows.numpy()
        for mm in (self._weight_maps[t], *self._state_maps[t].values()):
            _will_need(mm, r)
        super().write(t, rows, weight, state)

    def _map(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A new zero-filled file mapped as a CPU tensor (sharing the mapping's memory)."""
        mm = np.memmap(self.directory / name, dtype=self._NUMPY[dtype], mode="w+", shape=shape)
        raw = getattr(mm, "_mmap", None)  # numpy keeps the mmap.mmap here
        if raw is not None and hasattr(mmap, "MADV_RANDOM"):
            # rows are read at random: without this every page fault reads ahead 128 KB around a
            # 1 KB row (measured: a Model-F-shaped step fetching 50k rows took 27 s of faults)
            raw.madvise(mmap.MADV_RANDOM)
        self._maps.append(mm)
        return torch.from_numpy(mm).view(dtype)

    def sync(self) -> None:
        for mm in self._maps:
            mm.flush()


def _will_need(mm: np.memmap, rows: np.ndarray) -> None:
    """madvise(MADV_WILLNEED) the pages holding ``rows`` of a row-major map."""
    raw = getattr(mm, "_mmap", None)
    if raw is None or not hasattr(mmap, "MADV_WILLNEED") or rows.size == 0:
        return
    rows = np.unique(rows)  # sorted: write-backs come in slot order
    row_bytes = mm.itemsize * (int(np.prod(mm.shape[1:])) if mm.ndim > 1 else 1)
    page = mmap.PAGESIZE
    first = rows.astype(np.int64) * row_bytes // page
    last = ((rows.astype(np.int64) + 1) * row_bytes - 1) // page
    # runs of consecutive pages: a new run where a row's first page is past the previous last + 1
    starts = np.flatnonzero(np.concatenate([[True], first[1:] > last[:-1] + 1]))
    ends = np.concatenate([starts[1:], [rows.size]]) - 1
    size = len(raw)  # the file's bytes: the last page may be partial
    for a, b in zip(first[starts].tolist(), last[ends].tolist()):
        raw.madvise(mmap.MADV_WILLNEED, a * page, min((b - a + 1) * page, size - a * page))


# ---- the cache ----------------------------------------------------------------------------------
@dataclass
class _Slots:
    """One table's cache bookkeeping, on the kernel's device. C = the table's cache rows."""

    row_to_slot: torch.Tensor  # (rows,) int64, -1 when the row is not resident
    slot_row: torch.Tensor  # (C,) int64, -1 for a free slot
    tick: torch.Tensor  # (C,) int64: the call that last used the slot, -1 never
    dirty: torch.Tensor  # (C,) bool: updated since fetched (the store's copy is stale)
    pinned: torch.Tensor  # (C,) bool: may not be evicted (see the module docstring)
    prefetched: torch.Tensor  # (C,) bool: fetched by a prefetch since the last lookup
    freq: torch.Tensor | None  # (rows,) int64 id occurrences, LFU only


class CachedEmbeddingBag(FusedEmbeddingBag):
    """Fused embedding bag over a backing store, with a bounded row cache in an inner fused kernel.

    cache_rows: slots per table, clamped to [1, rows]. policy: "lru" | "lfu". inner_backend:
    any ``create_embedding_bag`` backend that exposes ``rows_views`` (reference, fbgemm, triton).
    storage_dir: None keeps the store in host memory; a directory puts it in memory-mapped files
    there (the caller gives each kernel its own). The device is fixed at construction.
    """

    backend_name: ClassVar[str] = "cached"

    def __init__(
        self,
        tables: Sequence[TableSpec],
        optimizer: SparseOptimizerSpec,
        *,
        cache_rows: Sequence[int],
        policy: str = "lru",
        inner_backend: str = "reference",
        storage_dir: str | Path | None = None,
        feature_table_map: Sequence[int] | None = None,
        feature_names: Sequence[str] | None = None,
        device: torch.device | str = "cpu",
        weight_dtype: torch.dtype = torch.float32,
        seed: int = 0,
        init_rows: bool = True,
    ) -> None:
        tables = tuple(tables)
        if policy not in CACHE_POLICIES:
            raise ValueError(f"backend 'cached': policy must be one of {CACHE_POLICIES}, got {policy!r}")
        if len(cache_rows) != len(tables):
            raise ValueError(f"backend 'cached': {len(cache_rows)} cache_rows for {len(tables)} tables")
        slots = tuple(min(max(int(c), 1), spec.rows) for c, spec in zip(cache_rows, tables))
        try:
            inner = create_embedding_bag(
                inner_backend, [TableSpec(c, s.dim, s.pooling, s.name) for c, s in zip(slots, tables)], optimizer,
                feature_table_map=feature_table_map, feature_names=feature_names, device=device,
                weight_dtype=weight_dtype, seed=seed,
            )  # fmt: skip
            inner.rows_views(0)  # the cache moves rows through these; NotImplementedError if absent
        except (ValueError, NotImplementedError) as e:
            raise ValueError(f"backend 'cached' over inner backend {inner_backend!r}: {e}") from None
        # What the cache supports is what its inner kernel supports (instance attributes shadow
        # the ClassVars before base.__init__ checks them).
        self.supported_optimizers = inner.supported_optimizers
        self.supported_weight_dtypes = inner.supported_weight_dtypes
        super().__init__(tables, optimizer, feature_table_map, feature_names, device, weight_dtype)
        self.inner = inner
        self.cache_rows: tuple[int, ...] = slots
        self.policy = policy
        kind = optimizer.kind
        self.store: BackingStore = (
            HostStore(tables, kind, weight_dtype) if storage_dir is None
            else MmapStore(tables, kind, weight_dtype, storage_dir)
        )  # fmt: skip
        self.tier: str = self.store.tier
        # kernels/init.py's init, streamed: no table materialises (init_rows=False: the caller
        # writes the rows itself, e.g. a shard's slice of its logical table, with write_rows)
        for t, spec in enumerate(tables if init_rows else ()):
            for start, block in init_table_rows(seed, t, spec.rows, spec.dim, 0, spec.rows):
                self.store.weights[t][start : start + block.shape[0]].copy_(block)
        elem = torch.empty((), dtype=weight_dtype).element_size()
        self._row_bytes = [
            s.dim * elem + 4 * sum(math.prod(sh[1:]) for sh in state_shapes(kind, 1, s.dim).values()) for s in tables
        ]  # weight + state bytes of one row
        ftm = self.feature_table_map
        self._table_features = [[f for f, ft in enumerate(ftm) if ft == t] for t in range(len(tables))]
        self._slots = [self._new_slots(spec.rows, c) for spec, c in zip(tables, slots)]
        self._tick = 0
        self._stats: dict[str, int | float] = {k: 0 for k in _STAT_KEYS} | {"fetch_s": 0.0}
        self._lock = threading.RLock()
        self._memo: tuple | None = None  # the last prefetch's batch and its unique rows per table

    def _new_slots(self, rows: int, c: int) -> _Slots:
        i64 = dict(dtype=torch.int64, device=self.device_)
        flags = dict(dtype=torch.bool, device=self.device_)
        return _Slots(
            row_to_slot=torch.full((rows,), -1, **i64), slot_row=torch.full((c,), -1, **i64),
            tick=torch.full((c,), -1, **i64), dirty=torch.zeros(c, **flags), pinned=torch.zeros(c, **flags),
            prefetched=torch.zeros(c, **flags), freq=torch.zeros(rows, **i64) if self.policy == "lfu" else None,
        )  # fmt: skip

    # ---- lookup and prefetch ----------------------------------------------------------------
    @_locked
    def _lookup(
        self, values: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        """Make the batch's rows resident, look up their slots in the inner kernel.

        The base class already validated ids and handled mean pooling; the inner kernel's
        ``_lookup`` is called directly, so it does neither again.
        """
        start = time.perf_counter()
        spans = self._feature_spans(offsets)
        uniques = self._memo_uniques(values, offsets)
        if uniques is None:
            uniques = [torch.unique(self._table_ids(values, spans, t), return_counts=True) for t in range(len(self.tables))]
        self._memo = None
        for t, (rows, _) in enumerate(uniques):  # check every table before changing any
            if rows.numel() > self.cache_rows[t]:
                raise ValueError(self._too_small(t, rows.numel()))
        self._tick += 1
        slot_values = torch.empty(values.shape, dtype=torch.int64, device=values.device)
        with torch.no_grad():
            for t, (rows, counts) in enumerate(uniques):
                c = self._slots[t]
                c.pinned.zero_()  # the previous batch's backward has run; prefetch pins were for this batch
                slots = c.row_to_slot[rows]
                held = slots[slots >= 0]
                self._stats["hits"] += int((~c.prefetched[held]).sum())
                c.prefetched.zero_()
                self._admit(t, rows, prefetch=False)
                if c.freq is not None:
                    c.freq.index_add_(0, rows, counts)
                for f in self._table_features[t]:
                    a, b = spans[f]
                    slot_values[a:b] = c.row_to_slot[values[a:b].to(torch.int64)]
                self._stats["unique_rows"] += rows.numel()
        self._stats["lookups"] += values.numel()
        self._stats["fetch_s"] += time.perf_counter() - start
        out = self.inner._lookup(slot_values, offsets, per_sample_weights)
        if out.requires_grad:  # the inner backward will update the batch's (pinned) slots in place
            for c in self._slots:
                c.dirty |= c.pinned
        return out

    @_locked
    def prefetch(self, values: torch.Tensor, offsets: torch.Tensor) -> None:
        """Bring a future batch's rows in ahead of its lookup, pinned until then (best effort:
        a table whose missing rows do not fit in unpinned slots is skipped and counted)."""
        F = self.num_features
        if offsets.dim() != 1 or offsets.numel() < 1 or (offsets.numel() - 1) % F != 0:
            raise ValueError(f"cached: offsets has {offsets.numel()} entries; expected F*B+1 with F={F}")
        if self.check_ids:
            self.validate_ids(values, offsets)
        start = time.perf_counter()
        spans = self._feature_spans(offsets)
        self._tick += 1
        uniques = [torch.unique(self._table_ids(values, spans, t), return_counts=True) for t in range(len(self.tables))]
        # the batch's lookup comes next with the same tensors: it reuses these (see _memo_uniques)
        self._memo = (values, values._version, offsets.clone(), uniques)
        with torch.no_grad():
            for t, (rows, _) in enumerate(uniques):
                if rows.numel() == 0:
                    continue
                fetched = self._admit(t, rows, prefetch=True)
                if fetched is None:
                    self._stats["prefetch_deferred"] += 1
                else:
                    self._stats["prefetched_rows"] += fetched
        self._stats["fetch_s"] += time.perf_counter() - start

    def _memo_uniques(self, values: torch.Tensor, offsets: torch.Tensor) -> list | None:
        """The prefetch's per-table (unique rows, counts) when this lookup is of the very batch
        it prefetched (the same ``values`` tensor, unmodified, and equal offsets), else None."""
        memo = self._memo
        if memo is None or memo[0] is not values or memo[1] != values._version or not torch.equal(memo[2], offsets):
            return None
        return memo[3]

    def _admit(self, t: int, rows: torch.Tensor, prefetch: bool) -> int | None:
        """Make unique rows (U,) of table t resident, pinned and touched; returns how many were
        fetched, or None (nothing changed) when the unpinned slots cannot take the missing rows."""
        c = self._slots[t]
        slots = c.row_to_slot[rows]
        resident = slots >= 0
        missing = rows[~resident]
        if missing.numel():
            candidates = ~c.pinned
            candidates[slots[resident]] = False
            victims = self._victims(c, candidates, missing.numel())
            if victims is None:
                return None
            self._evict(t, victims)
            self._fetch(t, missing, victims, prefetch)
            slots = c.row_to_slot[rows]
        c.pinned[slots] = True
        c.tick[slots] = self._tick
        return missing.numel()

    def _victims(self, c: _Slots, candidates: torch.Tensor, k: int) -> torch.Tensor | None:
        """The k slots to reuse among ``candidates`` (C,) bool, in eviction order, or None when
        fewer than k: free slots first, then by policy (module docstring). One top-k over a
        composite key (LRU: tick, slot; LFU: frequency, tick, slot: unique, so the choice is
        deterministic) instead of sorting every candidate."""
        if int(candidates.sum()) < k:
            return None
        C = candidates.numel()
        slot = torch.arange(C, device=candidates.device)
        key = (c.tick + 1) * C + slot  # free slots carry tick -1: first
        if c.freq is not None:
            rows = c.slot_row
            freq = torch.where(rows >= 0, c.freq[rows.clamp(min=0)], -1) + 1  # free slots first
            span = (self._tick + 2) * C
            if (int(freq.max()) + 1) * span >= 2**62:  # the composite key would overflow: sort
                cand = candidates.nonzero().squeeze(1)
                order = torch.argsort(key[cand], stable=True)
                order = order[torch.argsort(freq[cand[order]], stable=True)]
                return cand[order[:k]]
            key = freq * span + key
        key = key.masked_fill(~candidates, torch.iinfo(torch.int64).max)
        return torch.topk(key, k, largest=False, sorted=True).indices

    def _evict(self, t: int, slots: torch.Tensor) -> None:
        """Empty slots (k,) of table t, writing dirty rows back first."""
        c = self._slots[t]
        rows = c.slot_row[slots]
        held = rows >= 0
        self._write_back(t, slots[held & c.dirty[slots]])
        c.row_to_slot[rows[held]] = -1
        c.slot_row[slots] = -1
        self._stats["evictions"] += int(held.sum())

    def _fetch(self, t: int, rows: torch.Tensor, slots: torch.Tensor, prefetch: bool) -> None:
        """Read rows (k,) of table t from the store into empty slots (k,)."""
        self._copy_in(t, rows, slots)
        c = self._slots[t]
        c.row_to_slot[rows] = slots
        c.slot_row[slots] = rows
        c.dirty[slots] = False
        c.prefetched[slots] = prefetch
        self._stats["misses"] += rows.numel()
        self._stats["bytes_read"] += rows.numel() * self._row_bytes[t]

    def _write_back(self, t: int, slots: torch.Tensor) -> None:
        """Write resident slots (k,) of table t to the store; they become clean."""
        if slots.numel() == 0:
            return
        c = self._slots[t]
        weight, state = self.inner.rows_views(t)
        self.store.write(
            t, c.slot_row[slots].cpu(), weight.index_select(0, slots).cpu(),
            {n: v.index_select(0, slots).cpu() for n, v in state.items()},
        )  # fmt: skip
        c.dirty[slots] = False
        self._stats["writebacks"] += slots.numel()
        self._stats["bytes_written"] += slots.numel() * self._row_bytes[t]

    def _copy_in(self, t: int, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy rows (k,) of table t from the store into slots (k,) of the inner kernel."""
        weight_rows, state_rows = self.store.read(t, rows.cpu())
        weight, state = self.inner.rows_views(t)
        weight.index_copy_(0, slots, weight_rows.to(weight.device))
        for name, view in state.items():
            view.index_copy_(0, slots, state_rows[name].to(view.device))

    # ---- batch helpers ------------------------------------------------------------------------
    def _feature_spans(self, offsets: torch.Tensor) -> list[tuple[int, int]]:
        """[(start, end)) of each feature's ids in ``values`` (bags are feature-major)."""
        F = self.num_features
        B = (offsets.numel() - 1) // F
        bounds = offsets[::B].tolist() if B > 0 else [0] * (F + 1)
        return [(int(bounds[f]), int(bounds[f + 1])) for f in range(F)]

    def _table_ids(self, values: torch.Tensor, spans: list[tuple[int, int]], t: int) -> torch.Tensor:
        """(n_t,) int64 ids of table t in this batch, over every feature that reads it."""
        pieces = [values[slice(*spans[f])] for f in self._table_features[t]]
        if not pieces:
            return values.new_zeros(0, dtype=torch.int64)
        return torch.cat(pieces).to(torch.int64)

    def _too_small(self, t: int, needed: int) -> str:
        spec = self.tables[t]
        x = needed / spec.rows
        step = 10.0 ** (math.floor(math.log10(x)) - 3)  # round up to 4 significant digits
        return (
            f"cached embedding: table '{spec.name or t}' needs {needed} unique rows in one batch but its "
            f"cache holds {self.cache_rows[t]} rows; a cache_load_factor of at least "
            f"{math.ceil(x / step - 1e-9) * step:.4g} (= {needed}/{spec.rows} rows) fits it"
        )

    # ---- accessors ----------------------------------------------------------------------------
    @_locked
    def flush(self) -> None:
        """Write every dirty slot back to the store (slots stay resident, now clean)."""
        with torch.no_grad():
            for t, c in enumerate(self._slots):
                self._write_back(t, c.dirty.nonzero().squeeze(1))
        self.store.sync()

    @_locked
    def get_table(self, t: int) -> torch.Tensor:
        self.flush()
        return self.store.weights[t].to(torch.float32, copy=True)

    @_locked
    def get_state(self, t: int) -> dict[str, torch.Tensor]:
        self.flush()
        return {n: s.clone() for n, s in self.store.states[t].items()}

    @_locked
    def set_table(self, t: int, weight: torch.Tensor) -> None:
        spec = self.tables[t]
        check_shape(f"table {t}", weight, (spec.rows, spec.dim))
        self._overwrite(t, 0, spec.rows, lambda: self.store.weights[t].copy_(weight))

    @_locked
    def set_state(self, t: int, state: dict[str, torch.Tensor]) -> None:
        spec = self.tables[t]
        expected = state_shapes(self.optimizer_spec.kind, spec.rows, spec.dim)
        if set(state) != set(expected):
            raise ValueError(f"table {t}: state keys {sorted(state)} != {sorted(expected)}")
        for name, shape in expected.items():
            check_shape(f"table {t} state '{name}'", state[name], shape)

        def write() -> None:
            for name, s in self.store.states[t].items():
                s.copy_(state[name])

        self._overwrite(t, 0, spec.rows, write)

    @_locked
    def write_rows(self, t: int, row_start: int, weight_rows: torch.Tensor) -> None:
        """Overwrite rows [row_start, row_start + n) of table t with weight_rows (n, D), straight
        into the store: a table larger than memory is initialised chunk by chunk."""
        spec = self.tables[t]
        n = weight_rows.shape[0]
        check_shape(f"table {t} rows", weight_rows, (n, spec.dim))
        if not 0 <= row_start <= row_start + n <= spec.rows:
            raise ValueError(f"table {t}: rows [{row_start}, {row_start + n}) outside its {spec.rows} rows")
        rows = self.store.weights[t][row_start : row_start + n]
        self._overwrite(t, row_start, row_start + n, lambda: rows.copy_(weight_rows))

    def _overwrite(self, t: int, lo: int, hi: int, write: Callable[[], None]) -> None:
        """Run ``write`` (changing store rows [lo, hi) of table t) with the cache kept coherent:
        dirty resident rows there are written back first (what ``write`` leaves, e.g. the state
        under set_table, stays current), and resident rows are re-read afterwards, so slots stay
        resident (and pinned) and the next lookup sees the new values."""
        c = self._slots[t]
        with torch.no_grad():
            affected = (c.slot_row >= lo) & (c.slot_row < hi)
            self._write_back(t, (affected & c.dirty).nonzero().squeeze(1))
            write()
            slots = affected.nonzero().squeeze(1)
            if slots.numel():
                self._copy_in(t, c.slot_row[slots], slots)

    def resident_rows(self, t: int) -> torch.Tensor:
        """Sorted (k,) int64 CPU tensor of table t's rows now in the cache."""
        rows = self._slots[t].slot_row
        return rows[rows >= 0].sort().values.cpu()

    def stats(self) -> dict[str, int | float]:
        """Cumulative counters (defined in the module docstring)."""
        return dict(self._stats)

    # ---- the inner kernel's training state ----------------------------------------------------
    def set_learning_rate(self, lr: float) -> None:
        super().set_learning_rate(lr)
        self.inner.set_learning_rate(lr)

    @property
    def optimizer_step(self) -> int:
        return self.inner.optimizer_step

    def set_optimizer_step(self, step: int) -> None:
        self.inner.set_optimizer_step(step)
