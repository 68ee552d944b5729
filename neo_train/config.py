"""Configuration: frozen dataclasses with one docstring per field, TOML in/out, presets.

    cfg = preset("small")                        # or Config.load("my.toml")
    cfg = cfg.replace(train=cfg.train.replace(steps=50))
    cfg.dump("out.toml"); assert Config.load("out.toml") == cfg

Every dataclass validates itself in ``__post_init__`` and names the bad field.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "TableConfig",
    "ModelConfig",
    "TrainConfig",
    "DataConfig",
    "DistConfig",
    "StorageConfig",
    "cache_factor",
    "Config",
    "preset",
    "PRESETS",
    "CRITEO_KAGGLE_CARDINALITIES",
]

INTERACTIONS = ("dot", "cat", "dcn")
POOLINGS = ("sum", "mean")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
SPARSE_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
DATA_SOURCES = ("synthetic", "criteo")
ID_MODES = ("strict", "modulo")
CACHE_POLICIES = ("lru", "lfu")
TABLE_DTYPES = ("fp32", "fp16", "bf16")


def _check(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{where}: {msg}")


def _check_finite(obj: Any, section: str) -> None:
    """Every float field is a finite number (inf / nan in a TOML file or flag is an error)."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{section}.{f.name}: must be a finite number, got {v}")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a 0 must not silently mean "the default")."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return v


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    v = float(text)
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    v = float(text)
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


class _Replace:
    def replace(self, **changes: Any):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TableConfig(_Replace):
    """One embedding table and the sparse features that look it up."""

    name: str
    """Table name; unique within a model."""
    num_rows: int
    """Number of rows (the id space of every feature that uses this table)."""
    dim: int
    """Embedding dimension D."""
    pooling: str = "sum"
    """How a bag of ids is pooled: 'sum' or 'mean'."""
    pooling_factor: float = 1.0
    """Mean number of ids per bag (the synthetic generator draws bag lengths around it)."""
    feature_names: tuple[str, ...] = ()
    """Features looking up this table; empty means one feature named like the table."""
    zipf_alpha: float | None = None
    """Power-law exponent of this table's synthetic ids; None uses DataConfig.zipf_alpha."""
    cache_load_factor: float | None = None
    """Fraction of this table's rows (of each shard) kept in the device cache, the rest in the
    backing store; None uses StorageConfig.cache_load_factor. A plan's factor overrides both."""

    def __post_init__(self) -> None:
        _check_finite(self, f"table '{self.name}'")
        w = f"table '{self.name}'"
        _check(bool(self.name), "table", "name must be non-empty")
        _check(self.num_rows >= 1, w, f"num_rows must be >= 1, got {self.num_rows}")
        _check(self.dim >= 1, w, f"dim must be >= 1, got {self.dim}")
        _check(self.pooling in POOLINGS, w, f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        _check(self.pooling_factor >= 0, w, f"pooling_factor must be >= 0, got {self.pooling_factor}")
        _check(self.zipf_alpha is None or self.zipf_alpha >= 0, w, f"zipf_alpha must be >= 0, got {self.zipf_alpha}")
        _check(
            self.cache_load_factor is None or 0 < self.cache_load_factor <= 1, w,
            f"cache_load_factor must be in (0, 1], got {self.cache_load_factor}",
        )
        if not self.feature_names:
            object.__setattr__(self, "feature_names", (self.name,))
        object.__setattr__(self, "feature_names", tuple(self.feature_names))
        _check(len(set(self.feature_names)) == len(self.feature_names), w, "duplicate feature names")

    @property
    def num_params(self) -> int:
        return self.num_rows * self.dim


@dataclass(frozen=True)
class ModelConfig(_Replace):
    """A DLRM: bottom MLP over dense features, embedding tables, interaction, top MLP."""

    tables: tuple[TableConfig, ...]
    """The embedding tables, in feature order."""
    num_dense_features: int = 13
    """Width of the dense input (13 for Criteo)."""
    bottom_mlp: tuple[int, ...] = (64, 16)
    """Bottom MLP layer widths; the last is the dense embedding width."""
    top_mlp: tuple[int, ...] = (64, 32)
    """Top MLP hidden widths; a final 1-wide logit layer is always appended."""
    interaction: str = "dot"
    """'dot' (pairwise dot products, strict upper triangle), 'cat' (concatenation) or 'dcn' (DCNv2)."""
    dcn_num_layers: int = 2
    """Number of DCNv2 cross layers (interaction = 'dcn')."""
    dcn_low_rank: int = 0
    """Rank of the DCNv2 cross weight (0 = full rank)."""

    def __post_init__(self) -> None:
        _check_finite(self, "model")
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "bottom_mlp", tuple(self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(self.top_mlp))
        _check(len(self.tables) >= 1, "model.tables", "at least one table is required")
        names = [t.name for t in self.tables]
        dup = {n for n in names if names.count(n) > 1}
        _check(not dup, "model.tables", f"duplicate table names {sorted(dup)}")
        feats = [f for t in self.tables for f in t.feature_names]
        dupf = {f for f in feats if feats.count(f) > 1}
        _check(not dupf, "model.tables", f"feature(s) {sorted(dupf)} used by more than one table")
        _check(self.num_dense_features >= 1, "model.num_dense_features", f"must be >= 1, got {self.num_dense_features}")
        _check(len(self.bottom_mlp) >= 1 and min(self.bottom_mlp) >= 1, "model.bottom_mlp", f"needs >= 1 positive widths, got {self.bottom_mlp}")
        _check(all(w >= 1 for w in self.top_mlp), "model.top_mlp", f"widths must be positive, got {self.top_mlp}")
        _check(self.interaction in INTERACTIONS, "model.interaction", f"must be one of {INTERACTIONS}, got {self.interaction!r}")
        _check(self.dcn_num_layers >= 1, "model.dcn_num_layers", f"must be >= 1, got {self.dcn_num_layers}")
        _check(self.dcn_low_rank >= 0, "model.dcn_low_rank", f"must be >= 0, got {self.dcn_low_rank}")
        if self.interaction == "dot":
            d = self.bottom_mlp[-1]
            for t in self.tables:
                _check(
                    t.dim == d,
                    f"table '{t.name}'",
                    f"dim {t.dim} differs from bottom_mlp[-1] = {d}; the 'dot' interaction needs "
                    "every embedding as wide as the dense embedding (use interaction 'cat' or 'dcn')",
                )

    @property
    def feature_names(self) -> tuple[str, ...]:
        """All sparse features in batch order (tables in order, each table's features in order)."""
        return tuple(f for t in self.tables for f in t.feature_names)

    @property
    def num_embedding_params(self) -> int:
        return sum(t.num_params for t in self.tables)

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"no table named '{name}'")


