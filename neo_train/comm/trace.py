"""Record every collective as facebookresearch/param's basic comms trace, one JSON file per rank.

    comm = TracingCommunicator(native_comm)          # wrap the world communicator (and its subgroups)
    ... train ...
    comm.dump("traces/")                             # -> traces/trace_rank{global rank}.json
    entries = load_trace("traces/trace_rank0.json")  # validated; replay.py replays them

The format, checked against facebookresearch/param (train/comms/pt/commsTraceParser.py,
``_parseBasicTrace``/``_parseBasicTraceComms``; train/comms/pt/commsTraceReplay.py,
``extractCommsInfo`` and ``readRawTrace``; et_replay/comm/comms_utils.py, ``paramToCommName``,
``commsArgs``, ``paramCommsBench.dtypeMap`` and the all_to_allv split handling): the file is ONE
JSON list (``json.load`` then iterate), one object per collective, with the keys the parser
reads: ``comms`` (``all_to_allv``, ``all_reduce``, ``all_gather``, ``reduce_scatter``,
``barrier``; any spelling ``paramToCommName`` folds to these is accepted on load), ``req``,
``startTime_ns``, ``world_size``, ``pg_id``, ``global_ranks`` (param's ``groupRanks``),
``markers`` (param's ``markerStack``: here ``[tag]``, the training phase), ``in_msg_size`` /
``out_msg_size`` (elements), ``dtype`` (param's names: float, double, half, bfloat16, int, long,
...), and ``in_split`` / ``out_split`` (per-peer element counts; param reads them for
all_to_allv and rescales dim-0 splits to the flattened tensor, which is the identity for our
element counts). Keys param ignores carry what replay and analysis need beyond that:
``duration_ns``, ``seqnum`` (per process group), ``group_rank``, ``global_rank``, ``reduce_op``;
uneven all_gather / reduce_scatter keep their per-rank sizes in ``out_split`` / ``in_split``.
(param's directory mode reads ``rank-{r}.json``; pass our per-rank files explicitly instead.)

Timing: ``startTime_ns`` is wall-clock (time.time_ns) at the call; ``duration_ns`` runs to the
call's return, or for ``async_op`` to ``wait()`` (or the future completing), null if never waited.
Entries are appended at issue time, so a rank's file lists its collectives in issue order.

The rank's own timeline (what the simulator replays: ``topology.trace_input.rank_timelines``). The
process that issues collectives alternates between *blocking* (inside a collective call, or inside
a wait for an asynchronous one) and *compute* (everything else: kernels, the framework, waiting for
a data loader; on a shared host also time the OS gave to other ranks). Blocking intervals are
numbered in the order they begin; each is recorded with the compute that preceded it:

    async        whether the call was asynchronous (returns a handle) or blocked to the end
    order        the call's position among the process's blocking intervals
    compute_ns   compute since the previous blocking interval ended (null for the first)
    call_ns      time inside the call: the whole collective, or for async only its launch
    issue_ns     async on the host: how far into the launch the collective was handed to the
                 transport (``interface.mark_issue``); from then on it can progress while the
                 launch is still returning (absent when the backend does not mark it)
    step         the training step in progress at the call (``trace_step``; null outside steps)
    step_start_ns  present when a step began since the previous blocking interval: how long
                 before this call it began
    wait_order, wait_compute_ns, wait_ns, wait_step, wait_step_start_ns
                 the same for the wait that joined an async collective: ``Handle.wait()``
                 (``joined_by`` "wait"), or for collectives handed to DDP as futures the end of
                 the backward that waited for them (``watch_backward``; ``joined_by``
                 "backward", and ``duration_ns`` ends when the collective completed); several
                 collectives joined by one wait share its ``wait_order``; absent when nothing
                 waited
    backend      the transport (gloo, nccl) of the process group

Times are host nanoseconds (``time.perf_counter_ns``) on CPU ranks, where host time is the work.
On a GPU the host only launches kernels and an NCCL call returns once enqueued, so a CUDA
communicator's trace times the *device*: every instant above is a CUDA event recorded on the
calling thread's current stream (before and after each call and wait, at each step mark and at
the end of a backward), and the intervals are read from the events when the trace is dumped (no
host sync before then). ``compute_ns`` is then the stream's time between its previous blocking
interval and the call, ``call_ns`` / ``wait_ns`` how long the stream stood at a collective, and
``duration_ns`` of an asynchronous one runs from its launch to where the stream resumed after
waiting for it; such entries carry ``"clock": "cuda"``. ``startTime_ns`` stays the host's wall
clock (param's field). ``TracingCommunicator(clock=...)`` chooses ("host", "cuda"; default: the
communicator's device).
"""
from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from .interface import Communicator, Handle, clear_issue, issued_at

