"""Helpers for tests and benchmarks (never imported by neo_train itself): ``run_ranks`` and its
companions, re-exported from ``neo_train.comm.spawn`` where the runtime keeps them, and
``cpu_model`` (``neo_train.comm.probe``) for benchmark reports.

    def body(comm, x):            # runs on every rank; comm is the world NativeCommunicator
        return comm.rank * x
    assert run_ranks(body, 3, 10) == [0, 10, 20]
"""
from __future__ import annotations

from .comm.probe import cpu_model
from .comm.spawn import RankFailed, free_port, run_ranks

__all__ = ["run_ranks", "free_port", "RankFailed", "cpu_model"]
