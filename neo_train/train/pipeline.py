"""The train pipeline: one thread issues every collective, in the same order on every rank.

    pipe = TrainPipeline(trainer)
    for step in range(steps):
        loss = pipe.step(step)        # the rank-local loss, a 0-d device tensor (no host sync)
    pipe.close()

Step i, all on the calling thread (the model of TorchRec's TrainPipelineSparseDist):

    wait for batch i's routed ids (its input dist was started during step i-1)     pipeline_wait
    start batch i+1's input dist: its id all-to-all, left in flight                 input_dist
    forward of batch i: lookups, pooled all-to-all in flight under the bottom MLP,
        interaction, top MLP, loss              (batch i+1's ids travel)            forward
    advance batch i+1's input dist: read its headers (the input dist's one host
        sync; the ids arrived during the forward)                                   input_dist
    backward of batch i: pooled-gradient exchange, DDP all-reduce, fused sparse
        update; dense optimizer step                                                backward, optimizer

The id all-to-all is sized from earlier batches' counts (``sharding.common.IdExchange``), so it
needs no split-size exchange before it: one collective per batch. Only the first batch, and a
batch whose ids outgrow the space reserved for them, take a second all-to-all, started at the
advance (batch i+1's ids then travel during batch i's backward, as in TorchRec's order).

Every rank issues: [i+1's ids] [i's output dist] ([i+1's overflow]) [i's backward exchanges and
DDP buckets] — the same collectives in the same order, whatever the timing, so NCCL cannot
deadlock on communicators issued in different orders (the input dist keeps a process group of
its own, so it never queues behind the backward's collectives on one communicator). Reading
the headers right after they were sent would make every rank wait there for the slowest
peer's forward; after a forward of its own the wait is usually nothing.

Data loading (``next(data)``, the host-side input checks, pinning, the host-to-device copy) runs
on a loader thread one batch further ahead; it issues no collective. On CUDA the loader copies
on a stream of its own and the input dist runs on a side stream; the compute stream waits for
them through events/``wait_stream``, and every tensor that crosses streams is
``record_stream``-ed, so the caching allocator cannot reuse its memory while another stream
may still read it. Nothing synchronises the device.

With cached tables (``storage.cache_load_factor`` < 1; ``neo_train.kernels.cache``) the input
dist runs two batches ahead, so the rows batch i+1 needs are known, and fetched, during batch
i's backward (TorchRec's prefetch pipeline):

    wait for batch i's prefetch (rows in its cache; usually done already)          cache_wait
    start batch i+2's input dist (ids)                                              input_dist
    forward of batch i                                                              forward
    advance batch i+2's input dist (headers); wait for batch i+1's routed ids       input_dist, pipeline_wait
    hand batch i+1's prefetch to the cache thread (no collectives: it moves rows
        between the backing store and the cache, evicting unpinned rows)            -
    backward of batch i (its rows stay pinned in the cache until batch i+1's lookup)

Whether a run pipelines this way is decided from the config, the same on every rank, so every
rank still issues the same collectives in the same order.

The computation is the plain loop's, in the same order, so the per-step losses are identical
(tests/test_pipeline.py, which also checks from the recorded collective order and times that
batch i+1's ids are in flight during batch i's forward, and that a batch takes one id collective).
"""
from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, Iterator

import torch

from ..comm.awaitable import Pending
from ..data.batch import Batch

__all__ = ["EndOfData", "TrainPipeline", "record_stream"]

_UNSET = object()


