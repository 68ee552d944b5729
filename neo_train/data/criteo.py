"""A streaming, rank-sharded reader of the Criteo Kaggle / Terabyte click logs.

File format (plain text, or gzip: detected from the magic bytes, so ``.gz`` and ``.tsv`` both
work), one sample per line, 40 tab-separated columns:

    label \\t I1 .. I13 \\t C1 .. C26

    label   ``0`` or ``1``
    I1..I13 decimal integers, possibly negative, possibly empty (= missing)
    C1..C26 hex strings (Criteo writes 8 lowercase digits; 1..16 digits of either case are
            accepted), possibly empty (= missing)

Each batch of B lines becomes a ``Batch``:

    dense   (B, 13) float32   log(max(x, 0) + 1), missing -> 0
    sparse  26 features, one per categorical column, feature-major (see ``batch.py``):
            feature f of sample b is the bag [int(C_{f+1}, 16) % num_rows(table of f)] or,
            when C_{f+1} is missing, the empty bag (length 0); values int64, lengths int32
    labels  (B,) float32 in {0, 1}

A malformed line (not 40 columns, a label other than 0/1, a dense field that is not a plain
decimal of at most 18 digits, a categorical that is not hex) raises ValueError naming the file,
the 1-based line number in the file and the column. A rank checks only the lines it parses.

The model's features, in ``ModelConfig.feature_names`` order, are bound to C1..C26 in that
order, so the model must have exactly 26 sparse features and 13 dense features.

Rank sharding. With W ranks and per-rank batch size b, global batch g is lines
[g*W*b, (g+1)*W*b) of the file and rank r reads lines [g*W*b + r*b, g*W*b + (r+1)*b): the W
local batches, concatenated rank 0 first (``Batch.concat``), are exactly the batch a single
process reading with batch size W*b produces. Every rank reads (but only its own slice parses)
the whole stream, which keeps the ranks in lock-step without any communication.

A short final global batch of n < W*b lines is dropped with ``drop_last=True``; otherwise it is
split as evenly as possible, rank r taking lines [n*r//W, n*(r+1)//W) of it, so concatenation
stays exact and every rank yields the same number of batches (a rank may get an empty batch
when n < W: the collectives of a step still need it to take part). Sharded training needs equal
batches (its exchanges are sized by ``train.batch_size``): ``Trainer.check_batch`` refuses a batch
of another size, naming the rank and step, so train with ``drop_last=True``.

Epochs and the evaluation hold-out. ``epochs`` passes over the file make one stream of batches
(0: passes without end; the consumer decides when to stop); the stream ends after the last pass,
which the trainer takes as "stop at the end of the data". With ``holdout_every = k > 0`` every
k-th global batch of the file (g % k == k - 1) is held out: ``split="train"`` skips those
batches (in every pass) and ``split="eval"`` yields only them (one pass), so evaluation never
sees a sample training read, whatever the number of epochs. ``start_batch`` counts batches of
the stream the split yields (across passes): the training step a checkpoint resumes at.

    reader = CriteoReader("train.tsv.gz", cfg.model, batch_size=2048, rank=r, world_size=W,
                          epochs=2, holdout_every=10)
    for batch in reader: ...
    ckpt["data_position"] = reader.global_batch_index   # resume with start_batch=that
"""
from __future__ import annotations

import gzip
import itertools
import zlib
from pathlib import Path
from typing import IO, Iterator

import numpy as np
import torch

from neo_train.config import CRITEO_KAGGLE_CARDINALITIES, ModelConfig
from neo_train.data.batch import Batch, SparseFeatures

__all__ = ["CriteoReader", "check_criteo_model", "count_global_batches", "write_synthetic_criteo_tsv", "NUM_DENSE", "NUM_SPARSE", "COLUMN_NAMES"]

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_SPARSE
COLUMN_NAMES: tuple[str, ...] = (
    ("label",) + tuple(f"I{i + 1}" for i in range(NUM_DENSE)) + tuple(f"C{i + 1}" for i in range(NUM_SPARSE))
)
"""Names of the 40 columns, in file order (column k of an error message is COLUMN_NAMES[k-1])."""

_MAX_DEC_DIGITS = 18  # int64 holds every 18-digit decimal
_MAX_HEX_DIGITS = 16  # uint64 holds every 16-digit hex
# No valid field is longer than 19 bytes ('-' and 18 digits), so looking at the first 20 bytes of
# each still finds every bad one, and one absurdly long field cannot widen the work of a batch.
_MAX_FIELD_BYTES = _MAX_DEC_DIGITS + 2

