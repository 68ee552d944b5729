"""Spawn N local gloo ranks and run a function on each: the one helper every multi-rank test,
CPU benchmark and local tool (``neo-train replay`` outside torchrun, the ``cpu_local`` probe) uses.

    def body(comm, x):            # runs on every rank; comm is the world NativeCommunicator
        return comm.rank * x
    assert run_ranks(body, 3, 10) == [0, 10, 20]

Ranks are processes started from a fork server that has already imported torch (fast, and safe:
the server never runs an OpenMP region). Nodes are faked through ``local_world_size``
(LOCAL_WORLD_SIZE / LOCAL_RANK in the environment). Any rank's exception is re-raised in the
caller with that rank's traceback; a rank that hangs is killed after ``timeout_s``.
"""
from __future__ import annotations

import os
import pickle
import socket
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

__all__ = ["run_ranks", "free_port", "RankFailed", "rank_environment"]


class RankFailed(RuntimeError):
    """A rank raised; the message carries its rank and traceback."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, world_size: int, local_world_size: int, port: int, coll_timeout_s: float,
           threads: int, fn: Callable, args: tuple, queue) -> None:
    import torch
    import torch.distributed as dist

    from .native import init_distributed

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(local_world_size),
        LOCAL_RANK=str(rank % local_world_size),
        GROUP_RANK=str(rank // local_world_size),
    )
    torch.set_num_threads(threads)
    try:
        comm = init_distributed("gloo", timeout_s=coll_timeout_s)
        result = fn(comm, *args)
        # plain pickle bytes: torch's queue pickler would pass tensors as shared-memory file
        # descriptors, which vanish if this process exits before the parent reads them
        queue.put((rank, True, pickle.dumps(result)))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def rank_environment() -> None:
    """Before starting rank processes (they inherit this process's environment):
    ``THP_MEM_ALLOC_ENABLE=1``, unless it is set already or ``NEO_TRAIN_MALLOC=default``. PyTorch's
    CPU allocator then page-aligns host tensors and uses transparent huge pages for those of 2 MiB
    and more, which keeps a training step's large tensors from fragmenting the heap into fresh
    pages every few steps; PyTorch reads it at a process's first allocation, so only a process
    started with it benefits (``neo_train/train/cpu_malloc.py`` has the measurements)."""
    if os.environ.get("NEO_TRAIN_MALLOC", "").strip().lower() != "default":
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        rank_environment()  # before the fork server starts: the ranks inherit its environment
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "neo_train"])
    return _CTX


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    local_world_size: int | None = None,
    timeout_s: float = 180.0,
    collective_timeout_s: float = 60.0,
    threads: int = 1,
) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` gloo ranks; return the results in rank order.

    ``fn`` must be importable (a module-level function) and its results picklable.
    """
    L = local_world_size or world_size
    if world_size % L:
        raise ValueError(f"world size {world_size} is not a multiple of local_world_size {L}")
    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, L, port, collective_timeout_s, threads, fn, args, queue), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    import queue as _q

    import time as _time

    done: dict[int, tuple[bool, Any]] = {}
    deadline = _time.monotonic() + timeout_s
    dead_since: dict[int, float] = {}
    try:
        while len(done) < world_size:
            try:
                rank, ok, payload = queue.get(timeout=0.5)
                done[rank] = (ok, payload)
                continue
            except _q.Empty:
                pass
            now = _time.monotonic()
            for r, p in enumerate(procs):  # a rank that exited without reporting: give its
                if r not in done and p.exitcode is not None:  # message 2 s to arrive, then fail
                    dead_since.setdefault(r, now)
            gone = sorted(r for r, t0 in dead_since.items() if r not in done and now - t0 > 2.0)
            if gone or now > deadline:
                missing = sorted(set(range(world_size)) - set(done))
                why = f"exited (codes {[procs[r].exitcode for r in gone]}) without a result" if gone else f"did not finish within {timeout_s:.0f}s"
                failed = "".join(f"\n--- rank {r} ---\n{p}" for r, (ok, p) in sorted(done.items()) if not ok)
                raise RankFailed(f"ranks {gone or missing} {why}{failed}")
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    failures = [f"--- rank {r} ---\n{p}" for r, (ok, p) in sorted(done.items()) if not ok]
    if failures:
        raise RankFailed("\n".join(failures))
    return [pickle.loads(done[r][1]) for r in range(world_size)]