@dataclass(frozen=True)
class TrainConfig(_Replace):
    """The training loop."""

    batch_size: int = 256
    """Per-rank batch size (as in TorchRec and Neo); the global batch is batch_size * world size."""
    steps: int = 200
    """Number of training steps."""
    dense_optimizer: str = "adagrad"
    """Optimizer of the dense (MLP) parameters: 'sgd', 'adagrad' or 'adam'."""
    dense_lr: float = 0.05
    """Learning rate of the dense optimizer."""
    sparse_optimizer: str = "rowwise_adagrad"
    """Optimizer fused into the embedding backward: 'sgd', 'adagrad', 'rowwise_adagrad' or 'adam'."""
    sparse_lr: float = 0.05
    """Learning rate of the fused sparse optimizer."""
    eps: float = 1e-8
    """Epsilon of the adaptive optimizers (dense and sparse)."""
    weight_decay: float = 0.0
    """L2 weight decay of both optimizers."""
    seed: int = 0
    """Seed of parameter initialisation and of the synthetic data stream."""
    eval_every: int = 0
    """Evaluate every this many steps (0: only at the end)."""
    eval_batches: int = 20
    """Number of held-out batches per evaluation."""
    log_every: int = 10
    """Write TensorBoard scalars every this many steps."""
    kernel_backend: str = "auto"
    """Embedding kernel backend: 'auto', 'reference', 'fbgemm' or 'triton'."""
    pipeline: bool = True
    """Pipeline the steps: batches load on a thread, and the next batch's input dist is started
    (by the training thread) right after this batch's forward, so its ids travel during this
    batch's backward. Same results as the plain loop."""
    max_loss: float = 50.0
    """Stop the run when a step's loss (the mean binary cross-entropy over the global batch) exceeds
    this: the model diverged (a mean BCE of 50 means logits of about 50 on the wrong side); 0: no
    bound. A non-finite loss always stops the run."""
    check_inputs: bool = True
    """Check every batch's bag lengths, id ranges and labels on the host before the device copy
    (errors name the feature and rank; no device sync). Its cost is reported as check_inputs in
    the step breakdown. Off: an out-of-range id is undefined behaviour in the kernels."""
    checkpoint_dir: str = ""
    """Root directory of checkpoints (shared by every rank); empty: no checkpoints."""
    checkpoint_every: int = 0
    """Save every this many steps (and at the end); 0: only at the end (when checkpoint_dir is set)."""
    resume: bool = True
    """Resume from the newest checkpoint under checkpoint_dir when there is one."""

    def __post_init__(self) -> None:
        _check_finite(self, "train")
        _check(self.batch_size >= 1, "train.batch_size", f"must be >= 1, got {self.batch_size}")
        _check(self.steps >= 1, "train.steps", f"must be >= 1, got {self.steps}")
        _check(self.dense_optimizer in DENSE_OPTIMIZERS, "train.dense_optimizer", f"must be one of {DENSE_OPTIMIZERS}, got {self.dense_optimizer!r}")
        _check(self.sparse_optimizer in SPARSE_OPTIMIZERS, "train.sparse_optimizer", f"must be one of {SPARSE_OPTIMIZERS}, got {self.sparse_optimizer!r}")
        _check(self.dense_lr >= 0, "train.dense_lr", f"must be >= 0, got {self.dense_lr}")
        _check(self.sparse_lr >= 0, "train.sparse_lr", f"must be >= 0, got {self.sparse_lr}")
        _check(self.eps > 0, "train.eps", f"must be > 0, got {self.eps}")
        _check(self.max_loss >= 0, "train.max_loss", f"must be >= 0 (0: no bound), got {self.max_loss}")
        _check(self.weight_decay >= 0, "train.weight_decay", f"must be >= 0, got {self.weight_decay}")
        _check(self.eval_every >= 0, "train.eval_every", f"must be >= 0, got {self.eval_every}")
        _check(self.eval_batches >= 1, "train.eval_batches", f"must be >= 1, got {self.eval_batches}")
        _check(self.log_every >= 1, "train.log_every", f"must be >= 1, got {self.log_every}")
        _check(self.checkpoint_every >= 0, "train.checkpoint_every", f"must be >= 0, got {self.checkpoint_every}")