# Byte -> code lookup tables (uint8, so one `c < 10` or `c < 16` tests for a digit): a digit's
# value, _MINUS, or _BAD for a byte that may not appear in the column (NUL and tab included).
# _PAD is the code of the positions past a field's end.
_PAD, _MINUS, _BAD = 16, 17, 255
_DEC = np.full(256, _BAD, dtype=np.uint8)
_DEC[ord("0") : ord("9") + 1] = np.arange(10)
_DEC[ord("-")] = _MINUS
_HEX = np.full(256, _BAD, dtype=np.uint8)
_HEX[ord("0") : ord("9") + 1] = np.arange(10)
_HEX[ord("a") : ord("f") + 1] = np.arange(10, 16)
_HEX[ord("A") : ord("F") + 1] = np.arange(10, 16)


def _open_binary(path: Path) -> IO[bytes]:
    """The file as a binary stream, decompressing when it starts with the gzip magic bytes."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    # A large buffer: line iteration over a plain file is then bounded by memchr, not syscalls.
    return open(path, "rb", buffering=1 << 20)


def check_criteo_model(model: ModelConfig) -> None:
    """ValueError unless ``model`` reads Criteo's columns: 13 dense and 26 sparse features."""
    if model.num_dense_features != NUM_DENSE:
        raise ValueError(
            f"Criteo has {NUM_DENSE} dense features but the model has "
            f"num_dense_features = {model.num_dense_features}"
        )
    keys = model.feature_names
    if len(keys) != NUM_SPARSE:
        raise ValueError(
            f"Criteo has {NUM_SPARSE} categorical features but the model's tables give "
            f"{len(keys)} sparse features ({', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}); "
            f"--preset criteo_kaggle has Criteo's shape"
        )


