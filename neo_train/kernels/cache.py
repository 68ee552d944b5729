"""A software-managed embedding row cache over a backing store: Neo's HBM / DRAM / SSD tiers.

    kernel = CachedEmbeddingBag(tables, SparseOptimizerSpec("adam"), cache_rows=[1000, 64],
                                policy="lru", storage_dir="/nvme/job/rank0")
    pooled = kernel(values, offsets)   # rows made resident, then the inner kernel's lookup
    kernel.prefetch(next_values, next_offsets)   # optional: between this forward and backward
    pooled.backward(grad)              # the inner kernel's fused update, on the cached slots

This module holds the cache: victims, prefetch and ``CachedEmbeddingBag``; its bookkeeping
(``_Ops``, the row maps, ``_Slots``) is in kernels/cache_maps.py. Every table's full rows and
their optimizer state live in a backing store (kernels/cache_store.py, re-exported here:
``HostStore``: CPU tensors, the DRAM tier; ``MmapStore``: one memory-mapped file per table and
tensor, the SSD tier). An inner fused
kernel of any backend holds ``cache_rows[t]`` rows ("slots") of table t, so lookup and fused
optimizer run at full speed on the slots; a row map (a dense int32 array, or for tables past
``DENSE_MAP_MAX_ROWS`` rows a binary search in the sorted resident rows) and ``slot_row`` map
between a table's rows and its slots.

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

Victims are chosen among unpinned slots not holding a row of the batch, free slots first (they
are taken in slot order and never freed, so they are the last ``free`` slots): ``lru`` evicts
the least recently used (a per-slot tick, advanced once per lookup/prefetch call), ties by slot;
``lfu`` the least frequently used (a count of id occurrences at lookup, per slot for resident
rows and per row for the others, carried along when a row moves, so kept across evictions as
Neo's LFU does), ties broken by tick then slot index. Dirty victims (updated since their fetch)
are written back first. Everything is deterministic, and the same on CPU and on a device.

Cost of a call, per table (the step's overhead over the resident kernel). The bookkeeping is
numpy on CPU, torch tensors on a device (``_Ops``). One gather of the batch's ids through the
row map; a sort (unique) of only the missing ids; the batch's slots touched by one scatter of
the tick (entry C takes the missing ids', so no mask); the victims (LRU on CPU: a count of the
ticks in LRU_WINDOW bins, then two passes; otherwise one top-k over the slots holding rows); the
dirty victims' write-back and the fetch as indexed row copies (on CPU one record copy a row,
``cache_store._rows``); a gather of the fetched ids' slots; the dirty flags set by one pass over
the batch's slot mask. A lookup right after a prefetch that fetched its whole batch reuses the
prefetch's slots (no second gather). On a device the host waits (a sync) 8 times in a lookup
that fetches, as before: the feature spans, the missing ids' count and their unique rows, the
dirty victims, and the copies to and from the store (the rows, weights and each state); LFU
also the largest count (the victim key's overflow check), a prefetch whether its victims fit, a
batch with more ids than slots its unique rows; statistics counted on the device are read only
by ``stats()``. On CPU nothing waits.

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
import threading
import time
from pathlib import Path
from typing import Callable, ClassVar, Sequence

import numpy as np
import torch

from .base import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec, state_shapes
from .cache_maps import Array, RowViews, _DenseRowMap, _Ops, _Slots, _SortedRowMap
from .cache_store import BackingStore, HostStore, MmapStore, _copy_rows, _take_rows
from .flat_storage import check_shape
from .init import init_table_rows
from .registry import create_embedding_bag

__all__ = ["CachedEmbeddingBag", "BackingStore", "HostStore", "MmapStore", "CACHE_POLICIES", "too_small_message"]

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


def _same_batch(batch: tuple[torch.Tensor, torch.Tensor], values: torch.Tensor, offsets: torch.Tensor) -> bool:
    """Whether (values, offsets) equal a prefetched batch's (a pass over the ids, no gather)."""
    v, o = batch
    return v.shape == values.shape and o.shape == offsets.shape and torch.equal(o, offsets) and torch.equal(v, values)