@dataclass(frozen=True)
class DataConfig(_Replace):
    """Where batches come from."""

    source: str = "synthetic"
    """'synthetic' (power-law ids, labels from a hidden teacher) or 'criteo' (TSV files)."""
    path: str = ""
    """Criteo training TSV (label, 13 integer and 26 hex categorical columns)."""
    eval_path: str = ""
    """Criteo held-out TSV; empty: the batches `holdout_every` holds out of `path`."""
    holdout_every: int = 10
    """Criteo without `eval_path`: every k-th global batch of `path` is held out for evaluation and
    never trained on (0: no hold-out, and no evaluation without `eval_path`)."""
    epochs: int = 1
    """Criteo: passes over `path`; training stops at the end of the last one even before
    `train.steps` (0: as many passes as `train.steps` needs)."""
    zipf_alpha: float = 1.1
    """Default power-law exponent of synthetic ids (P(rank k) ~ k^-alpha)."""
    teacher_seed: int = 1234
    """Seed of the fixed hidden teacher that labels synthetic data (independent of train.seed)."""
    teacher_scale: float = 2.5
    """Scale of the teacher's logits: larger means cleaner labels and a higher reachable AUC."""
    id_mode: str = "strict"
    """'strict': an id outside a table is an error; 'modulo': ids are hashed into the table (id % rows)."""

    def __post_init__(self) -> None:
        _check_finite(self, "data")
        _check(self.source in DATA_SOURCES, "data.source", f"must be one of {DATA_SOURCES}, got {self.source!r}")
        _check(self.zipf_alpha >= 0, "data.zipf_alpha", f"must be >= 0, got {self.zipf_alpha}")
        _check(self.teacher_scale >= 0, "data.teacher_scale", f"must be >= 0, got {self.teacher_scale}")
        _check(self.holdout_every >= 0 and self.holdout_every != 1, "data.holdout_every",
               f"must be 0 (no hold-out) or >= 2, got {self.holdout_every}")
        _check(self.epochs >= 0, "data.epochs", f"must be >= 0 (0: as many as train.steps needs), got {self.epochs}")
        _check(self.id_mode in ID_MODES, "data.id_mode", f"must be one of {ID_MODES}, got {self.id_mode!r}")
        _check(self.source != "criteo" or bool(self.path), "data.path", "the 'criteo' source needs a path")


