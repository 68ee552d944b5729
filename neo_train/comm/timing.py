"""A Communicator that times every collective by tag and forwards it to another.

Synchronous collectives are timed end to end; asynchronous ones from start to ``wait()``
returning (with the timer's clock: host time on CPU, CUDA events on the stream on GPU). Totals land in a PhaseTimer under ``comm:<tag>``; the bytes this rank hands to each
collective (its input tensor) are counted per tag in ``bytes_by_tag``.

``blocked:<tag>`` is the part of that the caller spent inside the calls: all of a synchronous
collective, the launch and the ``wait()`` of an asynchronous one (not the work it overlapped),
so a phase breakdown can subtract it from the phase that waited (``Trainer.step_breakdown``).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .interface import Communicator, Handle

__all__ = ["TimingCommunicator"]


class TimingCommunicator(Communicator):
    def __init__(self, inner: Communicator, timer, bytes_by_tag: dict[str, int] | None = None) -> None:
        self.inner, self.timer = inner, timer
        self.rank, self.world_size = inner.rank, inner.world_size
        self.bytes_by_tag: dict[str, int] = bytes_by_tag if bytes_by_tag is not None else {}

    def _count(self, tag: str, x: torch.Tensor) -> None:
        key = tag or "untagged"
        self.bytes_by_tag[key] = self.bytes_by_tag.get(key, 0) + x.numel() * x.element_size()

    def __getattr__(self, name):  # group, device, name, ... of the wrapped communicator
        return getattr(self.inner, name)

    def _timed(self, tag: str, call, async_op: bool):
        start = self.timer.start()
        out = call()
        key, blocked = f"comm:{tag or 'untagged'}", f"blocked:{tag or 'untagged'}"
        self.timer.stop(blocked, start)
        if not async_op:
            self.timer.stop(key, start)
            return out

        def wait() -> torch.Tensor:
            waited = self.timer.start()
            r = out.wait()
            self.timer.stop(key, start)
            self.timer.stop(blocked, waited)
            return r

        return Handle(wait, _future=out._future)

    def all_to_all_v(self, x, in_splits, out_splits, *, async_op=False, tag=""):
        self._count(tag, x)
        return self._timed(tag, lambda: self.inner.all_to_all_v(x, in_splits, out_splits, async_op=async_op, tag=tag), async_op)

    def all_gather_v(self, x, sizes, *, async_op=False, tag=""):
        self._count(tag, x)
        return self._timed(tag, lambda: self.inner.all_gather_v(x, sizes, async_op=async_op, tag=tag), async_op)

    def all_reduce(self, x, op="sum", *, async_op=False, tag=""):
        self._count(tag, x)
        return self._timed(tag, lambda: self.inner.all_reduce(x, op, async_op=async_op, tag=tag), async_op)

    def reduce_scatter_v(self, x, splits, *, async_op=False, tag=""):
        self._count(tag, x)
        return self._timed(tag, lambda: self.inner.reduce_scatter_v(x, splits, async_op=async_op, tag=tag), async_op)

    def barrier(self) -> None:
        self.inner.barrier()

    def subgroup(self, ranks: Sequence[int], name: str = "sub"):
        g = self.inner.subgroup(ranks, name=name)  # type: ignore[call-arg]
        return None if g is None else TimingCommunicator(g, self.timer, self.bytes_by_tag)

    def node_groups(self, local_world_size: int):
        intra, cross = self.inner.node_groups(local_world_size)  # type: ignore[attr-defined]
        return TimingCommunicator(intra, self.timer, self.bytes_by_tag), TimingCommunicator(cross, self.timer, self.bytes_by_tag)