__all__ = [
    "TracingCommunicator",
    "TraceRecorder",
    "TraceError",
    "load_trace",
    "param_comm_name",
    "DTYPE_NAMES",
    "torch_dtype",
    "TIMELINE_FIELDS",
]

# param's paramToCommName aliases (letters only, lower case) for what we replay
_ALIASES = {
    "alltoallv": "all_to_allv",
    "alltoallbase": "all_to_allv",
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgatherv": "all_gather",
    "allgatherbase": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescatterv": "reduce_scatter",
    "reducescatterbase": "reduce_scatter",
    "barrier": "barrier",
}
DTYPE_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "half",
    torch.bfloat16: "bfloat16",
    torch.int32: "int",
    torch.int64: "long",
    torch.int16: "short",
    torch.int8: "int8",
    torch.uint8: "byte",
    torch.bool: "bool",
}
# param's dtypeMap keys (and torch's own names) -> torch dtype
_DTYPES = {name: dt for dt, name in DTYPE_NAMES.items()} | {
    "float32": torch.float32,
    "float16": torch.float16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "char": torch.int8,
    "signed char": torch.int8,
    "unsigned char": torch.uint8,
}


# integer fields of the rank's timeline of blocking intervals (module docstring)
TIMELINE_FIELDS = ("order", "compute_ns", "call_ns", "issue_ns", "step", "step_start_ns", "wait_order",
                   "wait_compute_ns", "wait_ns", "wait_step", "wait_step_start_ns")


class TraceError(ValueError):
    """A malformed trace; the message names the file, the entry index and the field."""


def param_comm_name(name: str) -> str | None:
    """param's canonical collective name for ``name`` (None if we cannot replay it)."""
    return _ALIASES.get("".join(c for c in str(name).lower() if c.isalpha()))


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; one of {sorted(_DTYPES)}") from None


class _Late:
    """A device time known only once its events have run: a token (``op`` "t": the index of an
    event), or the difference or maximum of two such times. ``_resolve`` turns it into ns."""
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Any, b: Any = None) -> None:
        self.op, self.a, self.b = op, a, b


def _resolve(x: Any, times: Sequence[int], memo: dict[int, int]) -> Any:
    """``x``'s ns (``times``: each event's). Without recursion and each node once (``memo``, by
    id): the time the last blocking interval ended is a maximum over every interval before it,
    a chain as long as the trace."""
    if not isinstance(x, _Late):
        return x
    stack = [x]
    while stack:
        n = stack[-1]
        if id(n) in memo:
            stack.pop()
        elif n.op == "t":
            memo[id(n)] = times[n.a]
            stack.pop()
        else:
            todo = [c for c in (n.a, n.b) if isinstance(c, _Late) and id(c) not in memo]
            if todo:
                stack.extend(todo)
                continue
            a, b = (memo[id(c)] if isinstance(c, _Late) else c for c in (n.a, n.b))
            memo[id(n)] = max(a, b) if n.op == "max" else max(0, a - b)  # "diff": a - b, never negative
            stack.pop()
    return memo[id(x)]


class CudaClock:
    """Instants as CUDA events on the current stream (``event_factory``: tests pass a stand-in);
    ``times()`` reads them all, ns after the first, once the device has run them."""

    def __init__(self, event_factory: Any = None) -> None:
        self._new = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
        self._events: list[Any] = []
        self._lock = threading.Lock()
        self.now()  # the origin

    def now(self) -> _Late:
        ev = self._new()
        ev.record()
        with self._lock:
            self._events.append(ev)
            return _Late("t", len(self._events) - 1)

    def times(self) -> list[int]:
        with self._lock:
            events = list(self._events)
        for ev in events:
            ev.synchronize()
        return [round(events[0].elapsed_time(ev) * 1e6) for ev in events]  # elapsed_time: ms


