"""Checkpoints that survive resharding: save under one world size and plan, load under another.

    save_checkpoint(trainer, checkpoint_dir("ckpt", 100), step=100)  # collective: every rank calls it
    start = load_checkpoint(trainer, find_latest("ckpt"))            # collective; the step to resume at
    start, data_batch = resume_from_latest(trainer, "ckpt")          # both, (0, 0) without a checkpoint

A checkpoint directory (one run's checkpoints sit side by side under a root, whose ``latest``
file names the newest complete one)::

    __<rank>_0.distcp    torch.distributed.checkpoint (DCP) data, one file per writing rank
    .metadata            DCP's own pickled index, kept for DCP's tools; never read here
    dcp_metadata.json    the same index as JSON: what load_checkpoint reads
    checkpoint.json      step, data position, config and model hash, plan, block list, the
                         dense optimizer's param groups and non-tensor state
    rng/rank-<r>.json    rank r's torch (and CUDA), numpy and python RNG states
    manifest.json        SHA-256 and size of every other file, and a digest of itself

DCP holds plain tensors only (no DTensor or ShardedTensor), under keys that do not depend on
the plan that wrote them (a block is rows [r0, r1) x columns [c0, c1) of a logical table):

    tables/<t>/weight/<r0>-<r1>x<c0>-<c1>       (rows, cols)
    tables/<t>/<state>/<r0>-<r1>x<c0>-<c1>      optimizer state: (rows, cols) per element (AdaGrad
                                                sum, Adam moments), (rows,) for row-wise
                                                AdaGrad's momentum
    tables/<t>/fused_step/<r0>-<r1>x<c0>-<c1>   (1,) int64: the fused-update counter of the
                                                kernel that held the block
    dense/<name>, dense_optim/<param>/<key>     the DLRM's dense part and its optimizer (rank 0)

Blocks are the saving plan's shards cut into row chunks of at most ``max_block_bytes``; each is
written by the rank holding it (a replicated table by its lowest rank), so no rank holds more
than its own shards. To load, a rank reads only the blocks overlapping its new shards (DCP with
``no_dist``: no collective) and copies the overlaps in:

    weights, per-element state   exact, whatever the old and new plans
    row-wise AdaGrad momentum    row i of a new shard with columns [c, d) gets, over the old blocks
                                 holding row i, the sum of (overlap width / (d - c)) x their
                                 momentum. A column shard of width w accumulates the mean over its
                                 w columns of g^2, so this overlap-weighted mean is exact (up to
                                 rounding) whenever the new columns are a union of old column
                                 ranges: between non-column-wise types (a copy), between equal
                                 column splits, from column-wise to whole rows. Splitting an old
                                 column shard assumes its g^2 was spread evenly over its columns.
    fused-update counter         a kernel takes the largest counter among the blocks it read
                                 (every kernel counts one update per step, so they agree)
    dense part + optimizer       exact; the optimizer's hyperparameters come from this run's
                                 config (its param groups), its state from the checkpoint

Load first checks every file against manifest.json (the hashing split over the ranks) and raises
CheckpointError naming a missing, truncated or corrupted file; it unpickles nothing (DCP's index
comes from JSON, tensors through ``torch.load(weights_only=True)``). A checkpoint of another model
or other optimizer kinds is refused, naming the fields that differ; training settings (steps,
learning rates, batch size) may change on resume. Saving writes ``<dir>.tmp-<step>``, renames it,
then rewrites ``latest`` atomically: a crash mid-save leaves the last good checkpoint intact.
Every rank must see the same directory (a shared filesystem), as DCP's file writer requires.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ..config import Config
from ..kernels import FusedEmbeddingBag
from ..kernels.base import state_shapes
from ..sharding.collection import HOT_SUFFIX, ShardedEmbeddingBagCollection
from ..sharding.plan import Shard, ShardingPlan

if TYPE_CHECKING:
    from ..comm import Communicator
    from .trainer import Trainer

__all__ = [
    "CheckpointError",
    "check_resumable",
    "save_checkpoint",
    "load_checkpoint",
    "find_latest",
    "load_history",
    "resume_from_latest",
    "checkpoint_dir",
    "verify_checkpoint",
    "data_start_batch",
]

FORMAT = "neo_train.checkpoint/1"
MANIFEST, META, DCP_INDEX, LATEST = "manifest.json", "checkpoint.json", "dcp_metadata.json", "latest"
HISTORY = "history.json"  # the run's per-step global losses and evaluations up to the checkpoint
MAX_BLOCK_BYTES = 64 << 20

Block = tuple[int, int, int, int]  # rows [r0, r1) x columns [c0, c1) of a logical table


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged, or does not fit this run; the message names the file or field."""


