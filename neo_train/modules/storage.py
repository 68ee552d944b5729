"""Where a kernel's embedding rows live: resident in the kernel, or in a backing store (host
memory, or the SSD tier) behind a bounded cache (``neo_train.kernels.cache``), and in which
precision. The one place both the unsharded collection and every sharding type build their
fused kernel and write the tables' initial rows.

A table shard is cached when its cache load factor is below 1: the plan's factor for the
table, else the table's own (``TableConfig.cache_load_factor``), else
``StorageConfig.cache_load_factor`` (``config.cache_factor``). Data-parallel replicas are never
cached (they are the small, hot tables, and every rank updates all of their rows through
DDP-style reductions).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import torch

from ..config import ModelConfig, StorageConfig, TableConfig, cache_factor
from ..kernels import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec, create_embedding_bag
from ..kernels.init import init_table_rows

__all__ = ["TABLE_DTYPES", "table_dtype", "cache_rows", "cached_tables", "create_table_kernel", "init_kernel_table"]

TABLE_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def table_dtype(storage: StorageConfig | None) -> torch.dtype:
    return TABLE_DTYPES[storage.table_dtype if storage is not None else "fp32"]


def cached_tables(model: ModelConfig, storage: StorageConfig | None, plan: Any = None) -> list[str]:
    """The tables whose shards are cached under ``plan`` (a ShardingPlan; None: unsharded): a
    cache load factor below 1 (``cache_factor``), and not data-parallel (replicas are never
    cached). Decided from the config and the plan alone, so every rank gets the same answer."""
    out = []
    for t in model.tables:
        tp = plan[t.name] if plan is not None else None
        if tp is not None and tp.sharding == "data_parallel":
            continue
        if cache_factor(t, storage, tp.cache_load_factor if tp is not None else None) < 1:
            out.append(t.name)
    return out


def cache_rows(rows: int, factor: float) -> int:
    """Cache slots of a shard of ``rows`` rows at ``factor``: ceil(factor * rows), at least 1."""
    return max(1, min(rows, math.ceil(factor * rows - 1e-9)))


def create_table_kernel(
    backend: str | None,
    specs: Sequence[TableSpec],
    optimizer: SparseOptimizerSpec,
    *,
    factors: Sequence[float],
    storage: StorageConfig | None,
    store_name: str,
    feature_table_map: Sequence[int],
    feature_names: Sequence[str],
    device: torch.device | str,
    seed: int = 0,
) -> FusedEmbeddingBag:
    """A fused kernel over ``specs``: cached (over the storage tier) when any factor is below 1,
    else the plain backend. ``store_name`` names this kernel's directory in the SSD tier
    (``<storage_dir>/<store_name>``); it must be unique among the kernels of the job."""
    from ..kernels.registry import default_backend

    dtype = table_dtype(storage)
    name = default_backend(device, dtype) if backend in (None, "auto") else backend
    options = {}
    if storage is not None and storage.stochastic_rounding:
        if name != "triton":
            raise ValueError(
                f"storage.stochastic_rounding: kernel backend '{name}' rounds fp16/bf16 updates to "
                "nearest only (the triton backend rounds stochastically); turn it off or use triton"
            )
        options["stochastic_rounding"] = True
    if all(f >= 1.0 for f in factors):
        return create_embedding_bag(
            name, specs, optimizer, feature_table_map=list(feature_table_map),
            feature_names=list(feature_names), device=device, weight_dtype=dtype, seed=seed, **options,
        )
    from ..kernels.cache import CachedEmbeddingBag

    if options:
        raise ValueError("storage.stochastic_rounding is not supported with a cache (cache_load_factor < 1)")
    inner = name
    directory = None
    if storage is not None and storage.storage_dir:
        directory = Path(storage.storage_dir) / store_name
        directory.mkdir(parents=True, exist_ok=True)
    return CachedEmbeddingBag(
        specs, optimizer,
        cache_rows=[cache_rows(s.rows, f) for s, f in zip(specs, factors)],
        policy=storage.cache_policy if storage is not None else "lru",
        inner_backend=inner,
        storage_dir=directory,
        feature_table_map=list(feature_table_map),
        feature_names=list(feature_names),
        device=device,
        weight_dtype=dtype,
        seed=seed,
        init_rows=False,  # init_kernel_table writes each shard's slice of its logical table
    )


def init_kernel_table(
    kernel: FusedEmbeddingBag, index: int, seed: int, table_index: int, table: TableConfig,
    row_start: int, row_end: int, col_start: int, col_end: int,
) -> None:
    """Write rows [row_start, row_end) x cols [col_start, col_end) of logical table
    ``table_index``'s init into the kernel's table ``index``: whole for a resident kernel,
    streamed in chunks straight into the backing store of a cached one (so a table larger than
    memory never materialises)."""
    write_rows = getattr(kernel, "write_rows", None)
    chunks = init_table_rows(seed, table_index, table.num_rows, table.dim, row_start, row_end)
    if write_rows is None:
        kernel.set_table(index, torch.cat([b[:, col_start:col_end] for _, b in chunks]))
        return
    for start, block in chunks:
        write_rows(index, start - row_start, block[:, col_start:col_end])
