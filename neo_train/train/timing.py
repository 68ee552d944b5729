"""Per-phase time accounting of training steps, without synchronising the device.

    timer = PhaseTimer(cuda=device.type == "cuda")
    with timer("lookup"):
        ...
    tok = timer.start(); ...; timer.stop("comm:output_dist", tok)   # spans that end elsewhere
    timer.totals()  -> {"lookup": seconds, ...}

On the CPU a phase is host wall-clock time (``time.perf_counter``). On CUDA a phase is the time
between two CUDA events recorded on the current stream at its start and end: nothing waits for
the device while training runs, and the events are read (each waiting only for its own end
event, never ``torch.cuda.synchronize``) when ``totals()`` is called, once per logging interval.

Used by the sharded collection (input dist / lookup / output dist of every forward), by the
timing communicator (every collective, by tag: the embedding exchanges of the backward among
them) and by the trainer and its pipeline (forward, backward, optimizer, pipeline_wait, data).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import torch

__all__ = ["PhaseTimer"]


class PhaseTimer:
    def __init__(self, cuda: bool = False) -> None:
        self._t: dict[str, float] = defaultdict(float)
        self._n: dict[str, int] = defaultdict(int)
        self.cuda = cuda and torch.cuda.is_available()
        self._unread: list[tuple[str, Any, Any]] = []  # CUDA: (phase, start event, end event)
        self._paused = 0  # > 0: spans closed now are not booked (``paused``)

    def start(self) -> Any:
        """A start mark: a recorded CUDA event, or the host clock."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, phase: str, start: Any) -> None:
        """Close a span opened by ``start()`` and book it under ``phase``."""
        if self._paused:
            return
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._unread.append((phase, start, end))
            self._n[phase] += 1
        else:
            self.add(phase, time.perf_counter() - start)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = self.start()
        try:
            yield
        finally:
            self.stop(phase, start)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Book nothing that closes inside (evaluation: its lookups and exchanges are no part of
        the training steps' breakdown)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def add(self, phase: str, seconds: float) -> None:
        if self._paused:
            return
        self._t[phase] += seconds
        self._n[phase] += 1

    def _read(self) -> None:
        for phase, start, end in self._unread:
            end.synchronize()  # waits for this event only
            self._t[phase] += start.elapsed_time(end) / 1e3
        self._unread.clear()

    def totals(self) -> dict[str, float]:
        self._read()
        return dict(self._t)

    def reset(self) -> None:
        self._unread.clear()
        self._t.clear()
        self._n.clear()