class CriteoReader:
    """Iterates over one rank's ``Batch``es of a Criteo TSV (format and sharding: module docstring).

    Each ``iter()`` starts again from ``start_batch``. ``global_batch_index`` is the index of the
    next global batch to be yielded: while the consumer holds global batch g it reads g + 1, which
    is the ``start_batch`` that resumes right after g.
    """

    def __init__(
        self,
        path: str | Path,
        model: ModelConfig,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        start_batch: int = 0,
        drop_last: bool = True,
        *,
        epochs: int = 1,
        holdout_every: int = 0,
        split: str = "train",
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"Criteo data file {self.path} does not exist")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if start_batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {start_batch}")
        if epochs < 0:
            raise ValueError(f"epochs must be >= 0 (0: without end), got {epochs}")
        if holdout_every < 0 or holdout_every == 1:
            raise ValueError(f"holdout_every must be 0 (no hold-out) or >= 2, got {holdout_every}")
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if split == "eval" and not holdout_every:
            raise ValueError("split='eval' reads the held-out batches: it needs holdout_every >= 2")
        check_criteo_model(model)
        self.model = model
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.start_batch = start_batch
        self.drop_last = drop_last
        self.split = split
        self.holdout_every = holdout_every
        self.epochs = 1 if split == "eval" else epochs
        self.epochs_done = 0  # passes over the file completed by the current iteration
        self.keys: tuple[str, ...] = tuple(model.feature_names)
        # Rows of the table behind each feature, in feature (= column C1..C26) order.
        self._rows = np.array([t.num_rows for t in model.tables for _ in t.feature_names], dtype=np.uint64)
        self.global_batch_index = start_batch

    # ---- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        W, b, r = self.world_size, self.batch_size, self.rank
        gb = W * b
        skip = self.start_batch  # batches of this split's stream still to pass over unparsed
        self.global_batch_index = skip
        self.epochs_done = 0
        per_epoch: int | None = None  # batches of the split in one pass, once a pass completed
        while self.epochs == 0 or self.epochs_done < self.epochs:
            if per_epoch is not None:
                if per_epoch == 0:
                    return  # the file holds no batch of this split: more passes yield nothing
                passes = skip // per_epoch  # whole passes to skip: no need to read them
                if self.epochs:
                    passes = min(passes, self.epochs - self.epochs_done)
                skip -= passes * per_epoch
                self.epochs_done += passes
                if self.epochs and self.epochs_done >= self.epochs:
                    return
            taken = 0
            with _open_binary(self.path) as f:
                g = 0  # global batch of the file
                if not self.holdout_every and skip:  # consecutive batches: skip in one go
                    n = self._read(lambda: sum(1 for _ in itertools.islice(f, skip * gb)), 0)
                    g = n // gb + (1 if n % gb and not self.drop_last else 0)
                    taken, skip = g, skip - g
                    if skip:
                        g = -1  # the pass ended inside the skipped lines
                while g >= 0:
                    if not self._selected(g) or skip:
                        n = self._read(lambda: sum(1 for _ in itertools.islice(f, gb)), g * gb)
                        if n == 0 or (n < gb and self.drop_last):
                            break
                        if self._selected(g):
                            skip -= 1
                            taken += 1
                        g += 1
                        if n < gb:
                            break
                        continue
                    lines = self._read(lambda: list(itertools.islice(f, gb)), g * gb)
                    n = len(lines)
                    if n == 0 or (n < gb and self.drop_last):
                        break
                    lo, hi = (r * b, (r + 1) * b) if n == gb else (n * r // W, n * (r + 1) // W)
                    batch = self._parse(lines[lo:hi], first_line=g * gb + lo + 1)
                    g += 1
                    taken += 1
                    # Set before yielding: the generator is suspended at the yield while the batch
                    # is in use, and a checkpoint taken then must point past this batch.
                    self.global_batch_index += 1
                    yield batch
                    if n < gb:
                        break
            self.epochs_done += 1
            if per_epoch is None:
                per_epoch = taken

    def _selected(self, g: int) -> bool:
        """Whether global batch ``g`` of the file belongs to this reader's split."""
        k = self.holdout_every
        held_out = bool(k) and g % k == k - 1
        return held_out if self.split == "eval" else not held_out

    def _read(self, read, line: int):
        """Run a read of the file; a damaged gzip stream (or an unreadable file) is a ValueError
        naming the file and about where, not a bare EOFError / BadGzipFile."""
        try:
            return read()
        except (EOFError, OSError, zlib.error) as e:
            raise ValueError(f"{self.path}: cannot read past line ~{line + 1}: {type(e).__name__}: {e} "
                             f"(a truncated or damaged gzip file?)") from None

    # ---- parsing --------------------------------------------------------------------------------
    def _error(self, line: int, msg: str) -> ValueError:
        return ValueError(f"{self.path}, line {line}: {msg}")

    def _field_error(self, line: int, col: int, field: bytes, why: str) -> ValueError:
        shown = repr(field) if len(field) <= 64 else f"{field[:48]!r}... ({len(field):,} bytes)"
        return self._error(line, f"column {col + 1} ({COLUMN_NAMES[col]}): {why}, got {shown}")

    def _parse(self, lines: list[bytes], first_line: int) -> Batch:
        """Parse B raw lines (with their newlines) into a Batch; ``first_line`` is 1-based."""
        B = len(lines)
        if B == 0:
            return self._empty()
        rows = [ln.rstrip(b"\r\n") for ln in lines]
        tabs = np.fromiter((ln.count(b"\t") for ln in rows), dtype=np.int64, count=B)
        bad = np.flatnonzero(tabs != NUM_COLUMNS - 1)
        if bad.size:
            i = int(bad[0])
            raise self._error(
                first_line + i,
                f"expected {NUM_COLUMNS} tab-separated columns (label, I1..I13, C1..C26), "
                f"got {int(tabs[i]) + 1}",
            )
        # One buffer of B*40 tab-separated fields; everything below is array work on it.
        chunk = b"\t".join(rows)
        buf = np.frombuffer(chunk, dtype=np.uint8)
        sep = np.flatnonzero(buf == ord("\t"))  # exactly B*40 - 1 tabs, checked above
        starts = np.concatenate(([0], sep + 1)).reshape(B, NUM_COLUMNS)
        ends = np.concatenate((sep, [buf.size])).reshape(B, NUM_COLUMNS)
        lens = ends - starts  # (B, 40)

        labels = buf[np.minimum(starts[:, 0], buf.size - 1)]
        bad_label = (lens[:, 0] != 1) | ((labels != ord("0")) & (labels != ord("1")))
        dense_sl, cat_sl = slice(1, 1 + NUM_DENSE), slice(1 + NUM_DENSE, NUM_COLUMNS)
        dense, bad_dense = _parse_decimal(buf, starts[:, dense_sl], ends[:, dense_sl])
        cat, present, bad_cat = _parse_hex(buf, starts[:, cat_sl], ends[:, cat_sl])

        bad_any = np.concatenate([bad_label[:, None], bad_dense, bad_cat], axis=1)  # (B, 40)
        if bad_any.any():
            # Row-major argmax: the first bad field of the first bad line.
            i, c = divmod(int(np.argmax(bad_any.reshape(-1))), NUM_COLUMNS)
            field = chunk[starts[i, c] : ends[i, c]]
            raise self._field_error(first_line + i, c, field, _why(c, field))

        # Dense: missing is already 0. Negatives (the real logs have them in I2) are clamped to 0
        # as DLRM's reference preprocessing does, which also keeps log1p finite.
        dense_t = torch.from_numpy(np.log1p(np.maximum(dense, 0).astype(np.float64)).astype(np.float32))
        ids = (cat % self._rows).astype(np.int64)  # (B, 26)
        # Feature-major: transpose so feature f's B samples are contiguous.
        present_fm = present.T  # (26, B)
        values = torch.from_numpy(np.ascontiguousarray(ids.T[present_fm]))
        lengths = torch.from_numpy(present_fm.astype(np.int32).reshape(-1))
        label_t = torch.from_numpy((labels == ord("1")).astype(np.float32))
        return Batch(dense_t, SparseFeatures(self.keys, values, lengths), label_t)

    def _empty(self) -> Batch:
        return Batch(
            torch.zeros(0, NUM_DENSE, dtype=torch.float32),
            SparseFeatures(self.keys, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int32)),
            torch.zeros(0, dtype=torch.float32),
        )


