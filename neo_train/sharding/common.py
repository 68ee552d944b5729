"""What every sharding type shares: the context, lookup units, the input-dist transport, kernels
over a rank's shards, and the column permutation back to feature order.

Vocabulary (shape letters as everywhere: b local batch, W world size, D dims):
    unit   one (feature, shard) pair looked up on the shard's rank. TW: one unit per feature;
           CW: one per column shard; RW: one per row shard. A rank's kernel holds its shards as
           local tables and its units as local features.
    global batch order   the W*b bags a rank sees after input dist: source rank 0's b bags first.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from contextlib import nullcontext
from typing import Any, Sequence

import torch
from torch import nn

from ..comm import Codec, Communicator, all_to_all_v, make_codec
from ..comm.autograd import all_to_all_v_async
from ..comm.awaitable import Pending
from ..config import StorageConfig, TableConfig, cache_factor
from ..kernels import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec
from ..kernels.columns import ColumnAssembly, ColumnPermutation
from ..modules.storage import create_table_kernel, init_kernel_table
from ..planning.plan import Shard, TablePlan

__all__ = [
    "ShardingContext",
    "GroupFeature",
    "Unit",
    "Routed",
    "Sends",
    "IdExchange",
    "reserved_capacity",
    "ColumnAssembly",
    "ColumnPermutation",
    "build_kernel",
    "flat_exchange",
    "positions_where",
    "rows_of",
]


@dataclass
class ShardingContext:
    """What a sharding type needs from the job: communicators, optimizer, backend, codecs."""

    comm: Communicator
    local_world_size: int
    optimizer: SparseOptimizerSpec
    backend: str | None = "auto"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0
    fwd_codec: Codec = field(default_factory=Codec)
    bwd_codec: Codec = field(default_factory=Codec)
    timer: Any = None  # a PhaseTimer, or None: per-stage forward times
    input_comm: Communicator | None = None  # input dist's own group (pipelining); None: comm
    storage: StorageConfig | None = None  # cache / SSD tier / table dtype (None: resident fp32)
    plan_cache_factors: dict[str, float | None] = field(default_factory=dict)  # table -> the plan's factor
    _node_comms: tuple[Communicator, Communicator] | None = None
    _kernels_built: int = 0

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def in_comm(self) -> Communicator:
        """The communicator of the input dist: a group of its own, so the next batch's input
        dist can run in the background while this batch's collectives run on ``comm``."""
        return self.input_comm if self.input_comm is not None else self.comm

    def phase(self, name: str):
        """A context that books its time under ``name`` in the timer (nothing without one)."""
        return self.timer(name) if self.timer is not None else nullcontext()

    def node_comms(self) -> tuple[Communicator, Communicator]:
        """(intra-node, cross-node) communicators; created once, collectively."""
        if self._node_comms is None:
            self._node_comms = self.comm.node_groups(self.local_world_size)  # type: ignore[attr-defined]
        return self._node_comms

    @staticmethod
    def codecs(fwd: str | None, bwd: str | None) -> tuple[Codec, Codec]:
        return make_codec(fwd), make_codec(bwd)


@dataclass(frozen=True)
class GroupFeature:
    """A feature served by a sharding group: its name, its table (index in the model) and plan."""

    name: str
    table_index: int
    table: TableConfig
    plan: TablePlan


@dataclass(frozen=True)
class Unit:
    feature: int  # index into the group's features
    shard: Shard

    @property
    def rank(self) -> int:
        return self.shard.rank


@dataclass
class Routed:
    """A rank's ids after input dist, in [unit][source rank][bag] order."""

    values: torch.Tensor  # (N,)
    lengths: torch.Tensor  # (U * W * b,)
    weights: torch.Tensor | None  # (N,) or None
    # the receiving side's mask of its own bags whose pooled rows come back through the output
    # exchange (a table-wise group with hot-row replication: ``TableWiseSharding.local_out_mask``)
    out_mask: torch.Tensor | None = None

    def offsets(self) -> torch.Tensor:
        out = torch.zeros(self.lengths.numel() + 1, dtype=torch.int64, device=self.lengths.device)
        torch.cumsum(self.lengths.to(torch.int64), 0, out=out[1:])
        return out


