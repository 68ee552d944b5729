"""The initial weights of a logical table: one definition for every backend and every sharding."""
from __future__ import annotations

import torch

__all__ = ["init_table", "init_table_rows"]


def init_table(seed: int, table_index: int, rows: int, dim: int) -> torch.Tensor:
    """Table ``table_index``'s float32 CPU init, uniform(-sqrt(1/rows), sqrt(1/rows)), (rows, dim).

    A pure function of (seed, table index): a table starts identical whichever backend holds it
    and however it is sharded (a shard is a slice of this tensor), and its init does not depend
    on the sizes of the tables before it.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + table_index)
    bound = (1.0 / rows) ** 0.5
    return torch.empty(rows, dim).uniform_(-bound, bound, generator=g)


def init_table_rows(seed: int, table_index: int, rows: int, dim: int, row_start: int, row_end: int,
                    chunk_rows: int = 1 << 16):
    """Rows [row_start, row_end) of ``init_table(seed, table_index, rows, dim)`` as (start, block)
    pieces of at most ``chunk_rows`` rows, without materialising the table: the generator draws
    the same stream in chunks (bit-identical to the one-call init; tested), so a table larger
    than memory can be initialised straight into its backing store."""
    if not 0 <= row_start <= row_end <= rows:
        raise ValueError(f"rows [{row_start}, {row_end}) outside the table's {rows} rows")
    g = torch.Generator().manual_seed(seed * 1_000_003 + table_index)
    bound = (1.0 / rows) ** 0.5
    pos = 0
    while pos < row_end:
        n = min(chunk_rows, row_end - pos)
        block = torch.empty(n, dim).uniform_(-bound, bound, generator=g)
        lo = max(row_start - pos, 0)
        if lo < n:
            yield pos + lo, block[lo:]
        pos += n
