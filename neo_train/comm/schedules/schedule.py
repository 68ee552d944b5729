"""Collective schedules as data: rounds of point-to-point transfers and local steps.

A ``Schedule`` says, for every rank, what a collective does, as a list of dependent rounds:

    Round k:  Transfer(src, dst, src_buf, src_offset, dst_buf, dst_offset, n)   (concurrent)
              then, in order, local steps on single ranks:
              Copy(rank, dst_buf, dst_offset, src_buf, src_offset, n)     dst[...] = src[...]
              Reduce(rank, dst_buf, dst_offset, src_buf, src_offset, n)   dst[...] += src[...]

Everything is in **elements** of flat 1-D buffers (the executor flattens trailing dims, so a
(rows, D) tensor is rows*D elements). Buffers are named per rank: ``in`` (the caller's input,
read-only), ``out`` (the result) and any scratch buffers the algorithm declares (``acc``,
``r0``...), with one size per rank. A round's transfers read the state before the round and must
not touch what another transfer of the same round writes; its local steps run after all its
transfers arrived.

The collectives and their ``sizes`` (canonical forms from ``normalize_sizes``):

    all_to_all_v      sizes[i][j]: elements rank i sends to rank j (a W x W matrix)
                      in_r = blocks to j in rank order; out_r = blocks from i in rank order
    all_gather_v      sizes[i]: elements rank i contributes; out_r = concat of every in_i
    reduce_scatter_v  sizes[i]: segment i of the input; out_r = sum over ranks of segment r
    all_reduce        sizes[i] = n on every rank; out_r = sum over ranks of in_i

``validate`` runs a schedule symbolically on tags (which input element of which rank sits in every
element of every buffer; for reductions the set of ranks summed so far and the order of the
additions) and raises ``ScheduleError`` naming the round and the transfer or step that is wrong,
or the output element that never arrived. It is exact and O(total elements), meant for tests and
small sizes. ``stages`` groups consecutive rounds that can run as one batch of P2P operations.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union

__all__ = [
    "OPS",
    "REDUCING_OPS",
    "Transfer",
    "Copy",
    "Reduce",
    "LocalOp",
    "Round",
    "Schedule",
    "ScheduleError",
    "normalize_sizes",
    "io_sizes",
    "validate",
    "stages",
]

OPS = ("all_to_all_v", "all_gather_v", "reduce_scatter_v", "all_reduce")
REDUCING_OPS = frozenset({"reduce_scatter_v", "all_reduce"})

Sizes = tuple  # canonical: tuple[tuple[int, ...], ...] for all_to_all_v, tuple[int, ...] otherwise


class ScheduleError(ValueError):
    """A schedule does not implement its collective; the message names the round and step."""


@dataclass(frozen=True)
class Transfer:
    """``n`` elements from ``src``'s ``src_buf[src_offset:]`` to ``dst``'s ``dst_buf[dst_offset:]``."""

    src: int
    dst: int
    src_buf: str
    src_offset: int
    dst_buf: str
    dst_offset: int
    n: int

    def __str__(self) -> str:
        return (
            f"{self.src}->{self.dst} {self.src_buf}[{self.src_offset}:{self.src_offset + self.n}]"
            f" -> {self.dst_buf}[{self.dst_offset}:{self.dst_offset + self.n}]"
        )


@dataclass(frozen=True)
class Copy:
    """On ``rank``: ``dst_buf[dst_offset:+n] = src_buf[src_offset:+n]``."""

    rank: int
    dst_buf: str
    dst_offset: int
    src_buf: str
    src_offset: int
    n: int

    def __str__(self) -> str:
        return (
            f"copy on rank {self.rank}: {self.dst_buf}[{self.dst_offset}:{self.dst_offset + self.n}]"
            f" = {self.src_buf}[{self.src_offset}:{self.src_offset + self.n}]"
        )


@dataclass(frozen=True)
class Reduce:
    """On ``rank``: ``dst_buf[dst_offset:+n] += src_buf[src_offset:+n]`` (or max/min)."""

    rank: int
    dst_buf: str
    dst_offset: int
    src_buf: str
    src_offset: int
    n: int

    def __str__(self) -> str:
        return (
            f"reduce on rank {self.rank}: {self.dst_buf}[{self.dst_offset}:{self.dst_offset + self.n}]"
            f" += {self.src_buf}[{self.src_offset}:{self.src_offset + self.n}]"
        )


LocalOp = Union[Copy, Reduce]


@dataclass
class Round:
    transfers: list[Transfer] = field(default_factory=list)
    local: list[LocalOp] = field(default_factory=list)


def normalize_sizes(op: str, world_size: int, sizes) -> Sizes:
    """The canonical, hashable form of ``sizes`` for ``op`` (see the module docstring).

    all_reduce also takes a bare int ``n``.
    """
    W = world_size
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; one of {OPS}")
    if W < 1:
        raise ValueError(f"world size must be >= 1, got {W}")
    if op == "all_to_all_v":
        rows = [list(r) for r in sizes]
        if len(rows) != W or any(len(r) != W for r in rows):
            raise ValueError(f"all_to_all_v sizes must be a {W}x{W} matrix, got {[len(r) for r in rows]}")
        out: tuple = tuple(tuple(int(v) for v in r) for r in rows)
        flat = [v for r in out for v in r]
    else:
        if op == "all_reduce" and isinstance(sizes, int):
            sizes = [sizes] * W
        out = tuple(int(v) for v in sizes)
        if len(out) != W:
            raise ValueError(f"{op} sizes need one entry per rank ({W}), got {len(out)}")
        if op == "all_reduce" and len(set(out)) > 1:
            raise ValueError(f"all_reduce needs the same element count on every rank, got {list(out)}")
        flat = list(out)
    if any(v < 0 for v in flat):
        raise ValueError(f"{op} sizes must be >= 0, got {sizes}")
    return out


def io_sizes(op: str, world_size: int, sizes: Sizes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(per-rank size of ``in``, per-rank size of ``out``) for a collective."""
    W = world_size
    if op == "all_to_all_v":
        return tuple(sum(sizes[r]) for r in range(W)), tuple(sum(sizes[i][r] for i in range(W)) for r in range(W))
    if op == "all_gather_v":
        return tuple(sizes), (sum(sizes),) * W
    if op == "reduce_scatter_v":
        return (sum(sizes),) * W, tuple(sizes)
    return tuple(sizes), tuple(sizes)  # all_reduce