@dataclass
class Sends:
    """One sharding group's input dist: what goes to each destination rank.

    per_dest[j] = (lengths, ids, weights or None), each a list of pieces sent back to back (one
    per unit, so the exchange copies them into its payload once): the bags of the U_j units rank
    j looks up, unit-major, for this rank's b samples (U_j*b lengths in all). ``units_on_me`` =
    U_rank (what comes back).
    """

    per_dest: list[tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor] | None]]
    units_on_me: int
    weighted: bool
    out_mask: torch.Tensor | None = None  # travels with the routed ids (``Routed.out_mask``), never on the wire


def positions_where(mask: torch.Tensor, count: int) -> torch.Tensor:
    """The positions (int64, ascending) where the 1-D bool ``mask`` holds, ``count`` of them (a
    number the caller already has on the host). On the CPU ``nonzero`` (reading its size costs
    nothing there, and it is the fastest); on a GPU ``nonzero_static`` of the known size, so no
    device-to-host sync (plain boolean indexing would need one)."""
    if mask.device.type == "cpu":
        return mask.nonzero().flatten()
    return torch.nonzero_static(mask, size=count).flatten()


def rows_of(x: torch.Tensor, g: int) -> tuple[torch.Tensor, int]:
    """``x`` (b, C g) as rows of g values, and how many rows a sample spans (``per``): chunk c of
    sample s is row s per + c. Without a copy when x's samples start g-aligned (a column slice of a
    wider tensor, as the interaction's gradient hands the embeddings: per > C); a reshape
    otherwise (per = C)."""
    b, C = x.shape[0], x.shape[1] // g
    if x.stride(1) == 1 and x.stride(0) % g == 0:
        per = x.stride(0) // g
        return x.as_strided((max(b - 1, 0) * per + C, g), (g, 1)), per
    return x.reshape(b * C, g), C


def _weights_as_int64(w: torch.Tensor) -> torch.Tensor:
    """float32 weights bit-cast into the int64 id payload (exact both ways)."""
    return w.to(torch.float32).view(torch.int32).to(torch.int64)


def _int64_as_weights(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int32).view(torch.float32)


CAPACITY_HISTORY = 9  # counts kept for ``reserved_capacity`` (8 step-to-step changes)