# ---- public API -----------------------------------------------------------------------------------
def checkpoint_dir(root: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` goes under ``root``: ``root/step_00000100``."""
    return Path(root) / f"step_{step:08d}"


def save_checkpoint(
    trainer: "Trainer", directory: str | Path, step: int, *, max_block_bytes: int = MAX_BLOCK_BYTES,
    history: dict[str, Any] | None = None,
) -> Path:
    """Write the trainer's state as checkpoint ``directory`` (collective). ``step``: the steps
    trained so far, i.e. where a resumed run starts. ``history`` (JSON: the run's per-step losses
    and evaluations so far) is written inside the checkpoint, covered by its manifest and
    published with it, so a resumed run reports every step exactly once. Returns the directory."""
    final = Path(directory)
    tmp = final.with_name(f"{final.name}.tmp-{step}")
    comm, rank = trainer.comm, trainer.rank
    if comm is not None and not dist.is_initialized():
        raise CheckpointError("a multi-rank checkpoint needs torch.distributed: DCP writes through its process group")
    err: Exception | None = None
    if rank == 0:  # a save that crashed may have left this step's temporary directory
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "rng").mkdir(parents=True)
        except OSError as e:
            err = e
    _agree(comm, err, f"creating {tmp}")

    view, tensors, err = None, {}, None
    try:
        view = _view(trainer)
        tensors = _local_tensors(trainer, view, max_block_bytes)
        _write_json(tmp / "rng" / f"rank-{rank:05d}.json", _rng_state(trainer.device))
    except Exception as e:  # noqa: BLE001 - every rank must still reach the collectives below
        err = e
    _agree(comm, err, f"saving {final}")
    with _quiet_dcp():
        group = getattr(comm, "group", None)
        dcp.save(tensors, storage_writer=_JsonIndexWriter(tmp), process_group=group, no_dist=comm is None)
    if rank == 0:
        try:
            _write_json(tmp / META, _meta(trainer, view, step, max_block_bytes), indent=1)
            if history is not None:
                _write_json(tmp / HISTORY, history)
        except Exception as e:  # noqa: BLE001
            err = e
    _agree(comm, err, f"saving {final}")

    names = _list_files(tmp)
    _same_on_all_ranks(comm, hashlib.sha256("\n".join(names).encode()).digest(),
                       f"ranks see different files in {tmp}: checkpoints need a filesystem every rank shares")
    digests = _digest_files(comm, tmp, names)
    if rank == 0:
        try:
            files = {n: {"sha256": h, "bytes": size} for n, (h, size) in digests.items()}
            _write_json(tmp / MANIFEST, {"format": FORMAT, "files": files, "self_sha256": _digest_of(files)}, indent=1)
            _fsync_dir(tmp)
            _publish(tmp, final, step)
        except Exception as e:  # noqa: BLE001
            err = e
    _agree(comm, err, f"publishing {final}")
    return final


def load_checkpoint(trainer: "Trainer", directory: str | Path) -> int:
    """Restore the trainer from checkpoint ``directory`` (collective), under any world size and
    plan; returns the step to resume at. The caller restarts its data stream there (see
    ``data_start_batch``)."""
    d = Path(directory)
    verify_checkpoint(d, trainer.comm)
    meta = _read_json(d / META)
    _check_compatible(meta, trainer.cfg, d)
    _same_on_all_ranks(trainer.comm, (d / MANIFEST).read_bytes(), "ranks were given different checkpoints to load")
    err: Exception | None = None
    try:
        _load_local(trainer, d, meta)
    except Exception as e:  # noqa: BLE001 - the other ranks must hear of it rather than hang
        err = e
    _agree(trainer.comm, err, f"loading {d}")
    emb = trainer.model.embeddings
    if isinstance(emb, ShardedEmbeddingBagCollection):
        emb.hot_reload()  # the hot-row replicas from the loaded owners (collective)
    return int(meta["step"])


def resume_from_latest(trainer: "Trainer", root: str | Path) -> tuple[int, int]:
    """Load the newest complete checkpoint under ``root`` (collective). Returns (the step to resume
    at, the global batch to restart the training data at); (0, 0) when there is none yet."""
    latest = find_latest(root)
    step = -1 if latest is None else int(_read_json(latest / META)["step"])
    _same_on_all_ranks(trainer.comm, str(step).encode(), f"ranks found different latest checkpoints under {root}")
    if latest is None:
        return 0, 0
    return load_checkpoint(trainer, latest), data_start_batch(latest, trainer.world_size, trainer.cfg.train.batch_size)


def load_history(directory: str | Path) -> dict[str, Any] | None:
    """The history saved with a checkpoint (None for one saved without): {"losses": [...], ...}.
    Read after ``load_checkpoint`` has checked the file against the manifest."""
    path = Path(directory) / HISTORY
    return _read_json(path) if path.exists() else None


def find_latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``: the one ``root/latest`` names, else (pointer
    missing or stale) the complete ``step_*`` directory of the highest step; None if none."""
    root = Path(root)
    try:
        name = str(json.loads((root / LATEST).read_text())["checkpoint"])
    except (OSError, ValueError, KeyError, TypeError):
        name = None
    if name is not None:
        if not re.fullmatch(r"step_\d+", name):
            raise CheckpointError(f"{root / LATEST} names '{name}', not a checkpoint directory inside {root}")
        cand = root / name
        if (cand / MANIFEST).is_file():
            return cand
        if cand.exists():
            raise CheckpointError(
                f"{root / LATEST} names {cand}, which has no {MANIFEST}: the checkpoint is damaged "
                f"(remove it, or the '{LATEST}' file, to resume from an older one)"
            )
    best: tuple[int, Path] | None = None
    for c in root.glob("step_*") if root.is_dir() else ():
        if ".tmp-" in c.name or ".old-" in c.name or not (c / MANIFEST).is_file():
            continue
        try:
            step = int(json.loads((c / META).read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if best is None or step > best[0]:
            best = (step, c)
    return None if best is None else best[1]


def check_resumable(root: str | Path, cfg: Config) -> Path | None:
    """What a launcher can check before starting any rank, without hashing: the newest checkpoint
    under ``root`` (None if none), its manifest, every file's presence and size, that it was saved
    for this model and optimizer, and that it lies within ``train.steps``. CheckpointError names
    the file; the ranks still check the hashes when they load it."""
    latest = find_latest(root)
    if latest is None:
        return None
    verify_checkpoint(latest, hashes=False)
    meta = _read_json(latest / META)
    _check_compatible(meta, cfg, latest)
    step = meta.get("step") if isinstance(meta, dict) else None
    if not isinstance(step, int):
        raise CheckpointError(f"checkpoint file '{META}' in {latest} has no step")
    if step > cfg.train.steps:
        raise CheckpointError(
            f"the newest checkpoint under {root} is at step {step}, beyond train.steps = {cfg.train.steps}: "
            f"nothing to train (raise --steps, or use another --checkpoint-dir / --no-resume)"
        )
    return latest


def verify_checkpoint(directory: str | Path, comm: "Communicator | None" = None, *, hashes: bool = True) -> None:
    """Check every file against the manifest (collective with ``comm``: the ranks share the
    hashing; ``hashes=False``: sizes only, no reading). Raises CheckpointError naming the first
    missing, truncated or corrupted file."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory {d} does not exist")
    manifest = _read_json(d / MANIFEST)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint file '{MANIFEST}' in {d} is not a {FORMAT} manifest")
    if manifest.get("self_sha256") != _digest_of(files):
        raise CheckpointError(f"checkpoint file '{MANIFEST}' in {d} is corrupted (its own digest does not match)")
    names = sorted(files)
    got = _digest_files(comm, d, names) if hashes else {n: _size(d / n) for n in names}
    for n in names:
        (digest, size), want = got[n], files[n]
        if size < 0:
            raise CheckpointError(f"checkpoint file '{n}' is missing from {d} (or unreadable)")
        if size != want["bytes"]:
            raise CheckpointError(
                f"checkpoint file '{n}' in {d} is truncated or damaged: {size} bytes, the manifest records {want['bytes']}"
            )
        if hashes and digest != want["sha256"]:
            raise CheckpointError(
                f"checkpoint file '{n}' in {d} is corrupted: SHA-256 {digest[:16]}... differs from the "
                f"manifest's {want['sha256'][:16]}..."
            )


def data_start_batch(directory: str | Path, world_size: int, batch_size: int) -> int:
    """The global batch a job of ``world_size`` ranks x ``batch_size`` resumes its training data at:
    the checkpoint's step when the global batch size is unchanged (exact), else the first whole
    global batch after the samples already trained on."""
    data = _read_json(Path(directory) / META)["data"]
    if data["world_size"] * data["batch_size"] == world_size * batch_size:
        return int(data["global_batch_index"])
    return -(-int(data["samples_seen"]) // (world_size * batch_size))


# ---- what a rank holds ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _LocalShard:
    table: str
    shard: Shard
    kernel: FusedEmbeddingBag
    index: int  # the shard's table index inside its kernel

    @property
    def block(self) -> Block:
        s = self.shard
        return (s.row_start, s.row_end, s.col_start, s.col_end)


@dataclass(frozen=True)
class _View:
    plan: ShardingPlan
    shards: list[_LocalShard]
    dlrm: nn.Module


def _view(trainer: "Trainer") -> _View:
    """The trainer's plan, local shards and DLRM; an unsharded trainer is rank 0 holding every table."""
    emb = trainer.model.embeddings
    if isinstance(emb, ShardedEmbeddingBagCollection):
        # hot-row replicas are not saved: their rows are written back to the owners first
        # (save_checkpoint) and gathered from them again after a load
        emb.hot_write_back()
        shards = [_LocalShard(n, s, k, i) for g in emb.groups.values() for n, s, k, i in g.local_shards()
                  if not n.endswith(HOT_SUFFIX)]  # fmt: skip
        return _View(emb.plan, shards, trainer.model.module)
    plan = ShardingPlan.uniform(trainer.cfg.model, "table_wise", 1, 1)
    shards = [_LocalShard(t.name, plan[t.name].shards[0], emb.kernel, i) for i, t in enumerate(emb.tables)]
    return _View(plan, shards, trainer.model)


def _blocks(plan: ShardingPlan, table: str, max_bytes: int) -> dict[Block, tuple[int, Block]]:
    """The saved blocks of a table -> (the rank writing it, the shard it is cut from)."""
    out: dict[Block, tuple[int, Block]] = {}
    for s in plan[table].shards:
        chunk = max(1, max_bytes // (4 * s.cols))  # rows per block (float32)
        for r0 in range(s.row_start, s.row_end, chunk):
            b = (r0, min(r0 + chunk, s.row_end), s.col_start, s.col_end)
            if b not in out or s.rank < out[b][0]:
                out[b] = (s.rank, (s.row_start, s.row_end, s.col_start, s.col_end))
    return out


def _key(table: str, field: str, b: Block) -> str:
    return f"tables/{table}/{field}/{b[0]}-{b[1]}x{b[2]}-{b[3]}"


def _dense_state(dlrm: nn.Module) -> dict[str, torch.Tensor]:
    """The dense parameters and persistent buffers (views: copying into them restores them)."""
    return {k: v for k, v in dlrm.state_dict().items() if not k.startswith("embeddings.")}


# ---- save -----------------------------------------------------------------------------------------
def _local_tensors(trainer: "Trainer", view: _View, max_bytes: int) -> dict[str, torch.Tensor]:
    """This rank's DCP entries: the blocks it writes; rank 0 adds the dense part and optimizer."""
    out: dict[str, torch.Tensor] = {}
    for ls in view.shards:
        blocks = _blocks(view.plan, ls.table, max_bytes)
        mine = [b for b, (r, parent) in blocks.items() if parent == ls.block and r == trainer.rank]
        if not mine:
            continue  # a replica another rank writes
        weight = ls.kernel.get_table(ls.index).cpu()
        state = {k: v.cpu() for k, v in ls.kernel.get_state(ls.index).items()}
        step = torch.tensor([ls.kernel.optimizer_step], dtype=torch.int64)
        for b in mine:
            rows = slice(b[0] - ls.block[0], b[1] - ls.block[0])
            for name, v in (("weight", weight), *state.items()):
                out[_key(ls.table, name, b)] = v if b == ls.block else v[rows].clone()  # no view of a bigger storage
            out[_key(ls.table, "fused_step", b)] = step
    if trainer.rank == 0:
        for k, v in _dense_state(view.dlrm).items():
            out[f"dense/{k}"] = v.detach().cpu().clone()
        for idx, st in trainer.optimizer.state_dict()["state"].items():
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    out[f"dense_optim/{idx}/{k}"] = v.detach().cpu().clone()
    return out


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint and a run must agree on (from ``Config.to_dict()``): the model and the
    optimizer kinds, which fix every tensor's shape and meaning, and the tables' precision (a
    checkpoint keeps its dtype). Where rows live (cache load factors, storage tier) is free to
    change between runs: a checkpoint holds every row, flushed from any cache."""
    model = dict(config["model"])
    model["tables"] = [{k: v for k, v in t.items() if k != "cache_load_factor"} for t in model["tables"]]
    return {
        "model": model,
        "sparse_optimizer": config["train"]["sparse_optimizer"],
        "dense_optimizer": config["train"]["dense_optimizer"],
        "table_dtype": config.get("storage", {}).get("table_dtype", "fp32"),
    }


def _model_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(_identity(config), sort_keys=True).encode()).hexdigest()[:16]


def _meta(trainer: "Trainer", view: _View, step: int, max_bytes: int) -> dict[str, Any]:
    cfg, W, b = trainer.cfg, trainer.world_size, trainer.cfg.train.batch_size
    config = cfg.to_dict()
    opt = trainer.optimizer.state_dict()
    scalars = {str(i): {k: v for k, v in st.items() if not isinstance(v, torch.Tensor)} for i, st in opt["state"].items()}
    return {
        "format": FORMAT,
        "step": step,
        "world_size": W,
        "model_hash": _model_hash(config),
        "config": config,
        "plan": view.plan.to_dict(),
        "data": {  # one global batch of W*b samples per step; CriteoReader's start_batch
            "source": cfg.data.source, "global_batch_index": step, "world_size": W, "batch_size": b,
            "samples_seen": step * W * b,
        },
        "tables": {
            t.name: {"rows": t.num_rows, "dim": t.dim, "blocks": [list(x) for x in _blocks(view.plan, t.name, max_bytes)]}
            for t in cfg.model.tables
        },
        "sparse_state": sorted(state_shapes(cfg.train.sparse_optimizer, 1, 1)),
        "dense_optimizer": {"param_groups": opt["param_groups"], "scalars": {i: s for i, s in scalars.items() if s}},
        "torch": torch.__version__,
    }


def _publish(tmp: Path, final: Path, step: int) -> None:
    """Rename the finished temporary directory into place, then point ``latest`` at it."""
    old = None
    if final.exists():  # the same step saved again (a resumed run passing it once more)
        old = final.with_name(f"{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    _write_json(final.parent / LATEST, {"checkpoint": final.name, "step": step})
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---- load -----------------------------------------------------------------------------------------
def _check_compatible(meta: dict[str, Any], cfg: Config, d: Path) -> None:
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint file '{META}' in {d}: format {meta.get('format')!r}, expected {FORMAT!r}")
    mine = cfg.to_dict()
    if meta.get("model_hash") == _model_hash(mine):
        return
    diffs = _diff(_identity(meta["config"]), _identity(mine))
    shown = "; ".join(f"{p}: checkpoint {a!r}, this run {b!r}" for p, a, b in diffs[:6])
    more = f" (and {len(diffs) - 6} more)" if len(diffs) > 6 else ""
    raise CheckpointError(
        f"checkpoint {d} was saved for a different model or optimizer (model hash {meta.get('model_hash')}, "
        f"this run {_model_hash(mine)}): {shown}{more}"
    )


def _load_local(trainer: "Trainer", d: Path, meta: dict[str, Any]) -> None:
    view = _view(trainer)
    reader = _JsonIndexReader(d)
    index = reader.read_metadata().state_dict_metadata
    saved = {t: [tuple(b) for b in e["blocks"]] for t, e in meta["tables"].items()}
    states = list(meta["sparse_state"])

    # 1. read the blocks overlapping my shards, the dense part and the dense optimizer state
    want: dict[str, torch.Tensor] = {}

    def need(key: str) -> None:
        if key not in index:
            raise CheckpointError(f"checkpoint {d} has no entry '{key}'")
        md = index[key]
        want[key] = torch.empty(md.size, dtype=md.properties.dtype)  # type: ignore[union-attr]

    for ls in view.shards:
        for b in saved[ls.table]:
            if _intersect(ls.block, b) is not None:
                for field in ("weight", *states, "fused_step"):
                    need(_key(ls.table, field, b))
    dense = _dense_state(view.dlrm)
    for k in dense:
        need(f"dense/{k}")
    optim_keys = [k for k in index if k.startswith("dense_optim/")]
    for k in optim_keys:
        need(k)
    with _quiet_dcp():
        dcp.load(want, storage_reader=reader, no_dist=True)  # rank-local: no collective

    # 2. tables: each new shard from the blocks it overlaps
    steps: dict[int, int] = {}
    for ls in view.shards:
        weight, state, step = _assemble(ls, saved[ls.table], states, want)
        ls.kernel.set_table(ls.index, weight)
        if state:
            ls.kernel.set_state(ls.index, state)
        steps[id(ls.kernel)] = max(steps.get(id(ls.kernel), 0), step)
    for ls in view.shards:
        ls.kernel.set_optimizer_step(steps[id(ls.kernel)])

    # 3. the dense part; its optimizer's state (the hyperparameters stay this run's)
    with torch.no_grad():
        for k, v in dense.items():
            v.copy_(want[f"dense/{k}"])
    opt_state: dict[int, dict[str, Any]] = {}
    for k in optim_keys:
        _, idx, name = k.split("/", 2)
        opt_state.setdefault(int(idx), {})[name] = want[k]
    for idx, sc in meta["dense_optimizer"]["scalars"].items():
        opt_state.setdefault(int(idx), {}).update(sc)
    groups = trainer.optimizer.state_dict()["param_groups"]
    trainer.optimizer.load_state_dict({"state": opt_state, "param_groups": groups})

    # 4. RNG: rank r continues saved rank r's streams (rank r mod W_saved in a larger world)
    _set_rng_state(_read_json(d / "rng" / f"rank-{trainer.rank % int(meta['world_size']):05d}.json"), trainer.device)


def _intersect(a: Block, b: Block) -> Block | None:
    r0, r1, c0, c1 = max(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), min(a[3], b[3])
    return (r0, r1, c0, c1) if r0 < r1 and c0 < c1 else None


def _assemble(
    ls: _LocalShard, blocks: list[Block], states: list[str], loaded: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """A new shard's weight (rows, cols), optimizer state and fused-update counter from the saved
    blocks overlapping it (the momentum rule of the module docstring)."""
    n = ls.block
    rows, cols = n[1] - n[0], n[3] - n[2]
    weight = torch.empty(rows, cols)
    covered = torch.zeros(rows, cols, dtype=torch.bool)
    elem = {s: torch.empty(rows, cols) for s in states if s != "momentum"}
    momentum = torch.zeros(rows, dtype=torch.float64) if "momentum" in states else None
    step = 0
    for b in blocks:
        o = _intersect(n, b)
        if o is None:
            continue
        dst = (slice(o[0] - n[0], o[1] - n[0]), slice(o[2] - n[2], o[3] - n[2]))
        src = (slice(o[0] - b[0], o[1] - b[0]), slice(o[2] - b[2], o[3] - b[2]))
        weight[dst] = loaded[_key(ls.table, "weight", b)][src]
        covered[dst] = True
        for s, t in elem.items():
            t[dst] = loaded[_key(ls.table, s, b)][src]
        if momentum is not None:  # this block's share of the new shard's columns
            momentum[dst[0]] += (o[3] - o[2]) / cols * loaded[_key(ls.table, "momentum", b)][src[0]].double()
        step = max(step, int(loaded[_key(ls.table, "fused_step", b)][0]))
    if not bool(covered.all()):
        raise CheckpointError(f"table '{ls.table}': the checkpoint's blocks do not cover the shard {n}")
    if momentum is not None:
        elem["momentum"] = momentum.float()
    return weight, elem, step


# ---- RNG ------------------------------------------------------------------------------------------
def _rng_state(device: torch.device) -> dict[str, Any]:
    name, key, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state().numpy().tobytes().hex(),
        "cuda": torch.cuda.get_rng_state(device).numpy().tobytes().hex() if device.type == "cuda" else None,
        "numpy": {"name": name, "key": key.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(gauss)},
        "python": {"version": version, "state": list(py_state), "gauss_next": gauss_next},
    }


def _set_rng_state(s: dict[str, Any], device: torch.device) -> None:
    def as_bytes(h: str) -> torch.Tensor:
        return torch.frombuffer(bytearray.fromhex(h), dtype=torch.uint8).clone()

    torch.set_rng_state(as_bytes(s["torch"]))
    if s.get("cuda") and device.type == "cuda":
        torch.cuda.set_rng_state(as_bytes(s["cuda"]), device)
    n = s["numpy"]
    key = np.array(n["key"], dtype=np.uint32)
    np.random.set_state((n["name"], key, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = s["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


# ---- files ----------------------------------------------------------------------------------------
def _write_json(path: Path, obj: Any, indent: int | None = None) -> None:
    """Write atomically: a temporary file, fsync, rename."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.part")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=indent)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file '{path.name}' is missing from {path.parent}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"checkpoint file '{path.name}' in {path.parent} is unreadable: {e}") from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _list_files(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file() and p.name != MANIFEST)


def _digest_of(files: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _size(path: Path) -> tuple[str, int]:
    """('', size), size -1 when the file is missing or unreadable (verify_checkpoint's shape)."""
    try:
        return "", path.stat().st_size if path.is_file() else -1
    except OSError:
        return "", -1


def _digest_files(comm: "Communicator | None", d: Path, names: list[str]) -> dict[str, tuple[str, int]]:
    """SHA-256 and size of each file (size -1: missing or unreadable). Rank r hashes files r,
    r + W, ...; one all-reduce shares the results."""
    W, r = (comm.world_size, comm.rank) if comm is not None else (1, 0)
    table = torch.zeros(len(names), 33, dtype=torch.int64)  # 32 digest bytes, then the size
    for i in range(r, len(names), W):
        try:
            digest, size = _sha256(d / names[i])
            table[i, :32] = torch.tensor(list(bytes.fromhex(digest)))
            table[i, 32] = size
        except OSError:
            table[i, 32] = -1
    table = _all_reduce(comm, table, "sum")
    return {n: (bytes(row[:32].tolist()).hex(), int(row[32])) for n, row in zip(names, table)}


# ---- collectives ----------------------------------------------------------------------------------
def _all_reduce(comm: "Communicator | None", t: torch.Tensor, op: str) -> torch.Tensor:
    if comm is None or comm.world_size == 1:
        return t
    dev = getattr(comm, "device", t.device)  # NCCL reduces on the GPU
    return comm.all_reduce(t.to(dev), op=op, tag="checkpoint").cpu()


def _same_on_all_ranks(comm: "Communicator | None", value: bytes, message: str) -> None:
    h = int.from_bytes(hashlib.sha256(value).digest()[:7], "little")
    t = _all_reduce(comm, torch.tensor([h, -h], dtype=torch.int64), "max")
    if int(t[0]) != -int(t[1]):
        raise CheckpointError(message)


def _agree(comm: "Communicator | None", err: Exception | None, what: str) -> None:
    """Every rank learns whether any rank failed; a failing rank raises its own error."""
    failed = bool(_all_reduce(comm, torch.tensor([float(err is not None)]), "max")[0] > 0)
    if err is not None:
        if isinstance(err, CheckpointError):
            raise err
        raise CheckpointError(f"{what} failed on rank {comm.rank if comm is not None else 0}: {err!r}") from err
    if failed:
        raise CheckpointError(f"{what} failed on another rank (that rank's error names the cause)")


def _diff(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, a's value, b's value) wherever two JSON-like trees differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            out += _diff(a[k], b[k], p) if k in a and k in b else [(p, a.get(k), b.get(k))]
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [x for i, (u, v) in enumerate(zip(a, b)) for x in _diff(u, v, f"{path}[{i}]")]
    return [] if a == b else [(path, a, b)]


# ---- DCP with a JSON index ------------------------------------------------------------------------
class _JsonIndexWriter(FileSystemWriter):
    """DCP's file writer, also writing the checkpoint's index (DCP Metadata) as JSON."""

    def finish(self, metadata: Metadata, results) -> None:  # type: ignore[override]
        super().finish(metadata, results)
        tensors = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                raise CheckpointError(f"checkpoint entry '{fqn}' is not a tensor; only tensors are stored")
            tensors[fqn] = {
                "dtype": str(md.properties.dtype).removeprefix("torch."),
                "size": list(md.size),
                "chunks": [[list(ch.offsets), list(ch.sizes)] for ch in md.chunks],
            }
        storage = [
            {"fqn": ix.fqn, "offset": None if ix.offset is None else list(ix.offset), "index": ix.index,
             "path": info.relative_path, "start": info.offset, "length": info.length,
             "transforms": list(info.transform_descriptors or [])}
            for ix, info in metadata.storage_data.items()
        ]
        _write_json(Path(self.path) / DCP_INDEX, {"version": metadata.version, "tensors": tensors, "storage": storage})


class _JsonIndexReader(FileSystemReader):
    """DCP's file reader, taking the index from JSON instead of unpickling ``.metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / DCP_INDEX
        raw = _read_json(path)
        try:
            tensors = {
                fqn: TensorStorageMetadata(
                    TensorProperties(dtype=_dtype(e["dtype"])),
                    torch.Size(e["size"]),
                    [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in e["chunks"]],
                )
                for fqn, e in raw["tensors"].items()
            }
            storage = {
                MetadataIndex(e["fqn"], None if e["offset"] is None else torch.Size(e["offset"]), e["index"]):
                    _StorageInfo(str(e["path"]), int(e["start"]), int(e["length"]), e["transforms"] or None)
                for e in raw["storage"]
            }
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"checkpoint file '{DCP_INDEX}' in {path.parent} is malformed: {e!r}") from None
        return Metadata(
            state_dict_metadata=tensors,  # type: ignore[arg-type]
            planner_data={k: (k,) for k in tensors},
            storage_data=storage,
            storage_meta=StorageMeta(load_id=self.load_id),
            version=raw.get("version"),
        )


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, str(name), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


@contextlib.contextmanager
def _quiet_dcp() -> Iterator[None]:
    """Silence DCP's notice that it runs without a process group: that is asked for here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
