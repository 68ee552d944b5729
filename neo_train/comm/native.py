"""The native backend: torch.distributed collectives (gloo on CPU, NCCL on GPU).

gloo lacks some ops, so: reduce-scatter-v is one all-to-all plus a local sum (the interface's
default), all-gather-v pads every rank's block to the largest and trims, and 'avg' all-reduce is a
sum divided by W. Timeouts come from the process group (``init_process_group(timeout=...)``);
any failure inside a collective is re-raised as ``CollectiveError`` naming the collective.
"""
from __future__ import annotations

import datetime
import os
from typing import Sequence

import torch
import torch.distributed as dist

from .interface import CollectiveError, Communicator, Handle, check_splits, mark_issue

__all__ = ["NativeCommunicator", "init_distributed"]

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def init_distributed(backend: str | None = None, timeout_s: float = 120.0) -> "NativeCommunicator | None":
    """Join the job torchrun (or our launcher) describes in the environment; None outside one.

    backend: 'nccl' when CUDA is available, else 'gloo', unless given.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        timeout = datetime.timedelta(seconds=timeout_s)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if attempt is None:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            # under torchrun the store outlives a restart: without a fresh prefix per attempt a
            # restarted rank can read a dead peer's address and fail to connect (or hang)
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                is_master=(rank == 0 and not agent_store), timeout=timeout,
            )
            store = dist.PrefixStore(f"neo_train/attempt_{attempt}", store)
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return NativeCommunicator(timeout_s=timeout_s)


class NativeCommunicator(Communicator):
    """Collectives of one torch.distributed process group (the default group when None)."""

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        global_ranks: Sequence[int] | None = None,
        timeout_s: float = 120.0,
        name: str = "world",
    ) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.global_ranks = list(global_ranks) if global_ranks is not None else list(range(self.world_size))
        self.timeout_s = timeout_s
        self.name = name
        self.backend = dist.get_backend(group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def __repr__(self) -> str:
        return f"NativeCommunicator({self.name}, rank {self.rank}/{self.world_size}, {self.backend})"

    # ---- helpers ------------------------------------------------------------------------------
    def _where(self, op: str, tag: str) -> str:
        t = f" [{tag}]" if tag else ""
        return f"{op}{t} on rank {self.rank} of group '{self.name}' (size {self.world_size}, ranks {self.global_ranks})"

    def _run(self, op: str, tag: str, start, finish, async_op: bool):
        """Start a torch.distributed op; wrap its errors; return the result or a Handle."""
        mark_issue()  # the data is the transport's from here on (interface.mark_issue)
        try:
            work = start()
        except Exception as e:  # noqa: BLE001 - any backend error becomes a named CollectiveError
            raise CollectiveError(f"{self._where(op, tag)} failed: {e}") from e

        def wait() -> torch.Tensor:
            try:
                if work is not None:
                    work.wait()
            except Exception as e:  # noqa: BLE001
                raise CollectiveError(
                    f"{self._where(op, tag)} failed or timed out (timeout {self.timeout_s:.0f}s; "
                    f"a peer may have died): {e}"
                ) from e
            return finish()

        def future() -> torch.futures.Future:
            return work.get_future().then(lambda _f: finish())

        return Handle(wait, _future=future if work is not None else None) if async_op else wait()

    # ---- collectives --------------------------------------------------------------------------
    def all_to_all_v(self, x, in_splits, out_splits, *, async_op=False, tag=""):
        W = self.world_size
        ins = check_splits("all_to_all_v in_splits", in_splits, W, x.shape[0])
        outs = check_splits("all_to_all_v out_splits", out_splits, W)
        x = x.contiguous()
        out = x.new_empty((sum(outs), *x.shape[1:]))
        if W == 1:
            out.copy_(x)
            return Handle(lambda: out) if async_op else out
        return self._run(
            "all_to_all_v",
            tag,
            lambda: dist.all_to_all_single(out, x, outs, ins, group=self.group, async_op=True),
            lambda: out,
            async_op,
        )

    def all_gather_v(self, x, sizes, *, async_op=False, tag=""):
        W = self.world_size
        s = check_splits("all_gather_v", sizes, W)
        if x.shape[0] != s[self.rank]:
            raise ValueError(f"all_gather_v: rank {self.rank} holds {x.shape[0]} rows, sizes say {s[self.rank]}")
        if W == 1:
            out = x.clone()
            return Handle(lambda: out) if async_op else out
        m = max(s)
        padded = x.new_zeros((m, *x.shape[1:]))
        padded[: x.shape[0]] = x
        bufs = [x.new_empty((m, *x.shape[1:])) for _ in range(W)]
        return self._run(
            "all_gather_v",
            tag,
            lambda: dist.all_gather(bufs, padded, group=self.group, async_op=True),
            lambda: torch.cat([b[:n] for b, n in zip(bufs, s)]),
            async_op,
        )

    def all_reduce(self, x, op="sum", *, async_op=False, tag=""):
        if op not in (*_OPS, "avg"):
            raise ValueError(f"all_reduce: unknown op {op!r} (sum, max, min, avg)")
        if self.world_size == 1:
            return Handle(lambda: x) if async_op else x
        red = _OPS["sum" if op == "avg" else op]

        def finish() -> torch.Tensor:
            if op == "avg":
                x.div_(self.world_size)
            return x

        return self._run(
            "all_reduce", tag, lambda: dist.all_reduce(x, op=red, group=self.group, async_op=True), finish, async_op
        )

    def barrier(self) -> None:
        if self.world_size > 1:
            # a tiny all-reduce rather than dist.barrier(): it honours the group's timeout on gloo
            self.all_reduce(torch.zeros(1, device=self.device), tag="barrier")

    def subgroup(self, ranks: Sequence[int], name: str = "sub") -> "NativeCommunicator | None":
        """Collective: every rank of this group must call it with the same ranks."""
        pg = dist.new_group(
            ranks=[self.global_ranks[r] for r in ranks], timeout=datetime.timedelta(seconds=self.timeout_s)
        )
        if self.rank not in ranks:
            return None
        return NativeCommunicator(pg, [self.global_ranks[r] for r in ranks], self.timeout_s, name)

    def node_groups(self, local_world_size: int) -> tuple["NativeCommunicator", "NativeCommunicator"]:
        """(intra-node, cross-node) communicators for this rank, nodes of ``local_world_size`` ranks.

        Intra: the ranks of this rank's node. Cross: the ranks with the same local index on every
        node. Every rank creates every group (torch.distributed requires it).
        """
        W, L = self.world_size, local_world_size
        if L < 1 or W % L:
            raise ValueError(f"world size {W} is not a multiple of the local world size {L}")
        intra = cross = None
        for n in range(W // L):
            g = self.subgroup(list(range(n * L, (n + 1) * L)), name=f"node{n}")
            intra = g or intra
        for l in range(L):
            g = self.subgroup(list(range(l, W, L)), name=f"cross{l}")
            cross = g or cross
        assert intra is not None and cross is not None
        return intra, cross