SHARDING_TYPES = ("auto", "table_wise", "row_wise", "column_wise", "data_parallel", "table_row_wise", "table_column_wise")
COMM_DTYPES = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8")  # neo_train.comm.CODECS (no torch import here)


@dataclass(frozen=True)
class DistConfig(_Replace):
    """How a multi-rank run shards its tables and talks."""

    sharding: str = "auto"
    """Sharding when no plan file is given: 'auto' (the planner, run on rank 0 and broadcast) or
    one type for every table (see neo_train.planning.plan)."""
    topology: str = ""
    """Cluster description the 'auto' planner uses: a preset (zionex, opera_study, cpu_local) or a
    TOML file; empty: cpu_local on CPU, zionex on GPUs (nodes and devices per node from the job)."""
    plan_path: str = ""
    """A ShardingPlan JSON file; overrides `sharding`."""
    forward_comm_dtype: str = "fp32"
    """Wire format of pooled embeddings in the output dist: 'fp32', 'fp16', 'bf16', or the
    row-scaled 'fp8_e4m3', 'fp8_e5m2', 'int8' (see neo_train.comm.codecs)."""
    backward_comm_dtype: str = "fp32"
    """Wire format of their gradients in the backward: one of forward_comm_dtype's."""
    timeout_s: float = 120.0
    """Timeout of every collective, in seconds: a peer that never arrives is an error, not a hang."""
    collective_rules: str = ""
    """Schedule algorithm per collective and size, tried in order, e.g.
    'all_to_all_v<=64KB:bruck, all_to_all_v:opera, all_reduce:ring'; empty: native collectives."""
    hosts_per_rack: int = 0
    """Ranks per rack for the 'opera' algorithm (0: the local world size)."""
    opera_bulk_threshold_bytes: int = 15_000_000
    """'opera': blocks of at least this many bytes wait for their direct circuit; smaller ones relay."""
    trace_dir: str = ""
    """Record every collective in param's comms-trace JSON, one trace_rank<r>.json per rank, here."""
    hot_rows: str = "off"
    """Hot-row replication: 'off', 'auto' (per table, the k the cost model expects to save the most
    step time with on the job's cluster, ``topology``'s or the default one:
    neo_train.planning.hot_rows.choose_hot_rows; none where nothing pays) or K (K rows of every eligible table:
    table-wise / row-wise / table-row-wise, sum pooling, resident). Each rank keeps a replica of
    the hot rows, pools their ids locally and exchanges only the cold ids; exact (notes/hot_rows.md)."""
    hot_rows_window: int = 100
    """Steps per id-frequency profiling window: at each window's end the hot sets become the top-k
    of rank 0's window (rows and optimizer state move between replicas and owners)."""

    def __post_init__(self) -> None:
        _check_finite(self, "dist")
        _check(self.sharding in SHARDING_TYPES, "dist.sharding", f"must be one of {SHARDING_TYPES}, got {self.sharding!r}")
        object.__setattr__(self, "hot_rows", str(self.hot_rows))  # TOML may give K as an integer
        hr = self.hot_rows
        _check(hr in ("off", "auto") or (hr.isdigit() and int(hr) >= 1), "dist.hot_rows",
               f"must be 'off', 'auto' or a row count >= 1, got {self.hot_rows!r}")  # fmt: skip
        _check(self.hot_rows_window >= 1, "dist.hot_rows_window", f"must be >= 1, got {self.hot_rows_window}")
        for name in ("forward_comm_dtype", "backward_comm_dtype"):
            v = getattr(self, name)
            _check(v in COMM_DTYPES, f"dist.{name}", f"must be one of {COMM_DTYPES}, got {v!r}")
        _check(self.timeout_s > 0, "dist.timeout_s", f"must be > 0, got {self.timeout_s}")
        _check(self.hosts_per_rack >= 0, "dist.hosts_per_rack", f"must be >= 0, got {self.hosts_per_rack}")
        if self.collective_rules:
            # here, not at the top: the import loads the neo_train.comm package (torch), whose
            # replay module imports this one
            from .comm.schedules.rules import parse_rules

            try:
                parse_rules(self.collective_rules)
            except ValueError as e:
                raise ValueError(f"dist.collective_rules: {e}") from None