class TraceRecorder:
    """The entries of one process (shared by a TracingCommunicator and its subgroups).

    A host trace's entries hold only numbers, strings and tuples (lists in the JSON), so the
    garbage collector stops tracking them: a long trace does not slow every later allocation
    down. A CUDA trace's hold its device times unread (``_Late``) until the dump."""

    def __init__(self, global_rank: int, clock: CudaClock | None = None) -> None:
        self.global_rank = global_rank
        self.clock = clock  # None: host time, perf_counter_ns
        self.entries: list[dict[str, Any]] = []
        self._seq: dict[int, int] = {}
        self.next_pg = 0  # fallback process-group ids, when torch's group names are not numbers
        # the timeline of blocking intervals (see the module docstring)
        self._lock = threading.Lock()
        self._order = 0
        self._last_end: Any = None  # when the last blocking interval ended (``now``)
        self.step: int | None = None
        self._step_began: Any = None  # when the step in progress began (``now``), until its first interval
        self._unjoined: list[dict[str, Any]] = []  # async entries handed out as futures, not yet waited

    # ---- instants: host ns, or (CUDA) events read at dump ---------------------------------------
    def now(self) -> Any:
        return time.perf_counter_ns() if self.clock is None else self.clock.now()

    def _since(self, t: Any, t0: Any) -> Any:
        """t - t0, ns, at least 0."""
        if isinstance(t, _Late) or isinstance(t0, _Late):
            return _Late("diff", t, t0)
        return max(0, t - t0)

    @staticmethod
    def _later(a: Any, b: Any) -> Any:
        return _Late("max", a, b) if isinstance(a, _Late) or isinstance(b, _Late) else max(a, b)

    def trace_step(self, step: int | None) -> None:
        """Step ``step`` begins now (None: the training loop is over, which ends the last step);
        later entries carry it."""
        with self._lock:
            self.step = step
            self._step_began = self.now()

    def begin_block(self, t: Any = None) -> dict[str, Any]:
        """A blocking interval begins now (or at ``t``, from ``now``): its order, start and the
        compute before it."""
        with self._lock:  # the instant taken under the lock: orders and times agree across threads
            t = self.now() if t is None else t
            blk: dict[str, Any] = {"order": self._order, "t0": t, "step": self.step,
                                   "compute_ns": None if self._last_end is None else self._since(t, self._last_end)}
            self._order += 1
            if self._step_began is not None:
                blk["step_start_ns"] = self._since(t, self._step_began)
                self._step_began = None
            return blk

    def end_block(self, blk: dict[str, Any], t: Any = None) -> Any:
        """The interval ends now (or at ``t``); returns its length (ns)."""
        with self._lock:
            t = self.now() if t is None else t
            self._last_end = t if self._last_end is None else self._later(self._last_end, t)
            return self._since(t, blk["t0"])

    @staticmethod
    def put_wait(entry: dict[str, Any], blk: dict[str, Any], ns: int, by: str = "wait") -> None:
        entry["joined_by"] = by
        entry["wait_order"], entry["wait_compute_ns"], entry["wait_ns"] = blk["order"], blk["compute_ns"], ns
        entry["wait_step"] = blk["step"]
        if "step_start_ns" in blk:
            entry["wait_step_start_ns"] = blk["step_start_ns"]

    def add_unjoined(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._unjoined.append(entry)

    def join_futures(self, t_begin: Any, t_end: Any) -> None:
        """The process waited for every collective handed out as a future from ``t_begin`` to
        ``t_end`` (from ``now``; the end of a backward, where DDP waits for its buckets)."""
        with self._lock:
            pending, self._unjoined = self._unjoined, []
        if not pending:
            return
        blk = self.begin_block(t_begin)
        ns = self.end_block(blk, t_end)
        for e in pending:
            self.put_wait(e, blk, ns, "backward")
            if self.clock is not None:  # on the device it completed where the stream resumed
                e["duration_ns"] = self._since(t_end, e.pop("_t0"))

    def resolved_entries(self) -> list[dict[str, Any]]:
        """The entries with every device time read (the events are waited for: call at the end)."""
        if self.clock is None:
            return self.entries
        times, memo = self.clock.times(), {}
        return [{k: _resolve(v, times, memo) for k, v in e.items() if k != "_t0"} for e in self.entries]

    def dump(self, path: str | Path) -> Path:
        """Write the entries; ``path`` is a ``.json`` file or a directory (-> trace_rank{r}.json)."""
        p = Path(path)
        if p.suffix != ".json":
            p.mkdir(parents=True, exist_ok=True)
            p = p / f"trace_rank{self.global_rank}.json"
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
        body = ",\n".join(json.dumps(e) for e in self.resolved_entries())
        p.write_text(f"[\n{body}\n]\n" if body else "[]\n")
        return p


def _clock_for(inner: Communicator, clock: str | CudaClock | None) -> CudaClock | None:
    """None (host time) or the CUDA clock: ``clock`` "host", "cuda", a CudaClock, or None for the
    communicator's device."""
    if isinstance(clock, CudaClock):
        return clock
    if clock is None:
        clock = "cuda" if torch.device(getattr(inner, "device", "cpu")).type == "cuda" else "host"
    if clock == "host":
        return None
    if clock != "cuda":
        raise ValueError(f"TracingCommunicator: clock must be 'host' or 'cuda', got {clock!r}")
    if not torch.cuda.is_available():
        raise ValueError("TracingCommunicator: clock 'cuda' needs a CUDA device (torch.cuda.is_available() is False)")
    return CudaClock()


def _torch_pg_id(inner: Communicator) -> int | None:
    """torch's name of the process group when it is a number (torch numbers groups in creation
    order, the same on every rank; param's execution-trace parser uses the same number)."""
    try:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        group = getattr(inner, "group", None) or dist.group.WORLD
        name = c10d._get_process_group_name(group)
        return int(name) if str(name).isdecimal() else None
    except Exception:  # noqa: BLE001 - not a torch.distributed group: fall back to our numbering
        return None


class TracingCommunicator(Communicator):
    """Forwards every collective to ``inner`` and records it (see the module docstring)."""

    def __init__(
        self,
        inner: Communicator,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        recorder: TraceRecorder | None = None,
        pg_id: int | None = None,
        clock: str | CudaClock | None = None,
    ) -> None:
        self.inner = inner
        self.rank = inner.rank if rank is None else int(rank)
        self.world_size = inner.world_size if world_size is None else int(world_size)
        if (self.rank, self.world_size) != (inner.rank, inner.world_size):
            raise ValueError(
                f"TracingCommunicator: rank {self.rank} / world size {self.world_size} disagree with the "
                f"wrapped communicator's {inner.rank} / {inner.world_size}"
            )
        self.global_ranks = list(getattr(inner, "global_ranks", range(self.world_size)))
        self._ranks = tuple(self.global_ranks)
        self.recorder = recorder or TraceRecorder(self.global_ranks[self.rank], _clock_for(inner, clock))
        if pg_id is None:
            pg_id = _torch_pg_id(inner)
        if pg_id is None:
            pg_id = self.recorder.next_pg
        self.recorder.next_pg = max(self.recorder.next_pg, pg_id + 1)
        self.pg_id = pg_id
        self._backend = str(getattr(inner, "backend", "") or "")

    def __getattr__(self, name):  # group, device, name, ... of the wrapped communicator
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def entries(self) -> list[dict[str, Any]]:
        """The entries so far (a CUDA trace's with its device times read: waits for the device)."""
        return self.recorder.resolved_entries()

    def dump(self, path: str | Path) -> Path:
        return self.recorder.dump(path)

    # ---- recording --------------------------------------------------------------------------
    def _record(self, comms: str, tag: str, n_in: int = 0, n_out: int = 0, dtype: str = "", ins: tuple = (), outs: tuple = ()) -> dict:
        rec = self.recorder
        seq = rec._seq.get(self.pg_id, 0)
        rec._seq[self.pg_id] = seq + 1
        entry = {
            "comms": comms, "req": len(rec.entries), "seqnum": seq, "pg_id": self.pg_id,
            "global_ranks": self._ranks, "world_size": self.world_size, "group_rank": self.rank,
            "global_rank": rec.global_rank, "in_msg_size": n_in, "out_msg_size": n_out, "dtype": dtype,
            "in_split": ins, "out_split": outs, "startTime_ns": time.time_ns(), "duration_ns": None,
            "markers": (tag or "untagged",), "backend": self._backend,
        }
        if rec.clock is not None:
            entry["clock"] = "cuda"
        if comms == "barrier":  # param reads no sizes for a barrier
            for key in ("in_msg_size", "out_msg_size", "dtype", "in_split", "out_split"):
                del entry[key]
        rec.entries.append(entry)
        return entry

    def _run(self, entry: dict, call, async_op: bool):
        """Run the collective; its duration lands in the entry (for async: when waited on), and
        the call (and later its wait) in the process's timeline of blocking intervals."""
        rec = self.recorder
        blk = rec.begin_block()
        entry.update(order=blk["order"], compute_ns=blk["compute_ns"], step=blk["step"], **{"async": async_op})
        if "step_start_ns" in blk:
            entry["step_start_ns"] = blk["step_start_ns"]
        clear_issue()
        try:
            out = call()
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"[:300]
            raise
        finally:
            entry["call_ns"] = rec.end_block(blk)
        t0 = blk["t0"]
        issued = issued_at()
        if async_op and rec.clock is None and issued is not None and issued >= t0:
            entry["issue_ns"] = min(issued - t0, entry["call_ns"])
        if not async_op:
            entry["duration_ns"] = entry["call_ns"]
            return out
        on_device = rec.clock is not None

        def finish(result):
            # on the host it completed when its wait returned or its future fired; a CUDA stream
            # resumes after it where the wait stood, which the wait (or the backward's join) records
            if entry["duration_ns"] is None and not on_device:
                entry["duration_ns"] = time.perf_counter_ns() - t0
            return result

        def wait():
            w = rec.begin_block()
            try:
                return finish(out.wait())
            finally:
                t1 = rec.now()
                rec.put_wait(entry, w, rec.end_block(w, t1))
                if on_device and entry["duration_ns"] is None:
                    entry["duration_ns"] = rec._since(t1, t0)

        def future():
            if on_device:
                entry["_t0"] = t0  # the join at the backward's end gives its duration
            rec.add_unjoined(entry)  # joined where the process waits for it: watch_backward
            return inner_future().then(lambda f: finish(f.value()))

        inner_future = out._future
        return Handle(wait, _future=future if inner_future is not None else None)

    # ---- the trainer's marks ------------------------------------------------------------------
    def trace_step(self, step: int | None) -> None:
        """Training step ``step`` begins now (None: the loop is over): entries carry the step in
        progress, and the first blocking interval of a step how long after the step began."""
        self.recorder.trace_step(step)

    def watch_backward(self, loss: torch.Tensor) -> None:
        """Call before ``loss.backward()``: the collectives handed out as futures during it (DDP's
        gradient buckets) are joined at its end, where DDP waits for them. Two autograd-engine
        callbacks bracket that wait: the first, queued from a hook on ``loss`` (the first thing the
        backward runs, so before DDP queues its finalisation), runs when the graph is done; it
        queues the second, which runs after DDP's finalisation has waited for every bucket."""
        if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
            return
        rec = self.recorder
        engine = torch.autograd.Variable._execution_engine

        def graph_done() -> None:
            t_begin = rec.now()
            engine.queue_callback(lambda: rec.join_futures(t_begin, rec.now()))

        def on_grad(_g: torch.Tensor) -> None:
            engine.queue_callback(graph_done)

        loss.register_hook(on_grad)

    @staticmethod
    def _dtype(x: torch.Tensor) -> str:
        return DTYPE_NAMES.get(x.dtype) or str(x.dtype).replace("torch.", "")

    def all_to_all_v(self, x, in_splits, out_splits, *, async_op=False, tag=""):
        e = math.prod(x.shape[1:])
        ins, outs = tuple([int(v) * e for v in in_splits]), tuple([int(v) * e for v in out_splits])
        entry = self._record("all_to_allv", tag, x.numel(), sum(outs), self._dtype(x), ins, outs)
        return self._run(entry, lambda: self.inner.all_to_all_v(x, in_splits, out_splits, async_op=async_op, tag=tag), async_op)

    def all_gather_v(self, x, sizes, *, async_op=False, tag=""):
        e = math.prod(x.shape[1:])
        outs = tuple([int(v) * e for v in sizes])
        entry = self._record("all_gather", tag, x.numel(), sum(outs), self._dtype(x), (), outs)
        return self._run(entry, lambda: self.inner.all_gather_v(x, sizes, async_op=async_op, tag=tag), async_op)

    def reduce_scatter_v(self, x, splits, *, async_op=False, tag=""):
        e = math.prod(x.shape[1:])
        ins = tuple([int(v) * e for v in splits])
        mine = ins[self.rank] if len(ins) == self.world_size else 0
        entry = self._record("reduce_scatter", tag, x.numel(), mine, self._dtype(x), ins, ())
        return self._run(entry, lambda: self.inner.reduce_scatter_v(x, splits, async_op=async_op, tag=tag), async_op)

    def all_reduce(self, x, op="sum", *, async_op=False, tag=""):
        entry = self._record("all_reduce", tag, x.numel(), x.numel(), self._dtype(x), (), ())
        entry["reduce_op"] = op
        return self._run(entry, lambda: self.inner.all_reduce(x, op, async_op=async_op, tag=tag), async_op)

    def barrier(self) -> None:
        self._run(self._record("barrier", "barrier"), self.inner.barrier, False)

    def _wrap(self, g: Communicator | None, fallback_id: int) -> "TracingCommunicator | None":
        if g is None:
            return None
        pg = _torch_pg_id(g)
        return TracingCommunicator(g, recorder=self.recorder, pg_id=pg if pg is not None else fallback_id)

    def subgroup(self, ranks: Sequence[int], name: str = "sub") -> "TracingCommunicator | None":
        fallback = self.recorder.next_pg  # counted on members and non-members alike
        self.recorder.next_pg += 1
        return self._wrap(self.inner.subgroup(ranks, name=name), fallback)  # type: ignore[call-arg]

    def node_groups(self, local_world_size: int):
        W, L = self.world_size, local_world_size
        base = self.recorder.next_pg  # the inner creates W/L node groups, then L cross groups
        self.recorder.next_pg += W // max(L, 1) + L
        intra, cross = self.inner.node_groups(local_world_size)  # type: ignore[attr-defined]
        return self._wrap(intra, base + self.rank // L), self._wrap(cross, base + W // L + self.rank % L)


# ---- loading and checking ---------------------------------------------------------------------
def _int(where: str, e: dict, key: str, minimum: int = 0) -> int:
    v = e[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise TraceError(f"{where}: field '{key}' must be an integer >= {minimum}, got {v!r}")
    return v


def _int_list(where: str, e: dict, key: str, length: int) -> list[int]:
    v = e[key]
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
        raise TraceError(f"{where}: field '{key}' must be a list of non-negative integers, got {v!r}")
    if len(v) != length:
        raise TraceError(f"{where}: field '{key}' has {len(v)} entries for a world size of {length}")
    return list(v)


def load_trace(path: str | Path) -> list[dict[str, Any]]:
    """Read and check one rank's trace; returns its entries with canonical keys filled in
    (``comms`` canonical, ``global_ranks``, ``pg_id``, ``markers``, ``in_split``/``out_split``
    as per-rank lists where the collective has them, ``duration_ns`` or None).

    Raises ``TraceError`` naming the entry index and field: missing fields, sizes that are not
    non-negative integers, splits not summing to the message size, a world size that disagrees
    with the group's ranks, a process group whose ranks change between entries."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except json.JSONDecodeError as err:
        raise TraceError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a JSON list of entries (param's basic comms trace), got a {type(data).__name__}")
    groups: dict[int, list[int]] = {}
    out = []
    for i, raw in enumerate(data):
        where = f"{path}: entry {i}"
        if not isinstance(raw, dict):
            raise TraceError(f"{where}: expected an object, got {raw!r}")
        e = dict(raw)
        if "comms" not in e:
            raise TraceError(f"{where}: missing field 'comms'")
        comms = param_comm_name(e["comms"])
        if comms is None:
            raise TraceError(f"{where}: field 'comms' = {e['comms']!r} is not a collective we replay ({sorted(set(_ALIASES.values()))})")
        e["comms"] = where_comms = comms
        where = f"{path}: entry {i} ({where_comms})"
        if "global_ranks" not in e and "groupRanks" in e:
            e["global_ranks"] = e["groupRanks"]
        if "markers" not in e and "markerStack" in e:
            e["markers"] = e["markerStack"]
        required = ["world_size"] + ([] if comms == "barrier" else ["in_msg_size", "out_msg_size", "dtype"])
        if comms == "all_to_allv":
            required += ["in_split", "out_split"]
        for key in required:
            if key not in e:
                raise TraceError(f"{where}: missing field '{key}'")
        W = _int(where, e, "world_size", 1)
        e.setdefault("global_ranks", list(range(W)))
        ranks = e["global_ranks"]
        if not isinstance(ranks, list) or any(not isinstance(r, int) or r < 0 for r in ranks) or len(set(ranks)) != len(ranks):
            raise TraceError(f"{where}: field 'global_ranks' must be a list of distinct ranks, got {ranks!r}")
        if len(ranks) != W:
            raise TraceError(f"{where}: field 'world_size' is {W} but 'global_ranks' lists {len(ranks)} ranks {ranks}")
        e.setdefault("pg_id", 0)
        pg = _int(where, e, "pg_id")
        if groups.setdefault(pg, ranks) != ranks:
            raise TraceError(f"{where}: field 'global_ranks' {ranks} of process group {pg} differs from {groups[pg]} in an earlier entry")
        e.setdefault("req", i)
        e.setdefault("markers", [])
        if not isinstance(e["markers"], list):
            raise TraceError(f"{where}: field 'markers' must be a list of names, got {e['markers']!r}")
        for key in ("startTime_ns", "duration_ns"):
            e.setdefault(key, None)
            if e[key] is not None:
                _int(where, e, key)
        for key in TIMELINE_FIELDS:  # the rank's timeline (module docstring): optional
            if e.get(key) is not None:
                _int(where, e, key)
        if e.get("joined_by") not in (None, "wait", "backward"):
            raise TraceError(f"{where}: field 'joined_by' must be 'wait' or 'backward', got {e['joined_by']!r}")
        if "async" in e and not isinstance(e["async"], bool):
            raise TraceError(f"{where}: field 'async' must be true or false, got {e['async']!r}")
        if comms == "barrier":
            out.append(e)
            continue
        n_in, n_out = _int(where, e, "in_msg_size"), _int(where, e, "out_msg_size")
        try:
            torch_dtype(e["dtype"])
        except ValueError as err:
            raise TraceError(f"{where}: field 'dtype': {err}") from None
        gr = e.get("group_rank")
        if gr is not None and not (isinstance(gr, int) and 0 <= gr < W):
            raise TraceError(f"{where}: field 'group_rank' must be in 0..{W - 1}, got {gr!r}")
        has_in = bool(e.get("in_split"))
        has_out = bool(e.get("out_split"))
        if comms == "all_to_allv":
            ins, outs = _int_list(where, e, "in_split", W), _int_list(where, e, "out_split", W)
            if sum(ins) != n_in:
                raise TraceError(f"{where}: field 'in_split' sums to {sum(ins)}, 'in_msg_size' is {n_in}")
            if sum(outs) != n_out:
                raise TraceError(f"{where}: field 'out_split' sums to {sum(outs)}, 'out_msg_size' is {n_out}")
        elif comms == "all_gather":
            outs = _int_list(where, e, "out_split", W) if has_out else [n_in] * W
            if sum(outs) != n_out:
                raise TraceError(f"{where}: field 'out_split' sums to {sum(outs)}, 'out_msg_size' is {n_out}")
            if gr is not None and outs[gr] != n_in:
                raise TraceError(f"{where}: field 'in_msg_size' is {n_in}, 'out_split'[{gr}] says {outs[gr]}")
            e["out_split"], e["in_split"] = outs, []
        elif comms == "reduce_scatter":
            ins = _int_list(where, e, "in_split", W) if has_in else [n_out] * W
            if sum(ins) != n_in:
                raise TraceError(f"{where}: field 'in_split' sums to {sum(ins)}, 'in_msg_size' is {n_in}")
            if gr is not None and ins[gr] != n_out:
                raise TraceError(f"{where}: field 'out_msg_size' is {n_out}, 'in_split'[{gr}] says {ins[gr]}")
            e["in_split"], e["out_split"] = ins, []
        else:  # all_reduce
            if n_in != n_out:
                raise TraceError(f"{where}: 'in_msg_size' {n_in} != 'out_msg_size' {n_out} (an all-reduce is in place)")
            e["in_split"], e["out_split"] = [], []
        out.append(e)
    return out
