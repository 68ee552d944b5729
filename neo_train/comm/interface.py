"""The collective interface: every byte the sharding code moves between ranks goes through here.

Four collectives, all "v" (per-peer sizes, along dim 0 of the tensor; trailing dims ride along):

    all_to_all_v(x, in_splits, out_splits)   x (sum in_splits, *S) -> (sum out_splits, *S)
                                             rows [off_j, off_j + in_splits[j]) go to rank j
    reduce_scatter_v(x, splits)              x (sum splits, *S) on every rank -> (splits[rank], *S):
                                             the sum over ranks of each rank's segment `rank`
    all_gather_v(x, sizes)                   x (sizes[rank], *S) -> (sum sizes, *S), rank 0 first
    all_reduce(x, op)                        in place, x on every rank -> sum (or max) over ranks

Each takes ``async_op``: False returns the result, True returns a ``Handle`` whose ``wait()``
returns it. Each takes a ``tag`` naming the training phase (``input_dist``, ``output_dist``, ...)
so a tracer can label the traffic. Every collective has a timeout: a peer that never arrives
raises ``CollectiveError`` naming the collective, the rank and the group, never a hang.

``Communicator`` is abstract so that schedules, codecs and tracers can stand in for the native
torch.distributed backend without touching the sharding code.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
import math
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence

import torch

if TYPE_CHECKING:
    from .codecs import Codec

__all__ = ["Communicator", "Handle", "CollectiveError", "check_splits", "reduce_scatter_by_all_to_all", "mark_issue",
           "clear_issue", "issued_at"]


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names it, the rank and the group."""


# When this thread first handed a collective to its transport since ``clear_issue`` (host
# perf_counter_ns; None: not yet). A backend marks it right before the transport call, from which
# on the data is the transport's: gloo's worker thread may send it while the launch is still
# returning (on a crowded host the woken worker can hold the caller's core for milliseconds). A
# tracer clears it before a call and reads it after, to time the part of a launch before that.
_issue = threading.local()


def clear_issue() -> None:
    _issue.ns = None


def mark_issue() -> None:
    """A backend's transport call follows now (the first mark since ``clear_issue`` counts)."""
    if getattr(_issue, "ns", None) is None:
        _issue.ns = time.perf_counter_ns()


def issued_at() -> int | None:
    """perf_counter_ns of the first ``mark_issue`` since ``clear_issue`` on this thread, or None."""
    return getattr(_issue, "ns", None)


@dataclass
class Handle:
    """An in-flight collective; ``wait()`` blocks (up to the timeout) and returns the result.

    ``future()`` gives a torch Future of the result (for DDP communication hooks): the backend's
    own future when it has one, so nothing blocks, else one completed by waiting now.
    """

    _wait: Callable[[], torch.Tensor]
    _done: torch.Tensor | None = None
    _future: Callable[[], torch.futures.Future] | None = None

    def wait(self) -> torch.Tensor:
        if self._done is None:
            self._done = self._wait()
        return self._done

    @property
    def has_future(self) -> bool:
        """Whether ``future()`` gives the backend's own future (completed by the transport, so
        callbacks chained on it see the completion) rather than one completed by waiting now."""
        return self._future is not None

    def future(self) -> torch.futures.Future:
        if self._future is not None:
            return self._future()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self.wait())
        return fut


def check_splits(name: str, splits: Sequence[int], world_size: int, total: int | None = None) -> list[int]:
    """Validate per-peer sizes: W non-negative ints (summing to ``total`` when given)."""
    s = [int(v) for v in splits]
    if len(s) != world_size:
        raise ValueError(f"{name}: {len(s)} split sizes for a world of {world_size}")
    if any(v < 0 for v in s):
        raise ValueError(f"{name}: negative split size in {s}")
    if total is not None and sum(s) != total:
        raise ValueError(f"{name}: split sizes {s} sum to {sum(s)}, tensor has {total} rows")
    return s


class Communicator(ABC):
    """The collectives of one process group (the whole job, a node, or ranks across nodes)."""

    rank: int
    world_size: int
    # when this thread first handed a collective to a transport since clear_issue (mark_issue);
    # here for code that holds a communicator but may not import this package (the calibration)
    clear_issue = staticmethod(clear_issue)
    issued_at = staticmethod(issued_at)

    @abstractmethod
    def all_to_all_v(
        self,
        x: torch.Tensor,
        in_splits: Sequence[int],
        out_splits: Sequence[int],
        *,
        async_op: bool = False,
        tag: str = "",
    ) -> torch.Tensor | Handle: ...

    @abstractmethod
    def all_gather_v(
        self, x: torch.Tensor, sizes: Sequence[int], *, async_op: bool = False, tag: str = ""
    ) -> torch.Tensor | Handle: ...

    @abstractmethod
    def all_reduce(
        self, x: torch.Tensor, op: str = "sum", *, async_op: bool = False, tag: str = ""
    ) -> torch.Tensor | Handle: ...

    def reduce_scatter_v(
        self, x: torch.Tensor, splits: Sequence[int], *, async_op: bool = False, tag: str = ""
    ) -> torch.Tensor | Handle:
        """Default: ``reduce_scatter_by_all_to_all``. Backends with a native reduce-scatter may
        override."""
        return reduce_scatter_by_all_to_all(self, x, splits, async_op=async_op, tag=tag)

    def split_sizes(self, my_sizes: Sequence[int], *, tag: str = "") -> list[int]:
        """Exchange per-peer counts: returns how many rows each peer will send to this rank.

        The first half of every "v" exchange (split sizes first, then values).
        """
        t = torch.tensor(list(my_sizes), dtype=torch.int64, device=getattr(self, "device", "cpu"))
        out = self.all_to_all_v(t, [1] * self.world_size, [1] * self.world_size, tag=tag)
        return [int(v) for v in out.tolist()]

    @abstractmethod
    def barrier(self) -> None: ...

    @abstractmethod
    def subgroup(self, ranks: Sequence[int]) -> "Communicator":
        """A communicator over ``ranks`` (global rank numbers); every rank must call it."""


def reduce_scatter_by_all_to_all(
    comm: Communicator, x: torch.Tensor, splits: Sequence[int], *, async_op: bool = False, tag: str = "",
    codec: "Codec | None" = None,
) -> torch.Tensor | Handle:
    """reduce_scatter_v as one all-to-all of the segments, then a local sum in rank order.

    Each rank sends segment j to rank j and receives W copies of its own segment, summed in rank
    order (so every run sums in the same order: deterministic). With ``codec`` the segments cross
    the wire encoded (as rows: x (n, *S) goes as (n, prod S)) and are decoded to x's dtype before
    the sum, which is why a quantized reduce-scatter cannot use a backend's native one.
    """
    W = comm.world_size
    s = check_splits("reduce_scatter_v", splits, W, x.shape[0])
    mine = s[comm.rank]
    wire = x if codec is None else codec.encode(x.reshape(x.shape[0], math.prod(x.shape[1:]))).contiguous()
    got = comm.all_to_all_v(wire, s, [mine] * W, async_op=async_op, tag=tag)

    def finish(y: torch.Tensor) -> torch.Tensor:
        if codec is not None:
            y = codec.decode(y, x.dtype)
        parts = y.view(W, mine, *x.shape[1:])
        return parts.sum(dim=0) if W > 1 else parts[0].clone()

    return Handle(lambda: finish(got.wait())) if async_op else finish(got)
