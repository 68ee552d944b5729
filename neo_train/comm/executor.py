"""Run collective schedules on a real process group: a Communicator that picks an algorithm per
collective and message size, builds its schedule once per (op, sizes), and executes it round by
round with batched point-to-point operations.

    comm = ScheduleCommunicator(native_comm, "all_to_all_v<=64KB:bruck, all_to_all_v:pairwise, all_reduce:ring")
    y = comm.all_to_all_v(x, in_splits, out_splits, tag="output_dist")   # pairwise (x is large)

Rules are tried in order; the first whose collective matches and whose size bound holds picks the
algorithm; nothing matching means 'native' (the inner communicator's own collective). A rule is
``op[<=SIZE]:algorithm`` in a comma-separated string, or a tuple ``(op, max_bytes or None,
algorithm)``: the grammar is ``schedules/rules.py``'s. The size a rule compares is the same on
every rank, so every rank picks the same algorithm:

    all_reduce         bytes of the tensor
    all_gather_v       bytes of the gathered result (sum of sizes)
    reduce_scatter_v   bytes of the input (sum of splits)
    all_to_all_v       mean bytes per (sender, receiver) pair: the whole size matrix / W^2

The all-to-all size, like any algorithm that needs the whole size matrix (all but pairwise),
costs one small all-gather of the split rows per call (on the inner communicator); a lone
all-to-all rule with no size bound and a ``local_sizes_only`` algorithm (pairwise) needs none.

Execution: the schedule's rounds are grouped into stages (``schedules.stages``: consecutive rounds
with no data hazard between them; ``fuse_rounds=False`` runs one round per stage). Per stage
every rank posts one ``torch.distributed.batch_isend_irecv`` holding one message per peer (the
transfers to one peer in a stage are packed into one buffer unless they are contiguous), runs
the local steps that touch nothing in flight (e.g. pairwise's own-block copy) while the messages
travel, waits, unpacks, then runs the remaining local copy/reduce steps in order. Works on gloo and NCCL (on NCCL the constructor
runs a barrier so the group's communicator exists before the first batched P2P call). Failures,
timeouts included (the process group's timeout bounds every wait), become ``CollectiveError``
naming the collective, the algorithm, the stage and its rounds, and the rank.

``async_op=True`` runs the schedule at once and returns a finished Handle: a schedule is a
chain of blocking stages, and running it on a helper thread could reorder it against other
collectives on the same group (NCCL needs the same order on every rank). Native collectives stay
asynchronous.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from .interface import CollectiveError, Communicator, Handle, check_splits
from .schedules import (
    Copy,
    LocalOp,
    Schedule,
    TopologyHint,
    Transfer,
    build_schedule,
    get_algorithm,
    stages,
    validate,
)
from .schedules.rules import Rule, format_rules, parse_rules

__all__ = ["ScheduleCommunicator", "Rule", "parse_rules", "format_rules"]


# ---- per-rank execution plans -----------------------------------------------------------------
@dataclass
class _Message:
    peer: int  # group rank
    pieces: list[tuple[str, int, int]]  # (buffer, offset, n) on this rank, in wire order
    n: int


@dataclass
class _Stage:
    index: int
    rounds: tuple[int, int]
    sends: list[_Message]
    recvs: list[_Message]
    early: list[LocalOp]  # touch nothing the stage's messages touch: run while they are in flight
    local: list[LocalOp]  # the rest, after the messages arrived


@dataclass
class _Plan:
    schedule: Schedule
    buffers: dict[str, int]  # this rank's buffer sizes (elements)
    stages: list[_Stage]


def _merge(ts: list[Transfer]) -> list[Transfer]:
    """Join consecutive transfers that are contiguous on both ends (same rule on both ranks)."""
    out: list[Transfer] = []
    for t in ts:
        p = out[-1] if out else None
        if p and p.src_buf == t.src_buf and p.dst_buf == t.dst_buf and p.src_offset + p.n == t.src_offset and p.dst_offset + p.n == t.dst_offset:
            out[-1] = dataclasses.replace(p, n=p.n + t.n)
        else:
            out.append(t)
    return out


def _split_early(local: list[LocalOp], sends: list[_Message], recvs: list[_Message]) -> tuple[list[LocalOp], list[LocalOp]]:
    """Local steps that may run while the stage's messages are in flight: those that write
    nothing a send reads or a receive writes, read nothing a receive writes, and clash with no
    earlier step that has to wait (so each list keeps its order and the result is unchanged)."""

    def clash(a: tuple[str, int, int], b: tuple[str, int, int]) -> bool:
        return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]

    sent = [p for m in sends for p in m.pieces]
    landed = [p for m in recvs for p in m.pieces]
    early: list[LocalOp] = []
    late: list[LocalOp] = []
    for op in local:
        w = (op.dst_buf, op.dst_offset, op.n)
        r = (op.src_buf, op.src_offset, op.n)
        hazard = any(clash(w, p) for p in sent + landed) or any(clash(r, p) for p in landed)
        hazard = hazard or any(
            clash(w, (q.dst_buf, q.dst_offset, q.n)) or clash(w, (q.src_buf, q.src_offset, q.n))
            or clash(r, (q.dst_buf, q.dst_offset, q.n))
            for q in late
        )
        (late if hazard else early).append(op)
    return early, late


def make_plan(s: Schedule, rank: int, fuse_rounds: bool = True) -> _Plan:
    groups = stages(s) if fuse_rounds else [[k] for k in range(len(s.rounds))]
    plan_stages = []
    for si, rounds in enumerate(groups):
        pairs: dict[tuple[int, int], list[Transfer]] = OrderedDict()
        for k in rounds:
            for t in s.rounds[k].transfers:
                if rank in (t.src, t.dst):
                    pairs.setdefault((t.src, t.dst), []).append(t)
        sends, recvs = [], []
        for (src, dst), ts in pairs.items():
            ts = _merge(ts)
            n = sum(t.n for t in ts)
            if src == rank:
                sends.append(_Message(dst, [(t.src_buf, t.src_offset, t.n) for t in ts], n))
            else:
                recvs.append(_Message(src, [(t.dst_buf, t.dst_offset, t.n) for t in ts], n))
        local = [op for k in rounds for op in s.rounds[k].local if op.rank == rank]
        early, late = _split_early(local, sends, recvs)
        if sends or recvs or local:
            plan_stages.append(_Stage(si, (rounds[0], rounds[-1]), sends, recvs, early, late))
    return _Plan(s, {name: sizes[rank] for name, sizes in s.buffers.items()}, plan_stages)


class ScheduleCommunicator(Communicator):
    """Collectives run as schedules of batched P2P ops on ``inner``'s group; see the module doc."""

    def __init__(
        self,
        inner: Communicator,
        rules: "str | Sequence[Rule | tuple] | None" = None,
        *,
        hint: TopologyHint | None = None,
        fuse_rounds: bool = True,
        validate_schedules: bool = False,
        cache_size: int = 256,
        stats: Counter | None = None,
    ) -> None:
        self.inner = inner
        self.rank, self.world_size = inner.rank, inner.world_size
        self.rules = parse_rules(rules)
        self.hint = hint or TopologyHint()
        self.fuse_rounds = fuse_rounds
        self.validate_schedules = validate_schedules
        self.cache_size = cache_size
        self.stats: Counter = Counter() if stats is None else stats  # (op, algorithm) -> calls, shared with subgroups
        self._plans: OrderedDict = OrderedDict()
        self._peers = list(getattr(inner, "global_ranks", range(self.world_size)))
        if getattr(inner, "backend", None) == "nccl" and self.rules and self.world_size > 1:
            inner.barrier()  # create the NCCL communicator before the first batched P2P call

    def __getattr__(self, name):  # group, device, name, global_ranks, ... of the wrapped communicator
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"ScheduleCommunicator({self.inner!r}, rules='{format_rules(self.rules)}')"

    # ---- choosing and building --------------------------------------------------------------
    def choose(self, op: str, nbytes) -> str:
        """The algorithm for ``op``; ``nbytes`` is the size (or a callable giving it, asked only
        when a rule has a bound)."""
        for r in self.rules:
            if r.op == "*" and r.algorithm != "native" and op not in get_algorithm(r.algorithm).ops:
                continue
            if r.op not in (op, "*"):
                continue
            if math.isinf(r.max_bytes):
                return r.algorithm
            if (nbytes() if callable(nbytes) else nbytes) <= r.max_bytes:
                return r.algorithm
        return "native"

    def plan(self, op: str, algorithm: str, sizes, elem_size: int = 4) -> _Plan:
        """This rank's (cached) execution plan of ``algorithm``'s schedule for ``op``/``sizes``."""
        hint = dataclasses.replace(self.hint, elem_size=elem_size) if algorithm == "opera" else self.hint
        key = (op, algorithm, sizes, hint)
        p = self._plans.get(key)
        if p is not None:
            self._plans.move_to_end(key)
            return p
        s = build_schedule(algorithm, op, self.world_size, sizes, hint)
        if self.validate_schedules:
            validate(s)
        p = make_plan(s, self.rank, self.fuse_rounds)
        self._plans[key] = p
        if len(self._plans) > self.cache_size:
            self._plans.popitem(last=False)
        return p

    # ---- running ----------------------------------------------------------------------------
    def _where(self, op: str, tag: str, alg: str) -> str:
        t = f" [{tag}]" if tag else ""
        name = getattr(self.inner, "name", "?")
        return f"{op}{t} via schedule '{alg}' on rank {self.rank} of group '{name}' (size {self.world_size}, ranks {self._peers})"

    def _execute(self, op: str, tag: str, plan: _Plan, flat_in: torch.Tensor, combine: str = "sum") -> torch.Tensor:
        s = plan.schedule
        bufs = {name: flat_in.new_empty(n) for name, n in plan.buffers.items() if name != "in"}
        bufs["in"] = flat_in
        group = getattr(self.inner, "group", None)
        for st in plan.stages:

            def failed(e: Exception) -> CollectiveError:
                timeout = getattr(self.inner, "timeout_s", None)
                return CollectiveError(
                    f"{self._where(op, tag, s.algorithm)} failed or timed out in stage {st.index} "
                    f"(rounds {st.rounds[0]}-{st.rounds[1]} of {len(s.rounds)})"
                    f"{f' (timeout {timeout:.0f}s; a peer may have died)' if timeout else ''}: {e}"
                )

            ops, staged = [], []
            for m in st.sends:
                if len(m.pieces) == 1:
                    b, o, n = m.pieces[0]
                    t = bufs[b][o : o + n]
                else:
                    t = torch.cat([bufs[b][o : o + n] for b, o, n in m.pieces])
                ops.append(dist.P2POp(dist.isend, t, self._peers[m.peer], group, st.index))
            for m in st.recvs:
                if len(m.pieces) == 1:
                    b, o, n = m.pieces[0]
                    t = bufs[b][o : o + n]
                else:
                    t = flat_in.new_empty(m.n)
                    staged.append((t, m.pieces))
                ops.append(dist.P2POp(dist.irecv, t, self._peers[m.peer], group, st.index))
            try:
                works = dist.batch_isend_irecv(ops) if ops else []
            except Exception as e:  # noqa: BLE001 - any backend error becomes a named CollectiveError
                raise failed(e) from e
            self._apply(bufs, st.early, combine)
            try:
                for w in works:
                    w.wait()
            except Exception as e:  # noqa: BLE001
                raise failed(e) from e
            for t, pieces in staged:
                at = 0
                for b, o, n in pieces:
                    bufs[b][o : o + n].copy_(t[at : at + n])
                    at += n
            self._apply(bufs, st.local, combine)
        return bufs["out"]

    @staticmethod
    def _apply(bufs: dict[str, torch.Tensor], ops: list[LocalOp], combine: str) -> None:
        for lop in ops:
            dst = bufs[lop.dst_buf][lop.dst_offset : lop.dst_offset + lop.n]
            src = bufs[lop.src_buf][lop.src_offset : lop.src_offset + lop.n]
            if isinstance(lop, Copy):
                dst.copy_(src)
            elif combine == "max":
                torch.maximum(dst, src, out=dst)
            elif combine == "min":
                torch.minimum(dst, src, out=dst)
            else:
                dst.add_(src)

    @staticmethod
    def _done(out: torch.Tensor, async_op: bool):
        return Handle(lambda: out, _done=out) if async_op else out

    # ---- collectives --------------------------------------------------------------------------
    def all_to_all_v(self, x, in_splits, out_splits, *, async_op=False, tag=""):
        W, r = self.world_size, self.rank
        ins = check_splits("all_to_all_v in_splits", in_splits, W, x.shape[0])
        outs = check_splits("all_to_all_v out_splits", out_splits, W)
        e = math.prod(x.shape[1:])
        matrix: list[list[int]] = []

        def whole() -> list[list[int]]:
            if not matrix:
                rows = self.inner.all_gather_v(torch.tensor(ins, dtype=torch.int64, device=x.device), [W] * W, tag=f"{tag}:splits")
                matrix.extend(rows.view(W, W).tolist())
                col = [matrix[i][r] for i in range(W)]
                if col != outs:
                    raise ValueError(
                        f"all_to_all_v [{tag}] on rank {r}: out_splits {outs} disagree with what the peers send {col}"
                    )
            return matrix

        alg = self.choose("all_to_all_v", lambda: sum(map(sum, whole())) * e * x.element_size() / (W * W))
        if alg == "native" or W == 1:
            self.stats["all_to_all_v", "native"] += 1
            return self.inner.all_to_all_v(x, ins, outs, async_op=async_op, tag=tag)
        if not matrix and get_algorithm(alg).local_sizes_only:
            rows = [[0] * W for _ in range(W)]  # this rank's row and column only (see Algorithm)
            rows[r] = list(ins)
            for i in range(W):
                rows[i][r] = outs[i]
        else:
            rows = whole()
        sizes = tuple(tuple(v * e for v in row) for row in rows)
        x = x.contiguous()
        out = self._execute("all_to_all_v", tag, self.plan("all_to_all_v", alg, sizes, x.element_size()), x.view(-1))
        self.stats["all_to_all_v", alg] += 1
        return self._done(out.view(sum(outs), *x.shape[1:]), async_op)

    def all_gather_v(self, x, sizes, *, async_op=False, tag=""):
        W = self.world_size
        s = check_splits("all_gather_v", sizes, W)
        if x.shape[0] != s[self.rank]:
            raise ValueError(f"all_gather_v: rank {self.rank} holds {x.shape[0]} rows, sizes say {s[self.rank]}")
        e = math.prod(x.shape[1:])
        alg = self.choose("all_gather_v", sum(s) * e * x.element_size())
        if alg == "native" or W == 1:
            self.stats["all_gather_v", "native"] += 1
            return self.inner.all_gather_v(x, s, async_op=async_op, tag=tag)
        x = x.contiguous()
        plan = self.plan("all_gather_v", alg, tuple(v * e for v in s), x.element_size())
        out = self._execute("all_gather_v", tag, plan, x.view(-1))
        self.stats["all_gather_v", alg] += 1
        return self._done(out.view(sum(s), *x.shape[1:]), async_op)

    def reduce_scatter_v(self, x, splits, *, async_op=False, tag=""):
        W = self.world_size
        s = check_splits("reduce_scatter_v", splits, W, x.shape[0])
        e = math.prod(x.shape[1:])
        alg = self.choose("reduce_scatter_v", x.numel() * x.element_size())
        if alg == "native" or W == 1:
            self.stats["reduce_scatter_v", "native"] += 1
            return self.inner.reduce_scatter_v(x, s, async_op=async_op, tag=tag)
        x = x.contiguous()
        plan = self.plan("reduce_scatter_v", alg, tuple(v * e for v in s), x.element_size())
        out = self._execute("reduce_scatter_v", tag, plan, x.view(-1))
        self.stats["reduce_scatter_v", alg] += 1
        return self._done(out.view(s[self.rank], *x.shape[1:]), async_op)

    def all_reduce(self, x, op="sum", *, async_op=False, tag=""):
        if op not in ("sum", "max", "min", "avg"):
            raise ValueError(f"all_reduce: unknown op {op!r} (sum, max, min, avg)")
        alg = self.choose("all_reduce", x.numel() * x.element_size())
        if alg == "native" or self.world_size == 1:
            self.stats["all_reduce", "native"] += 1
            return self.inner.all_reduce(x, op, async_op=async_op, tag=tag)
        plan = self.plan("all_reduce", alg, (x.numel(),) * self.world_size, x.element_size())
        out = self._execute("all_reduce", tag, plan, x.reshape(-1), "sum" if op == "avg" else op)
        if op == "avg":
            out.div_(self.world_size)
        x.copy_(out.view(x.shape))
        self.stats["all_reduce", alg] += 1
        return self._done(x, async_op)

    def barrier(self) -> None:
        self.inner.barrier()

    def _wrap(self, g: Communicator | None) -> "ScheduleCommunicator | None":
        if g is None:
            return None
        return ScheduleCommunicator(
            g, self.rules, hint=self.hint, fuse_rounds=self.fuse_rounds,
            validate_schedules=self.validate_schedules, cache_size=self.cache_size, stats=self.stats,
        )

    def subgroup(self, ranks: Sequence[int], name: str = "sub") -> "ScheduleCommunicator | None":
        return self._wrap(self.inner.subgroup(ranks, name=name))  # type: ignore[call-arg]

    def node_groups(self, local_world_size: int):
        intra, cross = self.inner.node_groups(local_world_size)  # type: ignore[attr-defined]
        return self._wrap(intra), self._wrap(cross)
