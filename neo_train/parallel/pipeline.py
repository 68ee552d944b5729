"""The train pipeline: the next batch's data loading and input dist run while this batch computes.

    pipe = TrainPipeline(trainer)
    for step in range(steps):
        loss = pipe.step(step)

Step i (main thread):  wait for batch i's distributed input -> hand batch i+1 to the worker ->
lookup + output dist + dense forward/backward + fused update + dense optimizer for batch i.
Worker thread:         next(data) -> to(device) -> validation + input dist (split sizes, then
                       ids/lengths all-to-all) on the input dist's own process group; on CUDA
                       on a side stream the compute stream waits for before using the batch.

The two threads never share a process group (the input dist has one of its own, DDP another),
so every rank issues each group's collectives in the same order: no mismatch, no deadlock. The
computation is the plain loop's, in the same order, so the per-step losses are identical
(tests/test_pipeline.py). What the main thread still waits for at the start of a step is the
input dist's *exposed* time (``pipeline_wait`` in the trainer's timer).
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, Iterator

import torch

from ..data.batch import Batch

__all__ = ["TrainPipeline"]


class TrainPipeline:
    def __init__(self, trainer: Any, data: Iterator[Batch] | None = None) -> None:
        self.trainer = trainer
        self.data = data if data is not None else trainer.train_data
        self.ebc = getattr(trainer.model, "embeddings", None)
        self.sharded = hasattr(self.ebc, "input_dist")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neo-input-dist")
        self._next: Future | None = None
        dev = torch.device(trainer.device)
        # on CUDA the worker's copies and input-dist kernels go on a side stream
        self._stream = torch.cuda.Stream(device=dev) if dev.type == "cuda" else None

    def _prepare(self) -> tuple[Batch, Any] | None:
        try:
            batch = next(self.data)
        except StopIteration:
            return None
        ctx = torch.cuda.stream(self._stream) if self._stream is not None else nullcontext()
        with ctx, torch.no_grad():
            batch = batch.to(self.trainer.device, non_blocking=True)
            dist = self.ebc.input_dist(batch.sparse) if self.sharded else None
        return batch, dist

    def step(self, step: int) -> float:
        """Run training step ``step``; returns the rank-local loss."""
        if self._next is None:
            self._next = self._pool.submit(self._prepare)
        with self.trainer.timer("pipeline_wait"):
            ready = self._next.result()  # re-raises the worker's errors (bad ids, timeouts)
        if ready is None:
            raise ValueError(f"training data ran out at step {step}")
        self._next = self._pool.submit(self._prepare)  # batch i+1 goes out while i computes
        batch, dist = ready
        if self._stream is not None:  # the compute stream waits for the side stream's work
            torch.cuda.current_stream().wait_stream(self._stream)
        return self.trainer.train_step(batch, step, distributed=dist)

    def drain(self) -> None:
        """Wait for the in-flight prefetch (kept for the next step): call before anything else
        uses the input dist's process group, e.g. an evaluation."""
        if self._next is not None:
            self._next.result()

    def close(self) -> None:
        """Let the in-flight prefetch finish (its collectives must complete on every rank)."""
        if self._next is not None:
            try:
                self._next.result()
            except Exception:  # noqa: BLE001 - the run is over; the error was or will be reported
                pass
            self._next = None
        self._pool.shutdown(wait=True)
