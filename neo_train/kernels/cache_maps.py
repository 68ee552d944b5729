"""The embedding row cache's bookkeeping (kernels/cache.py): where its arrays live (``_Ops``: numpy
on CPU, torch tensors on a device), the row -> slot maps (a dense int32 array, or a binary search
in the sorted resident rows for tables past ``cache.DENSE_MAP_MAX_ROWS`` rows) and one table's
slot state (``_Slots``). Internal to the cache; split out of cache.py to keep it readable."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np
import torch

__all__: list[str] = []  # internal: cache.py imports the names it needs

Array = Union[np.ndarray, torch.Tensor]  # a bookkeeping array: numpy on CPU, torch elsewhere (_Ops)
RowViews = tuple[torch.Tensor, dict[str, torch.Tensor]]  # an inner kernel's rows_views(t)


class _Ops:
    """Where the cache's bookkeeping arrays live, and the few operations numpy and torch spell
    differently. On CPU the arrays are numpy: a lookup makes ~30 index operations on arrays of 2k
    to 20k entries, where torch's CPU dispatch costs more than the work (measured alone, caches
    warm, 10k ids into 20k slots: ``ids[slots == C]`` 117 vs 13 us, ``(tick == T).sum()`` 36 vs
    7 us, ``tick[slots] = T`` 29 vs 17 us; inside a training step, caches cold, the saving is
    smaller: notes/cache.md). On another device they are torch tensors there. Everything else is
    written in the syntax both share: indexing and index assignment, comparisons, ``len``,
    ``.sum()`` / ``.max()`` / ``.clip()``, and ``xp.where``. unique, top-k and sort run through
    torch on CPU too, on the numpy memory (torch.unique of 2.5k ids: 55 us, np.unique: 370 us)."""

    def __init__(self, device: torch.device, numpy: bool) -> None:
        self.device = device
        self.numpy = numpy and device.type == "cpu"
        self.xp = np if self.numpy else torch

    def full(self, n: int, value: int | bool, dtype: str) -> Array:
        if self.numpy:
            return np.full(n, value, dtype=dtype)
        return torch.full((n,), value, dtype=getattr(torch, dtype), device=self.device)

    def arange(self, start: int, end: int) -> Array:
        return np.arange(start, end) if self.numpy else torch.arange(start, end, device=self.device)

    def ids(self, x: torch.Tensor) -> Array:
        """A tensor of ids (on the kernel's device) as an int64 array."""
        x = x.to(torch.int64)
        return x.numpy() if self.numpy else x

    def tensor(self, a: Array) -> torch.Tensor:
        """An array as a tensor on the kernel's device (on CPU sharing its memory)."""
        return torch.from_numpy(a) if self.numpy else a

    def host(self, a: Array) -> torch.Tensor:
        """An array as a CPU tensor, for the store."""
        return torch.from_numpy(a) if self.numpy else a.cpu()

    def int64(self, a: Array) -> Array:
        return a.astype(np.int64) if self.numpy else a.to(torch.int64)

    def int32(self, a: Array) -> Array:
        return a.astype(np.int32) if self.numpy else a.to(torch.int32)

    def cat(self, a: Array, b: Array) -> Array:
        return np.concatenate((a, b)) if self.numpy else torch.cat((a, b))

    def nonzero(self, mask: Array) -> Array:
        """(k,) int64 indices of the true entries, ascending."""
        return np.flatnonzero(mask) if self.numpy else mask.nonzero().squeeze(1)

    def unique(self, a: Array) -> Array:
        """The sorted unique values."""
        return self._array(torch.unique(self.tensor(a)))

    def smallest(self, key: Array, k: int) -> tuple[Array, Array]:
        """The k smallest keys, ascending, and their indices (keys unique: deterministic)."""
        values, indices = torch.topk(self.tensor(key), k, largest=False, sorted=True)
        return self._array(values), self._array(indices)

    def sort(self, a: Array) -> tuple[Array, Array]:
        """Stable ascending sort: (values, indices)."""
        values, indices = torch.sort(self.tensor(a), stable=True)
        return self._array(values), self._array(indices)

    def add_at(self, dst: Array, index: Array) -> None:
        """dst[i] += 1 for every occurrence of i in ``index``."""
        if self.numpy:
            np.add.at(dst, index, 1)
        else:
            dst.index_add_(0, index, torch.ones_like(index))

    def _array(self, x: torch.Tensor) -> Array:
        return x.numpy() if self.numpy else x


class _DenseRowMap:
    """Row -> slot as a (rows,) int32 array holding C (one past the last slot) for a row that is
    not resident."""

    def __init__(self, rows: int, c: int, ops: _Ops) -> None:
        self.missing = c
        self.ops = ops
        self.slot_of = ops.full(rows, c, "int32")

    def lookup(self, ids: Array) -> Array:
        """(n,) int64 rows -> (n,) int64 slots, C where not resident."""
        return self.ops.int64(self.slot_of[ids])

    def refresh(self, ids: Array, slots: Array) -> Array:
        """``slots`` (``lookup(ids)`` before rows were fetched) now: on CPU only the ids that were
        missing are looked up again (a gather of the misses, not of the batch), on a device all
        of them (boolean indexing would wait for the device)."""
        if not self.ops.numpy:
            return self.lookup(ids)
        absent = slots == self.missing
        slots[absent] = self.lookup(ids[absent])
        return slots

    def moved(self, evicted: Array, fetched: Array, slots: Array, slot_row: Array) -> None:
        """Rows ``evicted`` left the cache (unmapped first: it may also hold rows of ``fetched``);
        rows ``fetched`` (k,) now sit in ``slots`` (k,) (``slot_row`` is already updated)."""
        self.slot_of[evicted] = self.missing
        self.slot_of[fetched] = self.ops.int32(slots)


class _SortedRowMap:
    """Row -> slot by binary search in the sorted ``slot_row`` (free slots, -1, sort first): O(C)
    memory whatever the table's rows, for shards past DENSE_MAP_MAX_ROWS."""

    def __init__(self, rows: int, c: int, ops: _Ops) -> None:
        self.missing = c
        self.ops = ops
        self.keys = ops.full(c, -1, "int64")  # sorted slot_row
        self.slots = ops.arange(0, c)  # slot of each key

    def lookup(self, ids: Array) -> Array:
        pos = self.ops.xp.searchsorted(self.keys, ids).clip(max=len(self.keys) - 1)
        found = self.keys[pos] == ids
        return self.ops.xp.where(found, self.slots[pos], self.missing)

    def refresh(self, ids: Array, slots: Array) -> Array:
        return self.lookup(ids)

    def moved(self, evicted: Array, fetched: Array, slots: Array, slot_row: Array) -> None:
        self.keys, self.slots = self.ops.sort(slot_row)


@dataclass
class _Slots:
    """One table's cache bookkeeping (arrays as _Ops places them). C = the table's cache rows."""

    map: _DenseRowMap | _SortedRowMap  # row -> slot, C for a row not resident
    slot_row: Array  # (C,) int64, -1 for a free slot
    # (C+1,) int64: the call that last used the slot, -1 never; pinned while >= the pin tick. Entry
    # C takes the touches of ids not resident, so a batch's slots are touched without a mask.
    tick: Array
    dirty: Array  # (C,) bool: updated since fetched (the store's copy is stale)
    prefetched: Array  # (C,) bool: fetched by a prefetch since the last lookup
    # LFU only: id occurrences at lookup, per row (rows,) int64 for rows not resident, per slot
    # (C,) int64 for the row in it (-1 free): a lookup counts into the small array, a move
    # carries the counts of the rows that leave and arrive
    freq: Array | None
    slot_freq: Array | None
    free: int  # free slots left (they are taken first and never freed again)
    has_prefetched: bool = False  # some slot's ``prefetched`` is set