@dataclass
class Schedule:
    """A collective as rounds of transfers and local steps; see the module docstring."""

    op: str
    world_size: int
    sizes: Sizes
    algorithm: str
    rounds: list[Round] = field(default_factory=list)
    buffers: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def new(cls, op: str, world_size: int, sizes, algorithm: str) -> "Schedule":
        sizes = normalize_sizes(op, world_size, sizes)
        ins, outs = io_sizes(op, world_size, sizes)
        return cls(op, world_size, sizes, algorithm, [], {"in": ins, "out": outs})

    # ---- building helpers: zero-length steps are dropped ------------------------------------
    def add_buffer(self, name: str, per_rank: Sequence[int]) -> None:
        if name in self.buffers:
            raise ValueError(f"buffer {name!r} declared twice")
        if len(per_rank) != self.world_size:
            raise ValueError(f"buffer {name!r} needs one size per rank")
        self.buffers[name] = tuple(int(v) for v in per_rank)

    def round(self, k: int) -> Round:
        while len(self.rounds) <= k:
            self.rounds.append(Round())
        return self.rounds[k]

    def send(self, k: int, src: int, dst: int, src_buf: str, src_offset: int, dst_buf: str, dst_offset: int, n: int) -> None:
        if n:
            self.round(k).transfers.append(Transfer(src, dst, src_buf, src_offset, dst_buf, dst_offset, n))
        else:
            self.round(k)

    def copy(self, k: int, rank: int, dst_buf: str, dst_offset: int, src_buf: str, src_offset: int, n: int) -> None:
        if n:
            self.round(k).local.append(Copy(rank, dst_buf, dst_offset, src_buf, src_offset, n))
        else:
            self.round(k)

    def reduce(self, k: int, rank: int, dst_buf: str, dst_offset: int, src_buf: str, src_offset: int, n: int) -> None:
        if n:
            self.round(k).local.append(Reduce(rank, dst_buf, dst_offset, src_buf, src_offset, n))
        else:
            self.round(k)

    # ---- summaries ------------------------------------------------------------------------------
    def describe(self) -> str:
        return f"schedule '{self.algorithm}' for {self.op} on {self.world_size} ranks"

    def messages(self) -> int:
        return sum(len(r.transfers) for r in self.rounds)

    def elements_sent(self) -> list[int]:
        """Elements each rank puts on the wire over the whole schedule."""
        sent = [0] * self.world_size
        for r in self.rounds:
            for t in r.transfers:
                sent[t.src] += t.n
        return sent