def _positions(table: np.ndarray, buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> Iterator[np.ndarray]:
    """For p = 0, 1, ..: the lookup code of byte p of every field buf[starts:starts+lens]
    ((B, C) each), _PAD past a field's end. Stops at the longest field, capped at
    _MAX_FIELD_BYTES (a longer field is bad anyway and only needs to stay bad).

    Walking positions with (B, C) arrays keeps every numpy op long and contiguous; a
    (B, C, width) grid would need reductions over its short last axis, which numpy does slowly.
    """
    codes = np.append(table[buf], np.uint8(_PAD))  # codes[-1]: where reads past a field's end go
    width = min(int(lens.max()), _MAX_FIELD_BYTES)
    for p in range(width):
        yield codes[np.where(p < lens, starts + p, codes.size - 1)]


def _parse_decimal(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Optionally signed decimal fields buf[starts:ends] ((B, C) each) -> (values (B, C) int64,
    bad (B, C)). Empty fields parse to 0. Stricter than ``int()``: no spaces, '+' or '_'."""
    lens = ends - starts
    v = np.zeros(starts.shape, dtype=np.int64)
    bad = np.zeros(starts.shape, dtype=bool)
    lead_minus = np.zeros(starts.shape, dtype=bool)
    for p, c in enumerate(_positions(_DEC, buf, starts, lens)):  # Horner, one byte position a step
        v = np.where(c < 10, v * 10 + c, v)
        bad |= c == _BAD
        if p == 0:
            lead_minus = c == _MINUS
        else:
            bad |= c == _MINUS  # '-' only leading
    ndig = lens - lead_minus
    bad |= lead_minus & (ndig == 0)  # a lone '-'
    bad |= ndig > _MAX_DEC_DIGITS
    v = np.where(lead_minus, -v, v)
    return np.where(bad, 0, v), bad


def _parse_hex(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hex fields buf[starts:ends] ((B, C) each) -> (values (B, C) uint64, present (B, C), bad (B, C))."""
    lens = ends - starts
    v = np.zeros(starts.shape, dtype=np.uint64)
    bad = lens > _MAX_HEX_DIGITS
    for c in _positions(_HEX, buf, starts, lens):
        # uint64 wraps instead of overflowing; only fields already marked bad can wrap.
        v = np.where(c < 16, (v << np.uint64(4)) | c.astype(np.uint64), v)
        bad |= c == _BAD
    return v, (lens > 0) & ~bad, bad


def _why(col: int, field: bytes) -> str:
    """Why a field that failed the vectorised checks is malformed (only runs on an error)."""
    if col == 0:
        return "label must be 0 or 1"
    if col <= NUM_DENSE:
        if len(field.lstrip(b"-")) > _MAX_DEC_DIGITS:
            return f"integer longer than {_MAX_DEC_DIGITS} digits"
        return "not a decimal integer"
    if len(field) > _MAX_HEX_DIGITS:
        return f"hex value longer than {_MAX_HEX_DIGITS} digits"
    return "not a hex string"


# ---- synthetic data -------------------------------------------------------------------------------


def count_global_batches(path: str | Path, global_batch: int, holdout_every: int = 0, at_most: int = 1) -> int:
    """How many training batches of ``global_batch`` lines one pass over ``path`` yields (the
    held-out ones excluded), counting at most ``at_most``: reads at most the lines those need,
    so a launcher can check a file holds a batch without reading all of it."""
    k = holdout_every
    need = at_most + (at_most // (k - 1) if k else 0)  # file batches that hold at_most train ones
    with _open_binary(Path(path)) as f:
        try:
            lines = sum(1 for _ in itertools.islice(f, need * global_batch))
        except (EOFError, OSError, zlib.error) as e:
            raise ValueError(f"{path}: cannot be read: {type(e).__name__}: {e} (a truncated or damaged gzip file?)") from None
    full = lines // global_batch
    return min(at_most, full - (full // k if k else 0))


def write_synthetic_criteo_tsv(path: str | Path, num_lines: int, seed: int = 0, missing_rate: float = 0.1) -> None:
    """Write ``num_lines`` Criteo-format lines (gzip when ``path`` ends in ``.gz``).

    Realistic in the ways a reader can get wrong: counts from a heavy-tailed distribution, I2
    negative about 5% of the time (as in the real logs), 8-digit lowercase hex categoricals drawn
    with a power-law skew from per-column vocabularies (sized like Criteo Kaggle's, capped at
    10k), each dense and categorical field missing with probability ``missing_rate``, and labels
    (~30% positive) that depend on I1, I3 and C2, so a model can learn something.
    """
    if num_lines < 0:
        raise ValueError(f"num_lines must be >= 0, got {num_lines}")
    if not 0.0 <= missing_rate <= 1.0:
        raise ValueError(f"missing_rate must be in [0, 1], got {missing_rate}")
    rng = np.random.default_rng(seed)
    N = num_lines

    dense = np.floor(rng.lognormal(mean=1.0, sigma=1.6, size=(N, NUM_DENSE))).astype(np.int64)
    neg = rng.random(N) < 0.05
    dense[neg, 1] = -rng.integers(1, 4, size=int(neg.sum()))
    dense_missing = rng.random((N, NUM_DENSE)) < missing_rate

    vocab_sizes = [min(c, 10_000) for c in CRITEO_KAGGLE_CARDINALITIES]
    # Power-law ranks into each column's vocabulary: rank 0 most frequent.
    ranks = np.stack(
        [(rng.zipf(1.3, size=N) - 1) % v for v in vocab_sizes], axis=1
    )  # (N, 26)
    cat_missing = rng.random((N, NUM_SPARSE)) < missing_rate
    vocabs = [[f"{x:08x}" for x in rng.integers(0, 2**32, size=v, dtype=np.uint64)] for v in vocab_sizes]

    i1 = np.where(dense_missing[:, 0], 0, np.maximum(dense[:, 0], 0))
    i3 = np.where(dense_missing[:, 2], 0, np.maximum(dense[:, 2], 0))
    c2_top = (ranks[:, 1] < 3) & ~cat_missing[:, 1]
    logit = -1.6 + 0.45 * np.log1p(i1) - 0.25 * np.log1p(i3) + 1.2 * c2_top
    labels = (rng.random(N) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)

    cols: list[list[str]] = [[str(x) for x in labels]]
    for j in range(NUM_DENSE):
        cols.append(["" if m else str(x) for x, m in zip(dense[:, j].tolist(), dense_missing[:, j].tolist())])
    for j in range(NUM_SPARSE):
        vj = vocabs[j]
        cols.append(["" if m else vj[k] for k, m in zip(ranks[:, j].tolist(), cat_missing[:, j].tolist())])
    text = "".join("\t".join(row) + "\n" for row in zip(*cols))

    p = Path(path)
    if p.suffix == ".gz":
        with gzip.open(p, "wt", encoding="ascii", newline="") as f:
            f.write(text)
    else:
        with open(p, "w", encoding="ascii", newline="") as f:
            f.write(text)