@dataclass(frozen=True)
class StorageConfig(_Replace):
    """Where embedding rows live: Neo's HBM / DRAM / SSD hierarchy, and their precision."""

    cache_load_factor: float = 1.0
    """Fraction of each table shard's rows held in the (device) cache; the full rows and their
    optimizer state live in the backing store. 1.0: every row resident, no cache."""
    cache_policy: str = "lru"
    """Which cached row a miss evicts: 'lru' (least recently used) or 'lfu' (least frequently)."""
    storage_dir: str = ""
    """Backing store of cached tables: empty = host memory (DRAM); a directory = the SSD tier
    (a memory-mapped file per table shard, under <dir>/rank<r>/)."""
    table_dtype: str = "fp32"
    """Precision of the embedding weights: 'fp32', 'fp16' or 'bf16' (optimizer state stays fp32)."""
    stochastic_rounding: bool = False
    """Round fp16/bf16 weight updates stochastically (backends that support it; others refuse)."""

    def __post_init__(self) -> None:
        _check_finite(self, "storage")
        _check(0 < self.cache_load_factor <= 1, "storage.cache_load_factor", f"must be in (0, 1], got {self.cache_load_factor}")
        _check(self.cache_policy in CACHE_POLICIES, "storage.cache_policy", f"must be one of {CACHE_POLICIES}, got {self.cache_policy!r}")
        _check(self.table_dtype in TABLE_DTYPES, "storage.table_dtype", f"must be one of {TABLE_DTYPES}, got {self.table_dtype!r}")
        _check(
            not self.stochastic_rounding or self.table_dtype != "fp32", "storage.stochastic_rounding",
            "applies to fp16/bf16 tables only (storage.table_dtype is fp32)",
        )


def cache_factor(table: TableConfig, storage: StorageConfig | None, plan_factor: float | None = None) -> float:
    """The cache load factor of a table: the plan's, else the table's, else the storage default."""
    if plan_factor is not None:
        return plan_factor
    if table.cache_load_factor is not None:
        return table.cache_load_factor
    return storage.cache_load_factor if storage is not None else 1.0


@dataclass(frozen=True)
class Config(_Replace):
    """A whole run: model, training loop and data."""

    model: ModelConfig
    """The DLRM."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where batches come from."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Sharding and communication of multi-rank runs."""
    storage: StorageConfig = field(default_factory=StorageConfig)
    """Embedding storage tiers (device cache over host memory or SSD) and table precision."""
    name: str = "custom"
    """A label for logs (the preset's name, or the config file's)."""

    # ---- TOML -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        return _from_plain(cls, d, "config")

    def dumps(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.dumps())

    @classmethod
    def loads(cls, text: str) -> "Config":
        try:
            d = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"config: not valid TOML: {e}") from None
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"config file {p} does not exist")
        try:
            return cls.loads(p.read_text())
        except ValueError as e:
            raise ValueError(f"{p}: {e}") from None


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if v is None:  # TOML has no null: an absent key means the default (None)
                continue
            out[f.name] = _to_plain(v)
        return out
    if isinstance(obj, (tuple, list)):
        return [_to_plain(v) for v in obj]
    return obj


