"""Per-phase wall-clock accounting of training steps.

    timer = PhaseTimer()
    with timer("lookup"):
        ...
    timer.totals()  -> {"lookup": seconds, ...}

Used by the sharded collection (input dist / lookup / output dist of every forward), by the
timing communicator (every synchronous collective, by tag: the embedding exchanges of the
backward among them) and by the trainer (forward, backward, optimizer).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import torch

__all__ = ["PhaseTimer"]


class PhaseTimer:
    def __init__(self, cuda_sync: bool = False) -> None:
        self._t: dict[str, float] = defaultdict(float)
        self._n: dict[str, int] = defaultdict(int)
        self.cuda_sync = cuda_sync and torch.cuda.is_available()

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.cuda_sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda_sync:
                torch.cuda.synchronize()
            self.add(phase, time.perf_counter() - start)

    def add(self, phase: str, seconds: float) -> None:
        self._t[phase] += seconds
        self._n[phase] += 1

    def totals(self) -> dict[str, float]:
        return dict(self._t)

    def reset(self) -> None:
        self._t.clear()
        self._n.clear()