def reserved_capacity(history: Sequence[int]) -> int:
    """Room to reserve for the next count of a series (ids a peer sends, rows a rank touches) from
    its last ``CAPACITY_HISTORY`` values, oldest first: 0 with no history; else the latest count
    plus 6 median absolute step-to-step changes (about 6 standard deviations of iid counts, while
    a one-off jump moves the median little), 1/64 of it and 8. An exchange that sizes a collective
    this way (``IdExchange``) sends what does not fit in a second round, decided alike on every
    rank."""
    if not history:
        return 0
    last = history[-1]
    if len(history) == 1:
        return last + last // 8 + 8
    steps = sorted(abs(a - b) for a, b in zip(history[1:], history[:-1]))
    return last + 6 * steps[len(steps) // 2] + last // 64 + 8


def remember_count(history: list[int], n: int) -> None:
    """Append ``n`` to a ``reserved_capacity`` history, keeping the last ``CAPACITY_HISTORY``."""
    history.append(n)
    del history[:-CAPACITY_HISTORY]


class IdExchange:
    """The input dist of every sharding group: usually one all-to-all, sized without a split-size
    exchange.

    Each peer's ids vary from batch to batch, and an all-to-all needs its receive sizes before it
    starts. Instead of exchanging them first (a collective of its own, and a thread hand-off on
    gloo: about 1 ms of a 10 ms step on two CPU ranks), every (sender, receiver) pair agrees on a
    *capacity* from the counts they have both seen already (``reserved_capacity``: the latest
    count plus a margin from its recent variation), so both sides know the payload's size:

    1. one all-to-all carrying, for each destination, a header (the ids each group sends, and
       whether this sender overflowed any capacity), every group's lengths, and its ids and
       weights (bit-cast into int64) up to the capacity, zero-padded to it; started at once;
    2. ``advance()`` (or ``wait()``) reads the headers (the input dist's one host sync). When
       some sender overflowed (every rank reads every sender's flag, so all agree), a second
       all-to-all carries what did not fit; the first exchange of a ``key`` (no counts seen yet:
       capacities 0) is always two, lengths and then ids, like a split-size exchange;
    3. ``wait()`` returns one ``Routed`` per group, in [unit][source rank][bag] order: unit u's
       bags for the whole global batch are contiguous, source rank 0's first. The counts it
       received, and those it sent, become history for later exchanges of the same ``key``.

    Agreement without communication: history is added at ``wait()``, and every rank starts and
    waits for its exchanges in the same order (one thread issues every collective), so when an
    exchange starts every rank has the same history, the sender's count to a peer and the peer's
    count from it alike. ``key`` keeps separate histories (the collection uses training vs
    evaluation and the batch size). The padding costs bytes: a few per cent of the ids where
    counts vary, 1/64 of them and 8 entries where they do not (one-hot features).
    """

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self._sent: dict[Any, list[list[int]]] = {}  # key -> per destination: entries sent, oldest first
        self._received: dict[Any, list[list[int]]] = {}  # key -> per source

    def __call__(self, groups: Sequence[Sends], b: int, key: Any = None, tag: str = "input_dist") -> Pending:
        comm = self.comm
        W, G = comm.world_size, len(groups)
        device = getattr(comm, "device", "cpu")
        sent_book = self._sent.setdefault(key, [[] for _ in range(W)])
        recv_book = self._received.setdefault(key, [[] for _ in range(W)])
        cap_send = [reserved_capacity(h) for h in sent_book]
        cap_recv = [reserved_capacity(h) for h in recv_book]
        widths = [2 if g.weighted else 1 for g in groups]  # entries per id: the id (and its weight)
        entries = lambda ids: [sum(n * w for n, w in zip(row, widths)) for row in ids]  # noqa: E731 - per peer
        n_send = [[sum(int(v.numel()) for v in g.per_dest[j][1]) for g in groups] for j in range(W)]
        m_send = entries(n_send)
        overflow = int(any(m > c for m, c in zip(m_send, cap_send)))
        header = torch.tensor([x for row in n_send for x in (*row, overflow)], dtype=torch.int64)
        if torch.device(device).type == "cuda":  # pinned, copied without a host sync (run on CPU only so far)
            header = header.pin_memory().to(device, non_blocking=True)
        fixed_recv = G + 1 + sum(g.units_on_me * b for g in groups)  # header + lengths, from every source

        pieces: list[torch.Tensor] = []
        ins: list[int] = []
        rests: list[list[torch.Tensor]] = []  # per destination: what did not fit its capacity
        for j in range(W):
            fixed = [header.narrow(0, j * (G + 1), G + 1)] + [x for g in groups for x in g.per_dest[j][0]]
            var: list[torch.Tensor] = []
            for g in groups:
                _, vals, wts = g.per_dest[j]
                var += vals
                if g.weighted:
                    var += [_weights_as_int64(w) for w in wts]  # type: ignore[union-attr]
            head, rest = _cut(var, cap_send[j])
            pad = cap_send[j] - min(m_send[j], cap_send[j])
            pieces += fixed + head + ([header.new_zeros(pad)] if pad else [])
            ins.append(sum(int(x.numel()) for x in fixed) + cap_send[j])
            rests.append(rest)
        outs = [fixed_recv + c for c in cap_recv]
        payload = torch.cat(pieces).to(torch.int64)  # int32 lengths promote
        first = comm.all_to_all_v(payload, ins, outs, async_op=True, tag=tag)
        state: dict = {}

        def read_headers() -> None:
            recv = first.wait()
            starts = [sum(outs[:i]) for i in range(W)]
            heads = torch.cat([recv.narrow(0, s, G + 1) for s in starts]).view(W, G + 1).tolist()
            n_recv = [h[:G] for h in heads]
            m_recv = entries(n_recv)
            second = None
            if any(h[G] for h in heads):  # some sender overflowed: the rest, from every sender at once
                more_in = [max(0, m - c) for m, c in zip(m_send, cap_send)]
                more_out = [max(0, m - c) for m, c in zip(m_recv, cap_recv)]
                tail = [x for r in rests for x in r]
                second = comm.all_to_all_v(torch.cat(tail).to(torch.int64) if tail else header.new_zeros(0), more_in,
                                           more_out, async_op=True, tag=tag)
            state.update(recv=recv, starts=starts, n_recv=n_recv, m_recv=m_recv, second=second)

        def finish() -> list[Routed]:
            recv, starts, n_recv, m_recv = state["recv"], state["starts"], state["n_recv"], state["m_recv"]
            if state["second"] is not None:  # each source's whole piece, back to back
                more = state["second"].wait()
                parts, at = [], 0
                for i in range(W):
                    extra = max(0, m_recv[i] - cap_recv[i])
                    parts += [recv.narrow(0, starts[i], fixed_recv + m_recv[i] - extra), more.narrow(0, at, extra)]
                    at += extra
                recv = torch.cat(parts)
                starts = [sum(fixed_recv + m for m in m_recv[:i]) for i in range(W)]
            for book, counts in ((sent_book, m_send), (recv_book, m_recv)):
                for h, n in zip(book, counts):
                    remember_count(h, n)
            # at[i][k] = where source i's (lengths, ids, weights) of group k start in recv
            at = []
            for i in range(W):
                lens_at, var_at, row = starts[i] + G + 1, starts[i] + fixed_recv, []
                for k, g in enumerate(groups):
                    row.append((lens_at, var_at, var_at + n_recv[i][k]))
                    lens_at += g.units_on_me * b
                    var_at += n_recv[i][k] * widths[k]
                at.append(row)
            routed = []
            for k, g in enumerate(groups):
                r = _unit_major(recv, [a[k] for a in at], [n_recv[i][k] for i in range(W)], g.weighted, W, g.units_on_me, b)
                r.out_mask = g.out_mask
                routed.append(r)
            return routed

        return Pending(finish, advance=read_headers)


def _cut(pieces: Sequence[torch.Tensor], n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``pieces`` (1-D, back to back) cut after their first ``n`` elements: (head, rest)."""
    head: list[torch.Tensor] = []
    for k, x in enumerate(pieces):
        size = int(x.numel())
        if size >= n:
            if n:
                head.append(x.narrow(0, 0, n))
            rest = ([x.narrow(0, n, size - n)] if size > n else []) + list(pieces[k + 1:])
            return head, rest
        head.append(x)
        n -= size
    return head, []


@functools.cache
def _fbgemm_permute_2d() -> Any:
    """fbgemm's ``permute_2D_sparse_data`` where fbgemm_gpu imports (CPU kernels), else None."""
    from ..kernels.registry import available_backends  # imports fbgemm_gpu once, if it can

    return torch.ops.fbgemm.permute_2D_sparse_data if "fbgemm" in available_backends() else None


def _unit_major(recv: torch.Tensor, at: Sequence[tuple[int, int, int]], n_ids: Sequence[int], weighted: bool,
                W: int, U: int, b: int) -> Routed:
    """One group's ids out of the received buffer, [source][unit][bag] (as received, source i's
    lengths / ids / weights at ``at[i]``) -> [unit][source][bag], one reorder per field: fbgemm's
    fused permute of the (W*U, b) bags on the CPU where fbgemm imports (400k ids, U = 13,
    b = 512: 0.55 ms against 3.9 for the gathers), else one gather."""
    lengths = torch.cat([recv.narrow(0, a[0], U * b) for a in at]).to(torch.int32)
    total = sum(n_ids)

    def by_source(c: int) -> torch.Tensor:  # field c (1: ids, 2: weights) of source 0, then 1, ...
        return torch.cat([recv.narrow(0, a[c], n) for a, n in zip(at, n_ids)])

    permute_2d = _fbgemm_permute_2d() if recv.device.type == "cpu" else None
    l3 = lengths.view(W, U, b)
    if W == 1 or U == 0 or total == 0:
        take = by_source
    elif permute_2d is not None:
        order = torch.tensor([i * U + u for u in range(U) for i in range(W)], dtype=torch.int32)

        def take(c: int) -> torch.Tensor:
            return permute_2d(order, l3.view(W * U, b), by_source(c), None, total)[1]
    else:
        seg = l3.sum(dim=2, dtype=torch.int64)  # (W, U): ids per (source, unit)
        within = seg.cumsum(1) - seg  # where (source, unit)'s ids start among the source's
        t_lens = seg.t().reshape(-1)  # target order (unit, source)
        t_dst = t_lens.cumsum(0) - t_lens
        steps = torch.repeat_interleave(within.t().reshape(-1) - t_dst, t_lens, output_size=total)
        src = torch.arange(total, device=recv.device) + steps
        first = torch.tensor([[a[1], a[2]] for a in at], dtype=torch.int64, device=recv.device)  # (W, 2)

        def take(c: int) -> torch.Tensor:
            shift = torch.repeat_interleave(first[:, c - 1].repeat(U), t_lens, output_size=total)
            return recv.index_select(0, src + shift)
    if W > 1:
        lengths = l3.permute(1, 0, 2).reshape(-1)
    return Routed(take(1), lengths, _int64_as_weights(take(2)) if weighted else None)


def build_kernel(
    ctx: ShardingContext,
    shards: Sequence[tuple[int, TableConfig, Shard]],
    feature_table_map: Sequence[int],
    feature_names: Sequence[str],
    pooling_in_kernel: bool = True,
    cacheable: bool = True,
) -> FusedEmbeddingBag | None:
    """A kernel over this rank's shards (table index, table config, shard), initialised from
    the logical tables' init (so a table starts identical however it is sharded); cached over
    the storage tier where the table's cache load factor is below 1 (and ``cacheable``)."""
    if not shards:
        return None
    specs = [
        TableSpec(s.rows, s.cols, t.pooling if pooling_in_kernel else "sum", f"{t.name}[{s.row_start}:{s.row_end},{s.col_start}:{s.col_end}]")
        for _, t, s in shards
    ]
    factors = [
        cache_factor(t, ctx.storage, ctx.plan_cache_factors.get(t.name)) if cacheable else 1.0 for _, t, _ in shards
    ]
    k = create_table_kernel(
        ctx.backend, specs, ctx.optimizer, factors=factors, storage=ctx.storage,
        store_name=f"rank{ctx.rank}/kernel{ctx._kernels_built}", feature_table_map=list(feature_table_map),
        feature_names=list(feature_names), device=ctx.device, seed=ctx.seed,
    )
    ctx._kernels_built += 1
    k.check_ids = False  # the sharded collection checked the global ids (naming the rank) already
    for i, (ti, t, s) in enumerate(shards):
        init_kernel_table(k, i, ctx.seed, ti, t, s.row_start, s.row_end, s.col_start, s.col_end)
    return k


def flat_exchange(
    comm: Communicator, x: torch.Tensor, b: int, widths: Sequence[int], fwd: Codec, bwd: Codec, tag: str,
    async_op: bool = False,
):
    """Output dist of pooled blocks of differing widths: x (W*b, D_me), rows of source i at
    [i*b, (i+1)*b), goes back to source i; returns (b, sum widths) with peer j's block (width
    widths[j]) at its place in peer order (a ``Pending`` of it with ``async_op``).
    Differentiable (the backward is the mirror exchange).
    """
    W = comm.world_size
    me = widths[comm.rank]
    ins, outs = [b * me] * W, [b * w for w in widths]

    def unflatten(out: torch.Tensor) -> torch.Tensor:
        blocks = [blk.view(b, w) for blk, w in zip(out.split(outs), widths)]
        return torch.cat(blocks, dim=1) if blocks else out.view(b, 0)

    rows = ([me] * W, list(widths))  # the row width of each segment, for row-scaled codecs
    if async_op:
        pending = all_to_all_v_async(comm, x.reshape(-1), ins, outs, fwd, bwd, tag, rows)
        return Pending(lambda: unflatten(pending.wait()))
    return unflatten(all_to_all_v(comm, x.reshape(-1), ins, outs, fwd, bwd, tag, rows))


class ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale`` (the 1/W of the convention)."""

    @staticmethod
    def forward(ctx, x, scale):  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g * ctx.scale, None


class EmbeddingSharding(nn.Module):
    """One sharding type's share of the tables: ``input_sends`` -> ``lookup`` -> ``output_dist``.

    The collection gathers every group's ``Sends`` into one id exchange (``IdExchange``), hands
    each group its ``Routed`` ids, and calls ``compute_async``: the lookup runs now, the output
    dist is left in flight. A group that needs no exchange (data-parallel) returns None from
    ``input_sends`` and gets its own batch from ``local_input``.
    """

    def __init__(self, ctx: ShardingContext, features: Sequence[GroupFeature]) -> None:
        super().__init__()
        self.ctx = ctx
        self.features = list(features)
        self.feature_names = [f.name for f in self.features]
        self.dims = [f.table.dim for f in self.features]

    def scaled_lookup(self, routed, scale: bool = True) -> torch.Tensor:
        """The lookup, timed; its gradient is scaled by 1/W on the way in (the convention's
        1/W), i.e. after the output dist's backward exchange has decoded it, so a narrow
        backward codec carries the unscaled gradient (fp16 subnormals at large W otherwise).
        ``scale=False``: the caller scales (``scale_grad``) a smaller tensor the gradient
        reaches first."""
        with self.ctx.phase("lookup"):
            pooled = self.lookup(routed)
        return self.scale_grad(pooled) if scale else pooled

    def scale_grad(self, x: torch.Tensor) -> torch.Tensor:
        """x, with its gradient scaled by 1/W (``scaled_lookup``)."""
        W = self.ctx.world_size
        return ScaleGrad.apply(x, 1.0 / W) if W > 1 else x

    def compute_async(self, routed, b: int) -> Pending:
        """Lookup now, output dist in flight: the caller overlaps compute until ``wait()``.
        Default: synchronous (a type whose output dist can run asynchronously overrides it)."""
        out = self.compute(routed, b)
        return Pending(lambda: out)

    def compute(self, routed, b: int) -> torch.Tensor:
        """Lookup and output dist of an already distributed input (b local samples)."""
        pooled = self.scaled_lookup(routed)
        with self.ctx.phase("output_dist"):
            return self.output_dist(pooled, b)

    # each sharding type implements these (and local_shards for export)
    def input_sends(self, parts: dict, b: int) -> Sends | None:  # pragma: no cover - abstract
        """This rank's ids of the group's features (``parts``: SparseFeatures.by_feature())
        for each destination; None: looked up locally (``local_input``)."""
        raise NotImplementedError

    def local_input(self, parts: dict, b: int):  # pragma: no cover - only for local groups
        raise NotImplementedError

    def lookup(self, routed) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def output_dist(self, pooled: torch.Tensor, b: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def local_shards(self) -> list[tuple[str, Shard, FusedEmbeddingBag, int]]:
        """(table name, shard, kernel, local table index) for every shard this rank holds."""
        return []

    def prefetch(self, routed) -> None:
        """Bring the rows a routed batch will look up into a cached kernel ahead of its lookup
        (``neo_train.kernels.cache``); nothing for resident kernels or data-parallel groups."""
        kernel = getattr(self, "kernel", None)
        if kernel is not None and hasattr(kernel, "prefetch") and isinstance(routed, Routed):
            kernel.prefetch(routed.values, routed.offsets())