def record_stream(obj: Any, stream: "torch.cuda.Stream") -> None:
    """``Tensor.record_stream(stream)`` on every CUDA tensor in obj (dataclasses, lists, tuples)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_cuda:
            obj.record_stream(stream)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            record_stream(getattr(obj, f.name), stream)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            record_stream(v, stream)


def _pinned(batch: Batch) -> Batch:
    """A host batch in page-locked memory, so the device copy is truly asynchronous."""
    s = batch.sparse
    sparse = dataclasses.replace(
        s, values=s.values.pin_memory(), lengths=s.lengths.pin_memory(),
        weights=None if s.weights is None else s.weights.pin_memory(),
    )
    return Batch(batch.dense.pin_memory(), sparse, batch.labels.pin_memory())


@dataclasses.dataclass
class _Loaded:
    batch: Batch  # on the training device
    ready: Any  # CUDA: an event the copy stream recorded after the copy; else None
    check_s: float  # host seconds spent in the input checks
    data_s: float  # host seconds spent producing the batch (next(data))


class EndOfData(Exception):
    """The training data ended before step ``step``: the run stops there (not an error)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"the training data ended at step {step}")
        self.step = step


class TrainPipeline:
    def __init__(self, trainer: Any, data: Iterator[Batch] | None = None, first_step: int = 0) -> None:
        self.trainer = trainer
        self._load_step = first_step  # the step of the next batch the loader reads
        self.timer = trainer.timer
        self.data = data if data is not None else trainer.train_data
        self.ebc = trainer.model.embeddings
        self.sharded = hasattr(self.ebc, "input_dist")
        self.device = torch.device(trainer.device)
        cuda = self.device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(device=self.device) if cuda else None
        self._dist_stream = torch.cuda.Stream(device=self.device) if cuda else None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neo-data")
        self._loading: Future | None = None
        self._ahead: Any = _UNSET  # (loaded batch, its input dist in flight) for the next step
        self.data_stall_s = 0.0  # host seconds this thread waited for the loader
        # cached tables: the input dist two batches ahead, the next batch's rows prefetched on a
        # thread of their own (a config decision, alike on every rank)
        self.prefetching = trainer._any_cached_table()
        self._cache_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neo-cache") if self.prefetching else None
        self._ready: Any = _UNSET  # (loaded batch, routed ids, its prefetch) for this step

    # ---- loader thread: no collectives ------------------------------------------------------
    def _load(self) -> _Loaded | None:
        t0 = time.perf_counter()
        try:
            batch = next(self.data)
        except StopIteration:
            return None
        t1 = time.perf_counter()
        step, self._load_step = self._load_step, self._load_step + 1
        batch = self.trainer.check_batch(batch, step)
        t2 = time.perf_counter()
        if self._copy_stream is None:
            return _Loaded(batch.to(self.device), None, t2 - t1, t1 - t0)
        with torch.cuda.stream(self._copy_stream):
            batch = _pinned(batch).to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        return _Loaded(batch, ready, t2 - t1, t1 - t0)

    # ---- calling thread ---------------------------------------------------------------------
    def _next_loaded(self) -> _Loaded | None:
        if self._loading is None:
            self._loading = self._pool.submit(self._load)
        t0 = time.perf_counter()
        with self.timer("data_wait"):
            got = self._loading.result()  # re-raises the loader's errors (bad input, ...)
        self.data_stall_s += time.perf_counter() - t0
        self._loading = self._pool.submit(self._load)  # the batch after it loads meanwhile
        if got is not None:
            self.timer.add("check_inputs", got.check_s)
            self.timer.add("data", got.data_s)
        return got

    def _start(self) -> tuple[_Loaded, Pending | None] | None:
        """Take the next loaded batch and start its input dist (sharded models): its id
        all-to-all; ``_advance`` reads the headers."""
        got = self._next_loaded()
        if got is None or not self.sharded:
            return None if got is None else (got, None)
        stream = self._dist_stream
        with self.timer("input_dist"), self._on_dist_stream():
            if stream is not None:
                stream.wait_event(got.ready)
                record_stream(got.batch.sparse, stream)
            pending = self.ebc.input_dist(got.batch.sparse)
        return got, pending

    def _on_dist_stream(self) -> Any:
        """The input dist's work goes to its side stream on CUDA (a no-op context elsewhere)."""
        return torch.cuda.stream(self._dist_stream) if self._dist_stream is not None else nullcontext()

    def _advance(self, started: tuple[_Loaded, Pending | None] | None) -> None:
        """Read a started input dist's headers (and start its second round, if any)."""
        if started is None or started[1] is None:
            return
        with self.timer("input_dist"), self._on_dist_stream():
            started[1].advance()

    def _routed(self, got: _Loaded, pending: Pending | None):
        """Wait for a batch's routed ids (on the side stream on CUDA)."""
        with self.timer("pipeline_wait"):
            if pending is None:
                return got.batch.sparse
            with self._on_dist_stream():
                return pending.wait()  # the unpacking runs on the side stream too

    def _compute_waits(self, got: _Loaded, pending: Pending | None, sparse_in: Any) -> None:
        if self._copy_stream is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(got.ready)
            record_stream(got.batch, compute)
            if pending is not None:
                compute.wait_stream(self._dist_stream)
                record_stream(sparse_in, compute)

    def _prefetched(self, ahead: Any) -> Any:
        """(batch, routed ids, prefetch in flight) of a started batch, or None at the end."""
        if ahead is None:
            return None
        got, pending = ahead
        sparse_in = self._routed(got, pending)
        return got, pending, sparse_in, self._cache_pool.submit(self.ebc.prefetch, sparse_in)

    def _prefetch_step(self, step: int) -> torch.Tensor:
        if self._ready is _UNSET:
            self._ready = self._prefetched(self._start())
            self._ahead = self._start() if self._ready is not None else None
            self._advance(self._ahead)
        if self._ready is None:
            raise EndOfData(step)
        got, pending, sparse_in, fetching = self._ready
        with self.timer("cache_wait"):
            fetching.result()  # re-raises the prefetch's errors (a cache too small, ...)
        self._compute_waits(got, pending, sparse_in)
        nxt = self._ahead
        after = self._start() if nxt is not None else None  # batch i+2's ids
        loss = self.trainer.forward_loss(got.batch, sparse_in)
        self._advance(after)  # batch i+2's headers
        self._ahead = after
        self._ready = self._prefetched(nxt)  # batch i+1's ids, its rows fetched meanwhile
        self.trainer.backward_step(loss)
        return loss.detach()

    def step(self, step: int) -> torch.Tensor:
        """Run training step ``step``; returns the rank-local loss (a detached 0-d tensor)."""
        if self.prefetching:
            return self._prefetch_step(step)
        if self._ahead is _UNSET:
            self._ahead = self._start()
        if self._ahead is None:
            raise EndOfData(step)
        got, pending = self._ahead
        sparse_in = self._routed(got, pending)
        self._compute_waits(got, pending, sparse_in)
        nxt = self._start()  # batch i+1's ids travel during batch i's forward
        loss = self.trainer.forward_loss(got.batch, sparse_in)
        self._advance(nxt)  # batch i+1's headers: read after batch i's forward
        self._ahead = nxt
        self.trainer.backward_step(loss)
        return loss.detach()

    def close(self) -> None:
        """Finish the in-flight input dist (its collectives must complete on every rank) and
        stop the loader."""
        ahead, self._ahead = self._ahead, _UNSET
        if isinstance(ahead, tuple) and ahead[1] is not None:
            try:
                ahead[1].wait()
            except Exception:  # noqa: BLE001 - the run is over; the error was or will be reported
                pass
        ready, self._ready = self._ready, _UNSET
        if isinstance(ready, tuple):
            try:
                ready[3].result()  # the cache must be quiet before anyone reads or saves the tables
            except Exception:  # noqa: BLE001 - as above
                pass
        if self._cache_pool is not None:
            self._cache_pool.shutdown(wait=True)
        if self._loading is not None:
            self._loading.cancel()
        self._pool.shutdown(wait=True)