# ---- symbolic validation ----------------------------------------------------------------------
# An element's value is (idx, ranks, tree): the input element index it stands for, the sorted
# ranks whose contributions it sums (one rank for a moved element), and for all_reduce the
# canonical order of the additions ((0, rank, idx) leaves, (1, a, b) sums with a <= b), so that
# replicas summing in different orders (different float results) are caught.

_Val = tuple


def _leaf(op: str, rank: int, idx: int) -> _Val:
    return (idx, (rank,), (0, rank, idx) if op == "all_reduce" else None)


def _expected(op: str, W: int, sizes: Sizes, rank: int) -> list[tuple[int, tuple[int, ...]]]:
    """(input index, contributing ranks) of every output element of ``rank``."""
    out: list[tuple[int, tuple[int, ...]]] = []
    if op == "all_to_all_v":
        for i in range(W):
            off = sum(sizes[i][:rank])
            out += [(off + t, (i,)) for t in range(sizes[i][rank])]
    elif op == "all_gather_v":
        for i in range(W):
            out += [(t, (i,)) for t in range(sizes[i])]
    elif op == "reduce_scatter_v":
        off = sum(sizes[:rank])
        out = [(off + t, tuple(range(W))) for t in range(sizes[rank])]
    else:
        out = [(t, tuple(range(W))) for t in range(sizes[rank])]
    return out


def _describe_val(v: _Val | None) -> str:
    if v is None:
        return "nothing"
    idx, ranks, _ = v
    if len(ranks) == 1:
        return f"rank {ranks[0]}'s in[{idx}]"
    return f"the sum of in[{idx}] over ranks {list(ranks)}"


def _overlap(a0: int, a1: int, b0: int, b1: int) -> tuple[int, int] | None:
    lo, hi = max(a0, b0), min(a1, b1)
    return (lo, hi) if lo < hi else None


def _check_static(s: Schedule, where: str, rank_fields: Iterable[tuple[int, str, int, int]], n: int) -> None:
    if n < 0:
        raise ScheduleError(f"{where}: negative length {n}")
    for rank, buf, off, _write in rank_fields:
        if not 0 <= rank < s.world_size:
            raise ScheduleError(f"{where}: rank {rank} is outside the world of {s.world_size}")
        if buf not in s.buffers:
            raise ScheduleError(f"{where}: buffer {buf!r} is not declared (buffers: {sorted(s.buffers)})")
        size = s.buffers[buf][rank]
        if off < 0 or off + n > size:
            raise ScheduleError(f"{where}: {buf}[{off}:{off + n}] is outside rank {rank}'s {buf} of {size} elements")
        if _write and buf == "in":
            raise ScheduleError(f"{where}: writes the read-only input buffer 'in' of rank {rank}")