def _from_plain(cls: type, d: Any, where: str) -> Any:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a table, got {type(d).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown} (known: {sorted(names)})")
    kwargs = {}
    for name, value in d.items():
        kwargs[name] = _coerce(hints[name], value, f"{where}.{name}")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _from_plain(tp, value, where)
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        inner = [a for a in args if a is not type(None)]
        return None if value is None else _coerce(inner[0], value, where)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and not isinstance(value, tp):
        raise ValueError(f"{where}: expected {tp.__name__}, got {value!r}")
    if tp is int and isinstance(value, bool):
        raise ValueError(f"{where}: expected int, got {value!r}")
    return value


# ---- presets ------------------------------------------------------------------------------------

CRITEO_KAGGLE_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)
"""Distinct values of the 26 categorical columns of the Criteo Kaggle (Display Advertising) set."""


# Adagrad's first step moves every dense weight by about dense_lr whatever its gradient, so
# the default 0.05 (fine for the narrow tiny/small MLPs) sends the logits of a wide or deep
# MLP to 1e13 at step 1. Measured (30 steps, batch 64, 1 rank): criteo_kaggle learns at
# 1e-3..3e-3 and spikes at 1e-2; model_a and model_i stay below 1.2 at 1e-3 and blow up at
# 1e-2. model_f's 256-wide dot interaction also needs a smaller sparse_lr: with small tables
# (every row hit every step) sparse_lr 0.05 peaks at 38, 0.01 with dense_lr 3e-4 below 1.
_DEEP_MLP_DENSE_LR = 1e-3


def _scaled(rows: float, row_scale: float) -> int:
    return max(1, int(round(rows * row_scale)))


def _tiny(row_scale: float) -> Config:
    rows = (100, 37, 250, 1)
    pooling = ("sum", "mean", "sum", "sum")
    factors = (1.0, 3.0, 2.0, 1.0)
    tables = tuple(
        TableConfig(f"t{i}", _scaled(r, row_scale), 8, pooling=p, pooling_factor=lf)
        for i, (r, p, lf) in enumerate(zip(rows, pooling, factors))
    )
    return Config(
        ModelConfig(tables, num_dense_features=13, bottom_mlp=(16, 8), top_mlp=(16,), interaction="dot"),
        TrainConfig(batch_size=32, steps=20, eval_batches=4, log_every=5),
        name="tiny",
    )


def _small(row_scale: float) -> Config:
    rows = (50_000, 20_000, 10_000, 5_000, 2_000, 1_000, 500, 100)
    factors = (1.0, 4.0, 1.0, 8.0, 2.0, 1.0, 3.0, 1.0)
    pooling = ("sum", "mean", "sum", "mean", "sum", "sum", "mean", "sum")
    tables = tuple(
        TableConfig(f"t{i}", _scaled(r, row_scale), 16, pooling=p, pooling_factor=lf)
        for i, (r, lf, p) in enumerate(zip(rows, factors, pooling))
    )
    return Config(
        ModelConfig(tables, num_dense_features=13, bottom_mlp=(64, 32, 16), top_mlp=(64, 32), interaction="dot"),
        TrainConfig(batch_size=256, steps=300, eval_batches=20, log_every=10),
        name="small",
    )


def _criteo_kaggle(row_scale: float) -> Config:
    tables = tuple(
        TableConfig(f"cat_{i}", _scaled(r, row_scale), 16, pooling_factor=1.0, feature_names=(f"C{i + 1}",))
        for i, r in enumerate(CRITEO_KAGGLE_CARDINALITIES)
    )
    return Config(
        ModelConfig(tables, num_dense_features=13, bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256), interaction="dot"),
        TrainConfig(batch_size=2048, steps=1000, dense_lr=_DEEP_MLP_DENSE_LR * 3),
        name="criteo_kaggle",
    )