# ---- the cache ----------------------------------------------------------------------------------
DENSE_MAP_MAX_ROWS = 2**26
"""Tables of at most this many rows map rows to slots with a dense int32 array (4 bytes a row, at
most 256 MiB, one gather a lookup); larger ones with the sorted resident rows (16 bytes a slot, a
binary search a lookup, a sort of the slots after each fetch)."""

NUMPY_ON_CPU = True
"""On CPU keep the bookkeeping in numpy (``_Ops``); tests turn this off to run the torch spelling,
the one a GPU runs, on CPU."""
LRU_WINDOW = 64
"""LRU victims on CPU: ticks (calls) below the pin tick counted one bin each; older ones share a
bin (a top-k then); the victims of a steady cache were last used a few calls ago."""


def too_small_message(what: str, needed: int, rows: int, slots: int, batch: str = "one batch") -> str:
    """The error for a cache of ``slots`` of a shard's ``rows`` rows that ``batch`` needs ``needed``
    unique rows of, naming the smallest load factor that fits (rounded up to 4 digits); ``what``
    names the table (and shard)."""
    x = needed / rows
    step = 10.0 ** (math.floor(math.log10(x)) - 3)
    return (
        f"cached embedding: {what} needs {needed} unique rows in {batch} but its cache holds "
        f"{slots} rows; a cache_load_factor of at least {math.ceil(x / step - 1e-9) * step:.4g} "
        f"(= {needed}/{rows} rows) fits it"
    )


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
        self._ops = _Ops(self.device_, NUMPY_ON_CPU)
        self._slots = [self._new_slots(spec.rows, c) for spec, c in zip(tables, slots)]
        self._tick = 0  # lookups and prefetches so far
        # the latest prefetch's batch (values, offsets) and per table (ids, slots, no missing rows),
        # when it fetched every table's rows; the next lookup takes it (and drops it either way)
        self._prefetched_plan: tuple[tuple[torch.Tensor, torch.Tensor], list[tuple[Array, Array, Array]]] | None = None
        self._pin_tick = 0  # the latest lookup's tick: slots used since are pinned
        self._stats: dict[str, int | float] = {k: 0 for k in _STAT_KEYS} | {"fetch_s": 0.0}
        # the parts of _STAT_KEYS counted where the bookkeeping lives (on a device: no host sync per
        # lookup); stats() adds them
        self._device_stats: dict[str, Array | int] = {k: 0 for k in _DEVICE_STATS}
        self._lock = threading.RLock()

    def _new_slots(self, rows: int, c: int) -> _Slots:
        ops = self._ops
        row_map = (_DenseRowMap if rows <= DENSE_MAP_MAX_ROWS else _SortedRowMap)(rows, c, ops)
        return _Slots(
            map=row_map, slot_row=ops.full(c, -1, "int64"), tick=ops.full(c + 1, -1, "int64"),
            dirty=ops.full(c, False, "bool"), prefetched=ops.full(c, False, "bool"),
            freq=ops.full(rows, 0, "int64") if self.policy == "lfu" else None,
            slot_freq=ops.full(c, -1, "int64") if self.policy == "lfu" else None, free=c,
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
        prefetched, self._prefetched_plan = self._prefetched_plan, None
        with torch.no_grad():
            if prefetched is not None and _same_batch(prefetched[0], values, offsets):
                plans = prefetched[1]  # every row resident and pinned since: no second map lookup
            else:
                plans = [self._plan(t, values, spans) for t in range(len(self.tables))]
            for t, (ids, slots, missing) in enumerate(plans):  # check every table before changing any
                C = self.cache_rows[t]
                if len(ids) > C:  # else it fits: a batch has no more unique rows than ids
                    resident = self._ops.full(C + 1, False, "bool")
                    resident[slots] = True
                    needed = int(resident[:C].sum()) + len(missing)
                    if needed > C:
                        raise ValueError(self._too_small(t, needed))
            self._tick += 1
            self._pin_tick = self._tick  # releases every pin: the previous batch's backward has run
            table_slots, touched = [], []
            for t, (ids, slots, missing) in enumerate(plans):
                c = self._slots[t]
                c.tick[slots] = self._tick
                resident = c.tick[:-1] == self._tick  # the batch's resident rows, once each
                touched.append(resident)
                unique = resident.sum()
                self._device_stats["unique_rows"] += unique
                self._stats["unique_rows"] += len(missing)
                if c.has_prefetched:
                    self._device_stats["hits"] += (resident & ~c.prefetched).sum()
                    c.prefetched[:] = False
                    c.has_prefetched = False
                else:
                    self._device_stats["hits"] += unique
                if len(missing):  # victims: the least recently / frequently used unpinned slots
                    victims = self._victims(t, len(missing), check=False)
                    self._replace(t, victims, missing, prefetch=False)
                    slots = c.map.refresh(ids, slots)
                    resident[victims] = True
                if c.slot_freq is not None:
                    self._ops.add_at(c.slot_freq, slots)
                table_slots.append(slots)
            slot_values = self._feature_major(values, spans, table_slots)
        self._stats["lookups"] += values.numel()
        self._stats["fetch_s"] += time.perf_counter() - start
        out = self.inner._lookup(slot_values, offsets, per_sample_weights)
        if out.requires_grad:  # the inner backward will update the batch's (pinned) slots in place
            for c, batch_slots in zip(self._slots, touched):
                c.dirty |= batch_slots
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
        plans, deferred = [], False
        with torch.no_grad():
            for t in range(len(self.tables)):
                ids, slots, missing = self._plan(t, values, spans)
                c = self._slots[t]
                c.tick[slots] = self._tick  # the coming batch's: pinned, not victims
                if len(missing):
                    victims = self._victims(t, len(missing), check=True)
                    if victims is None:
                        self._stats["prefetch_deferred"] += 1
                        deferred = True
                        continue
                    self._replace(t, victims, missing, prefetch=True)
                    self._stats["prefetched_rows"] += len(missing)
                    slots = c.map.refresh(ids, slots)
                plans.append((ids, slots, missing[:0]))
        # the batch's lookup (the next one, if it is this batch) starts from these slots: they stay
        # pinned until then, and every mapping change keeps a pinned row in its slot
        self._prefetched_plan = None if deferred else ((values.clone(), offsets.clone()), plans)
        self._stats["fetch_s"] += time.perf_counter() - start

    def _plan(self, t: int, values: torch.Tensor, spans: list[tuple[int, int]]) -> tuple[Array, Array, Array]:
        """Table t's ids in the batch (n,) int64, their slots (n,) int64 (C where not resident)
        and the sorted unique rows not resident. Changes nothing."""
        c = self._slots[t]
        ids = self._table_ids(values, spans, t)
        slots = c.map.lookup(ids)
        missing = ids[slots == c.map.missing]
        return ids, slots, self._ops.unique(missing) if len(missing) else missing

    def _victims(self, t: int, k: int, check: bool) -> Array | None:
        """The k slots of table t to reuse, among those not pinned (tick below the pin tick):
        free slots first, then by policy (module docstring), ties by slot. Free slots are taken
        in slot order and never freed, so they are the last ``free``: a range, no search. The
        rest: LRU the smallest (tick, slot), in slot order; LFU the smallest (frequency, tick,
        slot) by one top-k over a composite key, in that order. ``check``: None when fewer than
        k slots are unpinned (a prefetch then skips the table; a lookup has checked that its
        batch fits, and on a device the check waits for it)."""
        c, C, pin, ops = self._slots[t], self.cache_rows[t], self._pin_tick, self._ops
        if k > C:  # a prefetch of a batch the cache cannot hold (its lookup will say so)
            return None
        used = C - c.free  # slots [0, used) hold rows
        free = ops.arange(used, used + min(k, c.free))
        k -= len(free)
        if k == 0:
            return free
        tick = c.tick[:used]
        if c.slot_freq is None:
            rest = self._lru_victims(tick, k, pin, check)
        else:
            rest = self._lfu_victims(c, tick, k, pin, check)
        return None if rest is None else ops.cat(free, rest)

    def _lru_victims(self, tick: Array, k: int, pin: int, check: bool) -> Array | None:
        """The k unpinned slots of smallest (tick, slot), ascending by slot; None if fewer.

        On CPU without a sort: ticks are counted in LRU_WINDOW bins below the pin tick (older
        ticks share bin 0), the victims are every slot below the bin where the count reaches k and
        the lowest slots in it; one top-k when that bin is bin 0 (it mixes ticks). Elsewhere one
        top-k (a device has no cheap count-then-select without host syncs)."""
        ops, W = self._ops, LRU_WINDOW
        if ops.numpy:
            rel = tick - (pin - W)
            np.clip(rel, 0, W, out=rel)  # bin W: pinned (tick >= pin)
            cum = np.cumsum(np.bincount(rel, minlength=W + 1)[:W])
            if cum[-1] < k:
                return None
            b = int(np.searchsorted(cum, k))  # the first bin holding the k-th oldest
            if b > 0:
                below = rel < b
                need = k - int(cum[b - 1])
                at = np.flatnonzero(rel == b)[:need]
                below[at] = True
                return np.flatnonzero(below)
        key = tick * len(tick) + ops.arange(0, len(tick))  # unique; pinned ones >= pin x used
        keys, victims = ops.smallest(key, k)
        if check and int(keys[-1]) >= pin * len(tick):
            return None
        return ops.sort(victims)[0]

    def _lfu_victims(self, c: _Slots, tick: Array, k: int, pin: int, check: bool) -> Array | None:
        """The k unpinned used slots of smallest (frequency, tick, slot), in that order."""
        ops, used = self._ops, len(tick)
        freq = c.slot_freq[:used]
        span = (self._tick + 2) * used
        key = tick * used + ops.arange(0, used)
        if (int(freq.max()) + 1) * span >= 2**62:  # the composite key would overflow: sort
            cand = ops.nonzero(tick < pin)
            if len(cand) < k:
                return None
            order = ops.sort(key[cand])[1]
            order = order[ops.sort(freq[cand[order]])[1]]
            return cand[order[:k]]
        bound = torch.iinfo(torch.int64).max
        key = key + freq * span
        key[tick >= pin] = bound
        keys, victims = ops.smallest(key, k)
        if check and int(keys[-1]) >= bound:
            return None
        return victims

    def _replace(self, t: int, slots: Array, rows: Array, prefetch: bool) -> None:
        """Evict slots (k,) of table t, writing their dirty rows back first, and fetch rows (k,)
        (not resident) from the store into them; they become touched by this call."""
        c, k = self._slots[t], len(rows)
        old = c.slot_row[slots]
        dirty = slots[c.dirty[slots]]  # a dirty slot holds a row
        views = self.inner.rows_views(t)
        self._write_back(t, dirty, c.slot_row[dirty], views)
        self._copy_in(t, rows, slots, views)
        c.slot_row[slots] = rows
        taken = min(k, c.free)  # victims list free slots first
        if taken:  # a free slot "evicts" the row it receives (mapped right after): no mask, no sync
            old = self._ops.xp.where(old >= 0, old, rows)
        c.map.moved(old, rows, slots, c.slot_row)
        if c.slot_freq is not None:  # the leaving rows' counts, then the arriving rows'
            held = slice(None) if not taken else c.slot_freq[slots] >= 0
            c.freq[old[held]] = c.slot_freq[slots[held]]
            c.slot_freq[slots] = c.freq[rows]
        c.free -= taken
        c.tick[slots] = self._tick  # clean: the dirty ones were just written back
        if prefetch:
            c.prefetched[slots] = True
            c.has_prefetched = True
        self._stats["evictions"] += k - taken
        self._stats["misses"] += k
        self._stats["bytes_read"] += k * self._row_bytes[t]

    def _write_back(self, t: int, slots: Array, rows: Array, views: RowViews | None = None) -> None:
        """Write resident slots (k,) of table t, holding rows (k,), to the store; they become clean.
        ``views``: the inner kernel's ``rows_views(t)``, when the caller has them."""
        if len(slots) == 0:
            return
        index = self._ops.tensor(slots)
        weight, state = views or self.inner.rows_views(t)
        self.store.write(
            t, self._ops.host(rows), _take_rows(weight, index), {n: _take_rows(v, index) for n, v in state.items()},
        )  # fmt: skip
        self._slots[t].dirty[slots] = False
        self._stats["writebacks"] += len(slots)
        self._stats["bytes_written"] += len(slots) * self._row_bytes[t]

    def _copy_in(self, t: int, rows: Array, slots: Array, views: RowViews | None = None) -> None:
        """Copy rows (k,) of table t from the store into slots (k,) of the inner kernel."""
        weight_rows, state_rows = self.store.read(t, self._ops.host(rows))
        weight, state = views or self.inner.rows_views(t)
        index = self._ops.tensor(slots)
        _copy_rows(weight, index, weight_rows.to(weight.device))
        for name, view in state.items():
            _copy_rows(view, index, state_rows[name].to(view.device))

    # ---- batch helpers ------------------------------------------------------------------------
    def _feature_spans(self, offsets: torch.Tensor) -> list[tuple[int, int]]:
        """[(start, end)) of each feature's ids in ``values`` (bags are feature-major)."""
        F = self.num_features
        B = (offsets.numel() - 1) // F
        bounds = offsets[::B].tolist() if B > 0 else [0] * (F + 1)
        return [(int(bounds[f]), int(bounds[f + 1])) for f in range(F)]

    def _table_ids(self, values: torch.Tensor, spans: list[tuple[int, int]], t: int) -> Array:
        """(n_t,) int64 ids of table t in this batch, over every feature that reads it."""
        pieces = [values[slice(*spans[f])] for f in self._table_features[t]]
        if not pieces:
            return self._ops.full(0, 0, "int64")
        return self._ops.ids(pieces[0] if len(pieces) == 1 else torch.cat(pieces))

    def _feature_major(
        self, values: torch.Tensor, spans: list[tuple[int, int]], table_slots: list[Array]
    ) -> torch.Tensor:
        """The batch's slots (N,) int64 in ``values``' order from each table's (``_table_ids``
        order), as a tensor: the table's own array when one feature reads the whole batch."""
        if len(table_slots) == 1 and len(self._table_features[0]) == 1:
            return self._ops.tensor(table_slots[0])
        out = self._ops.full(values.numel(), 0, "int64")
        for t, slots in enumerate(table_slots):
            i = 0
            for f in self._table_features[t]:
                a, b = spans[f]
                out[a:b] = slots[i : i + b - a]
                i += b - a
        return self._ops.tensor(out)

    def _too_small(self, t: int, needed: int) -> str:
        spec = self.tables[t]
        return too_small_message(f"table '{spec.name or t}'", needed, spec.rows, self.cache_rows[t])

    # ---- accessors ----------------------------------------------------------------------------
    @_locked
    def flush(self) -> None:
        """Write every dirty slot back to the store (slots stay resident, now clean)."""
        with torch.no_grad():
            for t, c in enumerate(self._slots):
                slots = self._ops.nonzero(c.dirty)
                self._write_back(t, slots, c.slot_row[slots])
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
            dirty = self._ops.nonzero(affected & c.dirty)
            self._write_back(t, dirty, c.slot_row[dirty])
            write()
            slots = self._ops.nonzero(affected)
            if len(slots):
                self._copy_in(t, c.slot_row[slots], slots)

    def resident_rows(self, t: int) -> torch.Tensor:
        """Sorted (k,) int64 CPU tensor of table t's rows now in the cache."""
        rows = self._slots[t].slot_row
        return self._ops.host(self._ops.sort(rows[rows >= 0])[0])

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