def validate(s: Schedule, op: str | None = None, sizes=None) -> None:
    """Raise ``ScheduleError`` unless ``s`` delivers every element of ``op`` exactly once and every
    reduction sums every rank's contribution exactly once (in the same order on every replica for
    all_reduce). ``op``/``sizes``, when given, must match the schedule's."""
    W = s.world_size
    ctx = s.describe()
    if s.op not in OPS:
        raise ScheduleError(f"{ctx}: unknown collective")
    if op is not None and op != s.op:
        raise ScheduleError(f"{ctx}: built for {s.op}, asked to check {op}")
    if sizes is not None and normalize_sizes(s.op, W, sizes) != s.sizes:
        raise ScheduleError(f"{ctx}: built for sizes {s.sizes}, asked to check {sizes}")
    ins, outs = io_sizes(s.op, W, s.sizes)
    for name, want in (("in", ins), ("out", outs)):
        if tuple(s.buffers.get(name, ())) != want:
            raise ScheduleError(f"{ctx}: buffer {name!r} has per-rank sizes {s.buffers.get(name)}, the collective needs {want}")
    for name, per_rank in s.buffers.items():
        if len(per_rank) != W or any(v < 0 for v in per_rank):
            raise ScheduleError(f"{ctx}: buffer {name!r} needs {W} non-negative sizes, got {per_rank}")

    reducing = s.op in REDUCING_OPS
    state: dict[tuple[int, str], list[_Val | None]] = {}
    for name, per_rank in s.buffers.items():
        for r in range(W):
            state[r, name] = [_leaf(s.op, r, i) for i in range(per_rank[r])] if name == "in" else [None] * per_rank[r]

    def read(where: str, rank: int, buf: str, off: int, n: int) -> list[_Val]:
        vals = state[rank, buf][off : off + n]
        for j, v in enumerate(vals):
            if v is None:
                raise ScheduleError(f"{where}: reads rank {rank}'s {buf}[{off + j}], which holds no data yet")
        return vals  # type: ignore[return-value]

    def write(where: str, rank: int, buf: str, off: int, vals: list[_Val]) -> None:
        dst = state[rank, buf]
        if buf == "out":
            for j, v in enumerate(dst[off : off + len(vals)]):
                if v is not None:
                    raise ScheduleError(
                        f"{where}: delivers rank {rank}'s out[{off + j}] a second time "
                        f"(it already holds {_describe_val(v)}, now {_describe_val(vals[j])})"
                    )
        dst[off : off + len(vals)] = vals

    for k, rnd in enumerate(s.rounds):
        # static checks and same-round hazards
        writes: dict[tuple[int, str], list[tuple[int, int, int]]] = defaultdict(list)
        reads: dict[tuple[int, str], list[tuple[int, int, int]]] = defaultdict(list)
        for i, t in enumerate(rnd.transfers):
            where = f"{ctx}: round {k}, transfer #{i} ({t})"
            if t.src == t.dst:
                raise ScheduleError(f"{where}: a rank sending to itself must be a local Copy step")
            _check_static(s, where, [(t.src, t.src_buf, t.src_offset, False), (t.dst, t.dst_buf, t.dst_offset, True)], t.n)
            for a, b, j in writes[t.dst, t.dst_buf]:
                ov = _overlap(a, b, t.dst_offset, t.dst_offset + t.n)
                if ov:
                    raise ScheduleError(
                        f"{where}: writes rank {t.dst}'s {t.dst_buf}[{ov[0]}:{ov[1]}], which transfer #{j} "
                        f"({rnd.transfers[j]}) of the same round writes too (duplicated transfer?)"
                    )
            writes[t.dst, t.dst_buf].append((t.dst_offset, t.dst_offset + t.n, i))
            reads[t.src, t.src_buf].append((t.src_offset, t.src_offset + t.n, i))
        for key, ws in writes.items():
            for a, b, i in ws:
                for c, d, j in reads.get(key, ()):
                    ov = _overlap(a, b, c, d)
                    if ov:
                        raise ScheduleError(
                            f"{ctx}: round {k}, transfer #{i} ({rnd.transfers[i]}) writes rank {key[0]}'s "
                            f"{key[1]}[{ov[0]}:{ov[1]}] while transfer #{j} ({rnd.transfers[j]}) of the same round reads it"
                        )
        # transfers read the state before the round: hazard-free, so sequential application is the same
        for i, t in enumerate(rnd.transfers):
            where = f"{ctx}: round {k}, transfer #{i} ({t})"
            write(where, t.dst, t.dst_buf, t.dst_offset, read(where, t.src, t.src_buf, t.src_offset, t.n))
        for i, lop in enumerate(rnd.local):
            where = f"{ctx}: round {k}, local step #{i} ({lop})"
            if not isinstance(lop, (Copy, Reduce)):
                raise ScheduleError(f"{where}: not a Copy or Reduce")
            _check_static(s, where, [(lop.rank, lop.src_buf, lop.src_offset, False), (lop.rank, lop.dst_buf, lop.dst_offset, True)], lop.n)
            src = read(where, lop.rank, lop.src_buf, lop.src_offset, lop.n)
            if isinstance(lop, Copy):
                same = lop.src_buf == lop.dst_buf and _overlap(lop.src_offset, lop.src_offset + lop.n, lop.dst_offset, lop.dst_offset + lop.n)
                if same:
                    raise ScheduleError(f"{where}: source and destination overlap")
                write(where, lop.rank, lop.dst_buf, lop.dst_offset, list(src))
                continue
            if not reducing:
                raise ScheduleError(f"{where}: a reduction step in {s.op}, which moves data without summing")
            dst = read(where, lop.rank, lop.dst_buf, lop.dst_offset, lop.n)
            summed = []
            for j, (a, b) in enumerate(zip(dst, src)):
                if a[0] != b[0]:
                    raise ScheduleError(
                        f"{where}: adds {_describe_val(b)} to {_describe_val(a)} at {lop.dst_buf}[{lop.dst_offset + j}]: different elements"
                    )
                twice = sorted(set(a[1]) & set(b[1]))
                if twice:
                    raise ScheduleError(
                        f"{where}: adds rank(s) {twice}'s contribution to element {a[0]} twice "
                        f"({lop.dst_buf}[{lop.dst_offset + j}] already sums ranks {list(a[1])})"
                    )
                tree = None if a[2] is None else (1, min(a[2], b[2]), max(a[2], b[2]))
                summed.append((a[0], tuple(sorted(a[1] + b[1])), tree))
            state[lop.rank, lop.dst_buf][lop.dst_offset : lop.dst_offset + lop.n] = summed

    for r in range(W):
        got = state[r, "out"]
        bad = []
        for e, ((idx, ranks), v) in enumerate(zip(_expected(s.op, W, s.sizes, r), got)):
            if v is None or v[0] != idx or v[1] != ranks:
                bad.append((e, idx, ranks, v))
        if bad:
            e, idx, ranks, v = bad[0]
            if v is None:
                what = "was never delivered"
            elif reducing and v[0] == idx:
                what = f"misses the contribution(s) of rank(s) {sorted(set(ranks) - set(v[1]))} (it sums ranks {list(v[1])})"
            else:
                what = f"holds {_describe_val(v)}"
            want = f"rank {ranks[0]}'s in[{idx}]" if len(ranks) == 1 else f"the sum of in[{idx}] over all {W} ranks"
            raise ScheduleError(
                f"{ctx}: rank {r}'s out[{e}] {what}; expected {want} "
                f"({len(bad)} of {len(got)} output elements of rank {r} are wrong)"
            )
    if s.op == "all_reduce":
        for e in range(s.sizes[0]):
            trees = [state[r, "out"][e][2] for r in range(W)]  # type: ignore[index]
            for r in range(1, W):
                if trees[r] != trees[0]:
                    raise ScheduleError(
                        f"{ctx}: ranks 0 and {r} sum out[{e}] in different orders; "
                        "float replicas would differ (reduce each element on one rank, then copy it)"
                    )