def _shaped_tables(
    prefix: str,
    count: int,
    total_params: float,
    dims: np.ndarray,
    pooling_mean: float,
    row_scale: float,
    seed: int,
) -> tuple[TableConfig, ...]:
    """``count`` tables with the given dims whose rows follow a log-normal spread summing to
    ``total_params`` parameters (the production skew: a few huge tables, many small ones), and
    per-table pooling factors with mean ``pooling_mean``. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    raw_rows = rng.lognormal(mean=0.0, sigma=1.5, size=count)
    rows = raw_rows * total_params / float((raw_rows * dims).sum())
    lf = rng.gamma(shape=2.0, scale=pooling_mean / 2.0, size=count)
    lf = lf * pooling_mean / lf.mean()
    return tuple(
        TableConfig(
            f"{prefix}{i}",
            _scaled(rows[i], row_scale),
            int(dims[i]),
            pooling="sum",
            pooling_factor=round(float(lf[i]), 2),
        )
        for i in range(count)
    )


def _model_a(row_scale: float) -> Config:
    # Neo, Table 3: ~793B parameters, ~1000 tables, dims [4, 384] avg 93, avg pooling 15,
    # 20-layer MLPs of avg width 3375, local batch 512 per GPU.
    rng = np.random.default_rng(17)
    choices = np.array([4, 8, 16, 32, 64, 96, 128, 192, 256, 384])
    probs = np.array([0.05, 0.08, 0.12, 0.14, 0.17, 0.12, 0.12, 0.08, 0.06, 0.06])
    dims = rng.choice(choices, size=1000, p=probs / probs.sum())
    tables = _shaped_tables("a", 1000, 793e9, dims, 15.0, row_scale, seed=18)
    width = 3375
    return Config(
        ModelConfig(
            tables,
            num_dense_features=13,
            bottom_mlp=(width,) * 19 + (128,),
            top_mlp=(width,) * 20,
            interaction="cat",
        ),
        TrainConfig(batch_size=512, steps=100, dense_lr=_DEEP_MLP_DENSE_LR),
        name="model_a",
    )


def _model_f(row_scale: float) -> Config:
    # Neo, Table 3: 12T parameters, ~10s of tables, dim 256, avg pooling 20, 7 MLP layers of 490,
    # local batch 512; one massive table that fits no single GPU.
    dims = np.full(24, 256)
    tables = list(_shaped_tables("f", 24, 12e12 * 0.25, dims, 20.0, row_scale, seed=19))
    big = TableConfig("f_huge", _scaled(12e12 * 0.75 / 256, row_scale), 256, pooling_factor=20.0)
    return Config(
        ModelConfig(
            tuple([big] + tables),
            num_dense_features=13,
            bottom_mlp=(490, 490, 490, 256),
            top_mlp=(490, 490, 490),
            interaction="dot",
        ),
        TrainConfig(batch_size=512, steps=100, dense_lr=_DEEP_MLP_DENSE_LR * 0.3, sparse_lr=0.01),
        name="model_f",
    )


def _model_i(row_scale: float) -> Config:
    # Neo, Table 3: 332B parameters, ~100s of tables (361 in the Opera study), dim 92,
    # avg pooling 70, 43 MLP layers of avg width 682, local batch 2048.
    dims = np.full(361, 92)
    tables = _shaped_tables("i", 361, 332e9, dims, 70.0, row_scale, seed=20)
    return Config(
        ModelConfig(
            tables,
            num_dense_features=13,
            bottom_mlp=(682,) * 21 + (92,),
            top_mlp=(682,) * 21,
            interaction="dot",
        ),
        TrainConfig(batch_size=2048, steps=100, dense_lr=_DEEP_MLP_DENSE_LR),
        name="model_i",
    )


_PRESETS = {
    "tiny": _tiny,
    "small": _small,
    "criteo_kaggle": _criteo_kaggle,
    "model_a": _model_a,
    "model_f": _model_f,
    "model_i": _model_i,
}
PRESETS: tuple[str, ...] = tuple(_PRESETS)


def preset(name: str, row_scale: float = 1.0) -> Config:
    """A named preset; ``row_scale`` multiplies every table's rows (min 1), keeping the shape."""
    if name not in _PRESETS:
        raise ValueError(f"unknown preset '{name}' (known: {', '.join(PRESETS)})")
    if not (row_scale > 0 and math.isfinite(row_scale)):
        raise ValueError(f"row_scale must be a positive number, got {row_scale}")
    return _PRESETS[name](row_scale)
