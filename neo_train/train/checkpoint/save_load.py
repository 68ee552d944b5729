"""Saving and loading a trainer's state (collective: every rank calls them), finding the newest
checkpoint, and what a launcher checks before any rank starts (``check_resumable``).

A checkpoint records what it was saved for (``files._identity``: the model, the optimizer kinds,
the tables' precision; where rows live may change). The dense part and its optimizer state load
exactly, the optimizer keeping this run's hyperparameters (its param groups); rank r continues
saved rank r's RNG streams (rank r mod W_saved in a larger world).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ...config import Config
from ...kernels.base import state_shapes
from ...sharding.collection import ShardedEmbeddingBagCollection
from .files import (
    FORMAT,
    HISTORY,
    LATEST,
    MANIFEST,
    META,
    CheckpointError,
    _agree,
    _check_compatible,
    _digest_files,
    _digest_of,
    _fsync_dir,
    _JsonIndexReader,
    _JsonIndexWriter,
    _list_files,
    _model_hash,
    _quiet_dcp,
    _read_json,
    _same_on_all_ranks,
    _write_json,
    verify_checkpoint,
)
from .reshard import (
    MAX_BLOCK_BYTES,
    _View,
    _assemble,
    _blocks,
    _dense_state,
    _intersect,
    _key,
    _local_tensors,
    _view,
)

if TYPE_CHECKING:
    from ..trainer import Trainer

__all__ = [
    "check_resumable",
    "save_checkpoint",
    "load_checkpoint",
    "find_latest",
    "load_history",
    "resume_from_latest",
    "checkpoint_dir",
    "data_start_batch",
]


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
    try:
        step = load_checkpoint(trainer, latest)
    except CheckpointError as e:
        raise CheckpointError(f"{e}{_damaged_hint(root, latest)}") from e
    return step, data_start_batch(latest, trainer.world_size, trainer.cfg.train.batch_size)


def _damaged_hint(root: str | Path, damaged: Path) -> str:
    """What to do about a damaged newest checkpoint ``damaged``: resume from the next older
    complete one under ``root`` (if any), or start afresh."""
    older = [(s, c) for s, c in _complete_checkpoints(Path(root)) if c != damaged]
    if not older:
        return f" (remove {damaged} to start afresh, or use --no-resume or another --checkpoint-dir)"
    step, prev = max(older, key=lambda sc: sc[0])
    return (f" (remove {damaged} to resume from the older {prev.name}, at step {step}; or start afresh with "
            f"--no-resume or another --checkpoint-dir)")


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete ``step_*`` checkpoint under ``root``: a manifest and a
    readable step; a save's temporary or replaced directory is not one."""
    out = []
    for c in root.glob("step_*") if root.is_dir() else ():
        if ".tmp-" in c.name or ".old-" in c.name or not (c / MANIFEST).is_file():
            continue
        try:
            out.append((int(json.loads((c / META).read_text())["step"]), c))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


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
    return max(_complete_checkpoints(root), key=lambda sc: sc[0], default=(0, None))[1]


def check_resumable(root: str | Path, cfg: Config) -> Path | None:
    """What a launcher can check before starting any rank, without hashing: the newest checkpoint
    under ``root`` (None if none), its manifest, every file's presence and size, that it was saved
    for this model and optimizer, and that it lies within ``train.steps``. CheckpointError names
    the file; the ranks still check the hashes when they load it."""
    latest = find_latest(root)
    if latest is None:
        return None
    try:
        verify_checkpoint(latest, hashes=False)
    except CheckpointError as e:
        raise CheckpointError(f"{e}{_damaged_hint(root, latest)}") from None
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


def data_start_batch(directory: str | Path, world_size: int, batch_size: int) -> int:
    """The global batch a job of ``world_size`` ranks x ``batch_size`` resumes its training data at:
    the checkpoint's step when the global batch size is unchanged (exact), else the first whole
    global batch after the samples already trained on."""
    data = _read_json(Path(directory) / META)["data"]
    if data["world_size"] * data["batch_size"] == world_size * batch_size:
        return int(data["global_batch_index"])
    return -(-int(data["samples_seen"]) // (world_size * batch_size))


# ---- save -----------------------------------------------------------------------------------------


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

