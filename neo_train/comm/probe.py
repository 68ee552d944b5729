"""Measuring this machine: its CPU's name (``cpu_model``, for reports), and what the ``cpu_local``
cluster preset (``topology/spec.py``) hard-codes — memory bandwidth, one-thread matmul FLOP/s,
gloo loopback all-to-all bandwidth and latency.

    from neo_train.comm.probe import measure_cpu_local
    measure_cpu_local(world_size=2)     # {"memory_bandwidth": ..., "loopback_latency": ...}
"""
from __future__ import annotations

import math

from .spawn import run_ranks

__all__ = ["measure_cpu_local", "cpu_model"]


def measure_cpu_local(world_size: int = 2, mb: int = 16) -> dict[str, float]:
    """Measure what ``cpu_local`` hard-codes: memory bandwidth (copy), one-thread matmul FLOP/s,
    and gloo loopback all-to-all bandwidth and latency between ``world_size`` local ranks.

    Slow-ish (a few seconds: it spawns ranks) and machine-dependent: for a preset's comments,
    not for planning.
    """
    import time

    import numpy as np

    out: dict[str, float] = {}
    a = np.ones(32 << 20, dtype=np.float64)  # 256 MB
    b = np.empty_like(a)
    best = math.inf
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    out["memory_bandwidth"] = 2 * a.nbytes / best  # read + write

    import torch

    torch.set_num_threads(1)
    x = torch.randn(1024, 1024)
    best = math.inf
    for _ in range(5):
        t = time.perf_counter()
        x @ x
        best = min(best, time.perf_counter() - t)
    out["device_flops"] = 2 * 1024**3 / best

    per_rank = run_ranks(_loopback_probe, world_size, mb)
    out["loopback_bandwidth"] = min(r[0] for r in per_rank)
    out["loopback_latency"] = max(r[1] for r in per_rank)
    return out


def _loopback_probe(comm, mb: int) -> tuple[float, float]:
    """(bytes/s per direction, seconds per tiny all-to-all) on this rank."""
    import time

    import torch

    W = comm.world_size
    n = (mb << 20) // 4 // W * W
    x = torch.ones(n)
    splits = [n // W] * W
    comm.all_to_all_v(x, splits, splits)  # warm-up
    times = []
    for _ in range(5):
        t = time.perf_counter()
        comm.all_to_all_v(x, splits, splits)
        times.append(time.perf_counter() - t)
    sent = 4 * n * (W - 1) / W
    tiny = torch.ones(W)
    lat = []
    for _ in range(20):
        t = time.perf_counter()
        comm.all_to_all_v(tiny, [1] * W, [1] * W)
        lat.append(time.perf_counter() - t)
    return sent / min(times), sorted(lat)[len(lat) // 2]


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo), for benchmark reports."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"
