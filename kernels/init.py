"""The initial weights of a logical table: one definition for every backend and every sharding."""
from __future__ import annotations

import torch

__all__ = ["init_table"]


def init_table(seed: int, table_index: int, rows: int, dim: int) -> torch.Tensor:
    """Table ``table_index``'s float32 CPU init, uniform(-sqrt(1/rows), sqrt(1/rows)), (rows, dim).

    A pure function of (seed, table index): a table starts identical whichever backend holds it
    and however it is sharded (a shard is a slice of this tensor), and its init does not depend
    on the sizes of the tables before it.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + table_index)
    bound = (1.0 / rows) ** 0.5
    return torch.empty(rows, dim).uniform_(-bound, bound, generator=g)
