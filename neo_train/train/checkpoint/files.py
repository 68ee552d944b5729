"""A checkpoint's files: their names and format, what a checkpoint was saved for (the model hash a
load checks), the manifest that proves them whole, and DCP's index written and read as JSON (so
loading unpickles nothing). Every check here raises CheckpointError naming the file or field;
``verify_checkpoint`` is the manifest check a load starts with.

The hashing is split over the ranks (rank r hashes files r, r + W, ...) and shared with one
all-reduce; the same small all-reduces let every rank learn whether any rank failed
(``_agree``) or holds a different value (``_same_on_all_ranks``), so no rank is left waiting in a
collective the others never reach.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

if TYPE_CHECKING:
    from ...comm import Communicator
    from ...config import Config

__all__ = ["CheckpointError", "verify_checkpoint", "FORMAT"]

FORMAT = "neo_train.checkpoint/1"

MANIFEST, META, DCP_INDEX, LATEST = "manifest.json", "checkpoint.json", "dcp_metadata.json", "latest"
HISTORY = "history.json"  # the run's per-step global losses and evaluations up to the checkpoint


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged, or does not fit this run; the message names the file or field."""


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


# ---- what a checkpoint is for --------------------------------------------------------------------
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

