"""Table and optimizer-state accessors (and base.py's ``rows_views``) shared by backends that
keep every table in one flat buffer (``self.weights``) with one flat buffer per state
(``self.state_<name>``), a step counter buffer (``self.step``) and two view helpers:
``_table_view(flat, t)`` -> (rows, dim) and ``_table_row_view(flat, t)`` -> (rows,)."""
from __future__ import annotations

import torch

from .base import state_shapes

__all__ = ["FlatStorageAccessors", "check_shape"]


def check_shape(what: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{what}: expected shape {tuple(shape)}, got {tuple(t.shape)}")


class FlatStorageAccessors:
    def get_table(self, t: int) -> torch.Tensor:
        return self._table_view(self.weights, t).to(torch.float32, copy=True)

    def set_table(self, t: int, weight: torch.Tensor) -> None:
        view = self._table_view(self.weights, t)
        check_shape(f"table {t}", weight, tuple(view.shape))
        view.copy_(weight)

    def rows_views(self, t: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        views = {}
        for name, shape in state_shapes(self.optimizer_spec.kind, 1, 1).items():
            flat = getattr(self, f"state_{name}")
            views[name] = self._table_view(flat, t) if len(shape) == 2 else self._table_row_view(flat, t)
        return self._table_view(self.weights, t), views

    def get_state(self, t: int) -> dict[str, torch.Tensor]:
        return {name: view.clone() for name, view in self.rows_views(t)[1].items()}

    def set_state(self, t: int, state: dict[str, torch.Tensor]) -> None:
        spec = self.tables[t]
        expected = state_shapes(self.optimizer_spec.kind, spec.rows, spec.dim)
        if set(state) != set(expected):
            raise ValueError(f"table {t}: state keys {sorted(state)} != {sorted(expected)}")
        for name, view in self.rows_views(t)[1].items():
            check_shape(f"table {t} state '{name}'", state[name], expected[name])
            view.copy_(state[name])

    @property
    def optimizer_step(self) -> int:
        return int(self.step)

    def set_optimizer_step(self, step: int) -> None:
        self.step.fill_(int(step))
