"""Results still in flight: ``Pending`` (wait explicitly) and ``LazyTensor`` (waits on first use).

    pending = Pending(lambda: handle.wait())   # a collective started now
    ...                                        # independent work overlaps it
    x = pending.wait()                         # blocks (once); later calls return the same value

A two-stage exchange (the input dist's id exchange: its headers read, then a second payload
where a peer's ids outgrew the space reserved for them) gives ``Pending`` an ``advance`` step:
``pending.advance()`` waits for the first stage and starts the second, so the caller picks the
moment (after work that hid the first stage) instead of ``wait()`` doing both.

A sharded embedding collection returns a ``LazyTensor`` from ``forward``: the caller (a DLRM that
knows nothing of distribution) goes on with its bottom MLP while the pooled all-to-all is in
flight, and the first torch operation that touches the result waits for it. This is TorchRec's
``LazyAwaitable`` idea: the model's code is the unsharded model's code.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Generic, TypeVar

import torch

__all__ = ["Pending", "LazyTensor", "wait_all"]

T = TypeVar("T")


class Pending(Generic[T]):
    """A value still being computed or communicated: ``wait()`` returns it (computed once).

    ``advance`` (optional) is the next stage, run at most once: by ``advance()`` when the caller
    chooses, else by ``wait()`` first."""

    __slots__ = ("_wait", "_value", "_done", "_advance")

    def __init__(self, wait: Callable[[], T], advance: Callable[[], None] | None = None) -> None:
        self._wait, self._value, self._done, self._advance = wait, None, False, advance

    @staticmethod
    def ready(value: T) -> "Pending[T]":
        p: Pending[T] = Pending(lambda: value)
        return p

    def advance(self) -> None:
        """Run the next stage now (e.g. read the id exchange's headers, start its second round)."""
        step, self._advance = self._advance, None
        if step is not None:
            step()

    def wait(self) -> T:
        if not self._done:
            self.advance()
            self._value, self._done = self._wait(), True
            self._wait = None  # type: ignore[assignment]  # drop what the closure held
        return self._value  # type: ignore[return-value]


def wait_all(x: Any) -> Any:
    """Replace every LazyTensor in a (nested list/tuple/dict) argument by its value."""
    if isinstance(x, LazyTensor):
        return x.wait()
    if isinstance(x, (list, tuple)):
        return type(x)(wait_all(v) for v in x)
    if isinstance(x, dict):
        return {k: wait_all(v) for k, v in x.items()}
    return x


class LazyTensor:
    """A tensor still in flight that waits for itself on first use.

    Any torch function or Tensor method given a LazyTensor waits for it and runs on the tensor;
    so do attribute reads (``.shape``) and arithmetic operators. ``wait()`` does so explicitly.
    """

    __slots__ = ("_pending",)

    def __init__(self, wait: Callable[[], torch.Tensor]) -> None:
        self._pending: Pending[torch.Tensor] = Pending(wait)

    def wait(self) -> torch.Tensor:
        return self._pending.wait()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return func(*wait_all(args), **wait_all(kwargs or {}))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wait(), name)

    def __repr__(self) -> str:
        state = "done" if self._pending._done else "in flight"
        return f"LazyTensor({state})"

    def __len__(self) -> int:
        return len(self.wait())

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self.wait()[wait_all(index)]

    def __bool__(self) -> bool:
        return bool(self.wait())


def _forward(op: Callable) -> Callable:
    def method(self: LazyTensor, *args: Any) -> Any:
        return op(self.wait(), *wait_all(args))

    return method


def _reflected(op: Callable) -> Callable:
    def method(self: LazyTensor, other: Any) -> Any:
        return op(wait_all(other), self.wait())

    return method


for _name, _op in {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow, "matmul": operator.matmul,
}.items():
    setattr(LazyTensor, f"__{_name}__", _forward(_op))
    setattr(LazyTensor, f"__r{_name}__", _reflected(_op))
for _name, _op in {
    "neg": operator.neg, "pos": operator.pos, "abs": operator.abs, "eq": operator.eq, "ne": operator.ne,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
}.items():
    setattr(LazyTensor, f"__{_name}__", _forward(_op))
LazyTensor.__hash__ = object.__hash__  # type: ignore[assignment]  # __eq__ is elementwise, as on Tensor
