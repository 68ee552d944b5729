"""A software-managed embedding row cache over a backing store: Neo's HBM / DRAM / SSD tiers.

    kernel = CachedEmbeddingBag(tables, SparseOptimizerSpec("adam"), cache_rows=[1000, 64],
                                policy="lru", storage_dir="/nvme/job/rank0")
    pooled = kernel(values, offsets)   # rows made resident, then the inner kernel's lookup
    kernel.prefetch(next_values, next_offsets)   # optional: between this forward and backward
    pooled.backward(grad)              # the inner kernel's fused update, on the cached slots

Every table's full rows and their optimizer state live in a backing store (``HostStore``: CPU
tensors, the DRAM tier; ``MmapStore``: one memory-mapped file per table and tensor, the SSD
tier). An inner fused kernel of any backend holds ``cache_rows[t]`` rows ("slots") of table t,
so lookup and fused optimizer run at full speed on the slots; a row map (a dense int32 array,
or for tables past ``DENSE_MAP_MAX_ROWS`` rows a binary search in the sorted resident rows) and
``slot_row`` map between a table's rows and its slots.

Exactness: rows are independent under every sparse optimizer of base.py (Adam's global step is
the inner kernel's, shared by all rows), and a row's weight and state travel together between
store and slot, so training through the cache is bit-identical to the inner backend holding
every row resident, whatever the cache size (at least one batch's unique rows per table),
policy or store.

Pinning. The training pipeline calls ``prefetch`` for batch i+1 after batch i's forward and
before batch i's backward, so:
  * the slots of the latest looked-up batch stay pinned until the next ``_lookup`` (batch i's
    backward updates them in place);
  * prefetched rows, and the resident rows of a prefetched batch, stay pinned until the next
    ``_lookup`` (which is taken to be their batch's);
  * a prefetch that cannot fit a table's missing rows into unpinned slots fetches nothing for
    that table (counted in ``prefetch_deferred``); that batch's lookup then fetches them.
A slot is pinned while its tick (the call that last used it) is at least the latest lookup's.
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

Cost of a call, per table (the step's overhead over the resident kernel): one gather of the
batch's ids through the row map; a sort (``torch.unique``) of only the missing ids; touching the
batch's slots by one scatter of the tick (entry C takes the missing ids', so no mask); one top-k
for the victims; the dirty victims' write-back and the fetch as indexed row copies (on CPU
through numpy, which copies a row at a time); a second gather only when rows were fetched. The
host waits for the device (a sync on CUDA) for the missing ids' count and their unique rows, the
dirty victims and the rows' copies to and from the store (LFU: also the largest count, for the
victim key's overflow check; a prefetch: whether the victims fit; a batch with more ids than
slots: its unique rows); statistics counted on the device are read only by ``stats()``.

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
_DEVICE_STATS: tuple[str, ...] = ("unique_rows", "hits")


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
        _copy_rows(self.weights[t], rows, weight)
        for name, s in self.states[t].items():
            _copy_rows(s, rows, state[name])

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
    rows = np.sort(rows)  # write-backs come in slot order
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


def _copy_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """dst[index] = src along dim 0 (index: unique, on dst's device). On CPU through numpy, whose
    fancy assignment copies a row at a time where index_copy_ indexes every element: 1.5x faster
    measured on scattered rows (2k rows x 256 B into 51 MB: 320 vs 500 us, the write-back's cost)."""
    if dst.device.type != "cpu":
        dst.index_copy_(0, index, src)
        return
    _as_numpy(dst)[index.numpy()] = _as_numpy(src)


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as a numpy array (bf16 as its int16 bits: numpy has no bfloat16)."""
    t = t.detach()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


# ---- the cache ----------------------------------------------------------------------------------
DENSE_MAP_MAX_ROWS = 2**26
"""Tables of at most this many rows map rows to slots with a dense int32 array (4 bytes a row, at
most 256 MiB on the kernel's device, one gather a lookup); larger ones with the sorted resident
rows (16 bytes a slot, a binary search a lookup, a sort of the slots after each fetch)."""


class _DenseRowMap:
    """Row -> slot as a (rows,) int32 array holding C (one past the last slot) for a row that is
    not resident."""

    def __init__(self, rows: int, c: int, device: torch.device) -> None:
        self.missing = c
        self.slot_of = torch.full((rows,), c, dtype=torch.int32, device=device)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """(n,) int64 rows -> (n,) int64 slots, C where not resident."""
        return self.slot_of.index_select(0, ids).to(torch.int64)

    def moved(self, evicted: torch.Tensor, fetched: torch.Tensor, slots: torch.Tensor, slot_row: torch.Tensor) -> None:
        """Rows ``evicted`` left the cache (unmapped first: it may also hold rows of ``fetched``);
        rows ``fetched`` (k,) now sit in ``slots`` (k,) (``slot_row`` is already updated)."""
        self.slot_of.index_fill_(0, evicted, self.missing)
        self.slot_of.index_copy_(0, fetched, slots.to(torch.int32))


class _SortedRowMap:
    """Row -> slot by binary search in the sorted ``slot_row`` (free slots, -1, sort first): O(C)
    memory whatever the table's rows, for shards past DENSE_MAP_MAX_ROWS."""

    def __init__(self, rows: int, c: int, device: torch.device) -> None:
        self.missing = c
        self.keys = torch.full((c,), -1, dtype=torch.int64, device=device)  # sorted slot_row
        self.slots = torch.arange(c, device=device)  # slot of each key

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.searchsorted(self.keys, ids).clamp_(max=self.keys.numel() - 1)
        found = self.keys.index_select(0, pos) == ids
        return torch.where(found, self.slots.index_select(0, pos), self.missing)

    def moved(self, evicted: torch.Tensor, fetched: torch.Tensor, slots: torch.Tensor, slot_row: torch.Tensor) -> None:
        self.keys, self.slots = torch.sort(slot_row)


@dataclass
class _Slots:
    """One table's cache bookkeeping, on the kernel's device. C = the table's cache rows."""

    map: _DenseRowMap | _SortedRowMap  # row -> slot, C for a row not resident
    slot_row: torch.Tensor  # (C,) int64, -1 for a free slot
    # (C+1,) int64: the call that last used the slot, -1 never; pinned while >= the pin tick. Entry
    # C takes the touches of ids not resident, so a batch's slots are touched without a mask.
    tick: torch.Tensor
    dirty: torch.Tensor  # (C,) bool: updated since fetched (the store's copy is stale)
    prefetched: torch.Tensor  # (C,) bool: fetched by a prefetch since the last lookup
    key_base: torch.Tensor  # (C,) int64 C + slot: the LRU key (tick + 1) x C + slot is tick x C + this
    freq: torch.Tensor | None  # (rows,) int64 id occurrences, LFU only
    free: int  # free slots left (they are taken first and never freed again)
    has_prefetched: bool = False  # some slot's ``prefetched`` is set


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
        self._tick = 0  # lookups and prefetches so far
        self._pin_tick = 0  # the latest lookup's tick: slots used since are pinned
        self._stats: dict[str, int | float] = {k: 0 for k in _STAT_KEYS} | {"fetch_s": 0.0}
        # the parts of _STAT_KEYS counted on the device (no host sync per lookup); stats() adds them
        self._device_stats = {k: torch.zeros((), dtype=torch.int64, device=self.device_) for k in _DEVICE_STATS}
        self._lock = threading.RLock()

    def _new_slots(self, rows: int, c: int) -> _Slots:
        dev = self.device_
        row_map = (_DenseRowMap if rows <= DENSE_MAP_MAX_ROWS else _SortedRowMap)(rows, c, dev)
        return _Slots(
            map=row_map, slot_row=torch.full((c,), -1, dtype=torch.int64, device=dev),
            tick=torch.full((c + 1,), -1, dtype=torch.int64, device=dev),
            dirty=torch.zeros(c, dtype=torch.bool, device=dev),
            prefetched=torch.zeros(c, dtype=torch.bool, device=dev), key_base=torch.arange(c, 2 * c, device=dev),
            freq=torch.zeros(rows, dtype=torch.int64, device=dev) if self.policy == "lfu" else None, free=c,
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
        with torch.no_grad():
            plans = [self._plan(t, values, spans) for t in range(len(self.tables))]
            for t, (ids, slots, missing) in enumerate(plans):  # check every table before changing any
                C = self.cache_rows[t]
                if ids.numel() > C:  # else it fits: a batch has no more unique rows than ids
                    resident = torch.zeros(C + 1, dtype=torch.bool, device=slots.device).index_fill_(0, slots, True)
                    needed = int(resident[:C].sum()) + missing.numel()
                    if needed > C:
                        raise ValueError(self._too_small(t, needed))
            self._tick += 1
            self._pin_tick = self._tick  # releases every pin: the previous batch's backward has run
            table_slots = []
            for t, (ids, slots, missing) in enumerate(plans):
                c = self._slots[t]
                c.tick.index_fill_(0, slots, self._tick)
                resident = c.tick[:-1] == self._tick  # the batch's resident rows, once each
                unique = resident.sum()
                self._device_stats["unique_rows"] += unique
                self._stats["unique_rows"] += missing.numel()
                if c.has_prefetched:
                    self._device_stats["hits"] += (resident & ~c.prefetched).sum()
                    c.prefetched.zero_()
                    c.has_prefetched = False
                else:
                    self._device_stats["hits"] += unique
                if missing.numel():  # victims: the least recently / frequently used unpinned slots
                    self._replace(t, self._victims(t, missing.numel(), check=False), missing, prefetch=False)
                    slots = c.map.lookup(ids)
                if c.freq is not None:
                    c.freq.index_add_(0, ids, torch.ones_like(ids))
                table_slots.append(slots)
            slot_values = self._feature_major(values, spans, table_slots)
        self._stats["lookups"] += values.numel()
        self._stats["fetch_s"] += time.perf_counter() - start
        out = self.inner._lookup(slot_values, offsets, per_sample_weights)
        if out.requires_grad:  # the inner backward will update the batch's (pinned) slots in place
            for c, slots in zip(self._slots, table_slots):
                c.dirty.index_fill_(0, slots, True)
        return out

    @_locked
    def prefetch(self, values: torch.Tensor, offsets: torch.Tensor) -> None:
        """Bring a future batch's rows in ahead of its lookup, pinned until then (best effort:
        a table whose missing rows do not fit in unpinned slots is skipped and counted; its
        resident rows of the batch are still pinned)."""
        F = self.num_features
        if offsets.dim() != 1 or offsets.numel() < 1 or (offsets.numel() - 1) % F != 0:
            raise ValueError(f"cached: offsets has {offsets.numel()} entries; expected F*B+1 with F={F}")
        if self.check_ids:
            self.validate_ids(values, offsets)
        start = time.perf_counter()
        spans = self._feature_spans(offsets)
        self._tick += 1
        with torch.no_grad():
            for t in range(len(self.tables)):
                _, slots, missing = self._plan(t, values, spans)
                c = self._slots[t]
                c.tick.index_fill_(0, slots, self._tick)  # the coming batch's: pinned, not victims
                if missing.numel() == 0:
                    continue
                victims = self._victims(t, missing.numel(), check=True)
                if victims is None:
                    self._stats["prefetch_deferred"] += 1
                    continue
                self._replace(t, victims, missing, prefetch=True)
                self._stats["prefetched_rows"] += missing.numel()
        self._stats["fetch_s"] += time.perf_counter() - start

    def _plan(
        self, t: int, values: torch.Tensor, spans: list[tuple[int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Table t's ids in the batch (n,) int64, their slots (n,) int64 (C where not resident)
        and the sorted unique rows not resident. Changes nothing."""
        c = self._slots[t]
        ids = self._table_ids(values, spans, t)
        slots = c.map.lookup(ids)
        missing = ids[slots == c.map.missing]
        return ids, slots, torch.unique(missing) if missing.numel() else missing

    def _victims(self, t: int, k: int, check: bool) -> torch.Tensor | None:
        """The k slots of table t to reuse, in eviction order, among those not pinned (tick below
        the pin tick): free slots first, then by policy (module docstring). One top-k over a
        composite key (LRU: tick, slot; LFU: frequency, tick, slot: unique, so the choice is
        deterministic). ``check``: return None when fewer than k slots are unpinned (a lookup
        has checked its batch fits, and pinned slots never sort first under LRU)."""
        c, C, pin = self._slots[t], self.cache_rows[t], self._pin_tick
        if k > C:  # a prefetch of a batch the cache cannot hold (its lookup will say so)
            return None
        tick = c.tick[:-1]
        key = torch.add(c.key_base, tick, alpha=C)  # free slots carry tick -1: first
        bound = (pin + 1) * C  # LRU: the keys of pinned slots (tick >= pin) are at least this
        if c.freq is not None:
            rows = c.slot_row
            freq = torch.where(rows >= 0, c.freq.index_select(0, rows.clamp(min=0)), -1) + 1  # free first
            span = (self._tick + 2) * C
            if (int(freq.max()) + 1) * span >= 2**62:  # the composite key would overflow: sort
                cand = (tick < pin).nonzero().squeeze(1)
                if cand.numel() < k:
                    return None
                order = torch.argsort(key[cand], stable=True)
                order = order[torch.argsort(freq[cand[order]], stable=True)]
                return cand[order[:k]]
            bound = torch.iinfo(torch.int64).max
            key = torch.add(key, freq, alpha=span).masked_fill_(tick >= pin, bound)
        keys, victims = torch.topk(key, k, largest=False, sorted=True)
        if check and int(keys[-1]) >= bound:
            return None
        return victims

    def _replace(self, t: int, slots: torch.Tensor, rows: torch.Tensor, prefetch: bool) -> None:
        """Evict slots (k,) of table t, writing their dirty rows back first, and fetch rows (k,)
        (not resident) from the store into them; they become touched by this call."""
        c, k = self._slots[t], rows.numel()
        old = c.slot_row.index_select(0, slots)
        self._write_back(t, slots[c.dirty.index_select(0, slots)])  # a dirty slot holds a row
        self._copy_in(t, rows, slots)
        c.slot_row.index_copy_(0, slots, rows)
        taken = min(k, c.free)  # victims list free slots first
        if taken:  # a free slot "evicts" the row it receives (mapped right after): no mask, no sync
            old = torch.where(old >= 0, old, rows)
        c.map.moved(old, rows, slots, c.slot_row)
        c.free -= taken
        c.tick.index_fill_(0, slots, self._tick)  # clean: the dirty ones were just written back
        if prefetch:
            c.prefetched.index_fill_(0, slots, True)
            c.has_prefetched = True
        self._stats["evictions"] += k - taken
        self._stats["misses"] += k
        self._stats["bytes_read"] += k * self._row_bytes[t]

    def _write_back(self, t: int, slots: torch.Tensor) -> None:
        """Write resident slots (k,) of table t to the store; they become clean."""
        if slots.numel() == 0:
            return
        c = self._slots[t]
        weight, state = self.inner.rows_views(t)
        self.store.write(
            t, c.slot_row.index_select(0, slots).cpu(), weight.index_select(0, slots).cpu(),
            {n: v.index_select(0, slots).cpu() for n, v in state.items()},
        )  # fmt: skip
        c.dirty.index_fill_(0, slots, False)
        self._stats["writebacks"] += slots.numel()
        self._stats["bytes_written"] += slots.numel() * self._row_bytes[t]

    def _copy_in(self, t: int, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy rows (k,) of table t from the store into slots (k,) of the inner kernel."""
        weight_rows, state_rows = self.store.read(t, rows.cpu())
        weight, state = self.inner.rows_views(t)
        _copy_rows(weight, slots, weight_rows.to(weight.device))
        for name, view in state.items():
            _copy_rows(view, slots, state_rows[name].to(view.device))

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
        return (pieces[0] if len(pieces) == 1 else torch.cat(pieces)).to(torch.int64)

    def _feature_major(
        self, values: torch.Tensor, spans: list[tuple[int, int]], table_slots: list[torch.Tensor]
    ) -> torch.Tensor:
        """The batch's slots (N,) int64 in ``values``' order from each table's (``_table_ids``
        order): the table's own tensor when one feature reads the whole batch."""
        if len(table_slots) == 1 and len(self._table_features[0]) == 1:
            return table_slots[0]
        out = torch.empty(values.shape, dtype=torch.int64, device=values.device)
        for t, slots in enumerate(table_slots):
            i = 0
            for f in self._table_features[t]:
                a, b = spans[f]
                out[a:b] = slots[i : i + b - a]
                i += b - a
        return out

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
        out = dict(self._stats)
        for k, v in self._device_stats.items():
            out[k] += int(v)
        return out

    # ---- the inner kernel's training state ----------------------------------------------------
    def set_learning_rate(self, lr: float) -> None:
        super().set_learning_rate(lr)
        self.inner.set_learning_rate(lr)

    @property
    def optimizer_step(self) -> int:
        return self.inner.optimizer_step

    def set_optimizer_step(self, step: int) -> None:
        self.inner.set_optimizer_step(step)