# ---- stages: consecutive rounds that can run as one batch ---------------------------------------
def _touch(acc: dict, rank: int, buf: str, off: int, n: int) -> None:
    acc[rank, buf].append((off, off + n))


def _hits(acc: dict, rank: int, buf: str, off: int, n: int) -> bool:
    return any(_overlap(a, b, off, off + n) for a, b in acc.get((rank, buf), ()))


def stages(s: Schedule) -> list[list[int]]:
    """Group consecutive rounds into stages that the executor runs as ONE batch of P2P operations
    followed by the rounds' local steps in order.

    Round j joins the stage of rounds i < j when running j's transfers together with the earlier
    rounds' transfers, and its local steps after theirs, changes nothing: j's transfers write
    nothing that an earlier round of the stage reads or writes (transfers or local steps), and
    read nothing that one writes. Computed from the whole schedule, so every rank groups alike
    (message grouping and tags depend on it).
    """
    out: list[list[int]] = []
    reads: dict = defaultdict(list)
    writes: dict = defaultdict(list)
    for k, rnd in enumerate(s.rounds):
        clash = out and any(
            _hits(reads, t.dst, t.dst_buf, t.dst_offset, t.n)
            or _hits(writes, t.dst, t.dst_buf, t.dst_offset, t.n)
            or _hits(writes, t.src, t.src_buf, t.src_offset, t.n)
            for t in rnd.transfers
        )
        if not out or clash:
            out.append([])
            reads, writes = defaultdict(list), defaultdict(list)
        out[-1].append(k)
        for t in rnd.transfers:
            _touch(reads, t.src, t.src_buf, t.src_offset, t.n)
            _touch(writes, t.dst, t.dst_buf, t.dst_offset, t.n)
        for lop in rnd.local:
            _touch(reads, lop.rank, lop.src_buf, lop.src_offset, lop.n)
            _touch(reads, lop.rank, lop.dst_buf, lop.dst_offset, lop.n)
            _touch(writes, lop.rank, lop.dst_buf, lop.dst_offset, lop.n)
    return out
