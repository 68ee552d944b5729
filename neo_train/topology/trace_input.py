"""A recorded communication trace (param's basic comms-trace JSON) as a simulator schedule.

    traces = load_trace("traces/")          # {rank: [entry, ...]}: one JSON list per rank
    phases = trace_phases(traces, devices_per_host=8, compute={"forward": 0.012, "backward": 0.025})
    simulate(phases, FatTree(16))

Entries, as param's ``commsTraceReplay`` reads them: ``comms`` (all_to_allv, all_to_all,
all_reduce, all_gather, reduce_scatter, broadcast, send; wait / barrier / init / recv are
skipped), ``in_msg_size`` / ``out_msg_size`` (elements), ``in_split`` / ``out_split`` (elements
per peer, all-to-all-v; empty = even), ``dtype``, ``world_size``, ``pg_id``, ``global_ranks``,
``startTime_ns``, ``markers`` (the phase; param's marker stack: the last one is used), and for
point-to-point ``src_rank`` / ``dst_rank``.

Files: a directory of per-rank lists (the rank is the last number in each file name:
``rank3.json``, ``3.json``, ``trace_rank3.json`` as ``neo_train.comm.trace`` writes them), one JSON
list (every rank is assumed to have recorded the same entries: param's ``--use-one-trace``), or a
JSON object {rank: list}. Uneven all-gathers / reduce-scatters may carry their per-rank sizes in
``out_split`` / ``in_split``.

Matching: the k-th collective of a process group (its ``pg_id`` and ``global_ranks``) on every rank
is one collective (ranks issue a group's collectives in the same order, as NCCL requires);
collectives are ordered by their mean ``startTime_ns`` (else by position). Ranks map to hosts as
rank // devices_per_host. The schedule is a chain: for each change of phase (marker) a Compute of
that phase's seconds, then the phase's collectives one after another; ``compute`` may name only
markers the trace has (``trace_markers``; neo_train's tracer writes its collectives' tags:
input_dist, output_dist, output_dist_bwd, dense_allreduce, metrics, ...), else a ValueError. An all-reduce among ranks
of several hosts runs as ``allreduce`` (ring / dps / hier_*) among those hosts; inside one host, as
a ring over its internal fabric.

Per-rank chains (``timeline_phases``), for traces that carry their ranks' own timelines
(``neo_train.comm.trace`` records them: ``order``, ``compute_ns``, ``call_ns``, ``wait_*``, ``step``):
each rank is a chain of its recorded compute, cut by the intervals in which it blocked: a blocking
call waits for its collective's end, an asynchronous call only launches it and a later wait joins
it. A collective starts when the last rank of its group has issued it (a blocking call) or
handed it to the transport inside its launch (an asynchronous one, the trace's ``issue_ns``: what
the launch does before, such as preparing what is sent, delays the peers; after it the transport's
thread can move the data while the host keeps the caller from returning; a trace without the
field: when the launch returned), after the fixed latency
the collective factory adds (e.g. a calibration's alpha), so a late rank delays the others
exactly as in the run. A rank waiting for a collective (its blocking call, or a wait) resumes at
its end, or with ``return_lags`` (a calibration's, ``trace_sim.calibrated_return_lags``) at the
later of its arrival and the end plus its own lag. An asynchronous collective that the recorded
order shows in company (other collectives issued on a rank between its launch and its wait, or in
flight across its launch: ``concurrent_collectives``) reaches the factory with ``_concurrent`` (how
many) in its entries (a calibration charges what company costs); a blocking call made while an
asynchronous collective is in flight on a rank and live (every rank of its group has launched it,
by the recorded order: ``live_company``) reaches it with ``_company`` (that collective's kind and
group size). ``rank_timelines`` reads the
blocks; a trace without the fields is an error naming the file, rank, entry and field.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .collectives import all_reduce, ring_all_gather
from .simulator import Comm, Compute, Phase, Transfer

__all__ = ["load_trace", "check_trace", "trace_phases", "trace_world_size", "trace_markers", "check_compute_markers",
           "DTYPE_BYTES", "SUPPORTED_COMMS", "Block", "Timeline", "has_recorded_compute", "rank_timelines",
           "timeline_phases", "trace_transports", "network_collectives", "trace_duties", "trace_compute_share", "trace_load",
           "ReturnLags", "concurrent_collectives", "live_company", "COMPANY_LARGER_GROUP_ONLY"]

DTYPE_BYTES = {
    "float": 4, "float32": 4, "float16": 2, "half": 2, "bfloat16": 2, "bf16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "byte": 1, "char": 1, "int8": 1,
    "uint8": 1, "bool": 1,
}  # fmt: skip
SUPPORTED_COMMS = ("all_to_allv", "all_to_all", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send")
_SKIP = ("wait", "barrier", "init", "recv", "irecv")
_ALIASES = {"alltoallv": "all_to_allv", "alltoall": "all_to_all", "all_to_all_single": "all_to_allv",
            "allreduce": "all_reduce", "allgather": "all_gather", "all_gather_base": "all_gather",
            "_allgather_base": "all_gather", "reducescatter": "reduce_scatter", "reduce_scatter_base": "reduce_scatter",
            "_reduce_scatter_base": "reduce_scatter", "isend": "send"}


def load_trace(path: str | Path) -> dict[int, list[dict[str, Any]]]:
    """{rank: entries} from a directory of per-rank JSON lists, one list, or a {rank: list} object.

    Every entry is checked (``check_trace``): a malformed one is a ValueError naming the file,
    the rank, the entry index and the field."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"trace {p} does not exist")
    if p.is_dir():
        out: dict[int, list] = {}
        files: dict[int, Path] = {}
        for f in sorted(p.glob("*.json")):
            nums = re.findall(r"\d+", f.stem)
            if not nums:
                continue
            data = _read(f)
            if not isinstance(data, list):
                raise ValueError(f"trace {f}: expected a JSON list of entries, got {_kind(data)}")
            out[int(nums[-1])] = data
            files[int(nums[-1])] = f
        if not out:
            raise ValueError(f"trace directory {p} holds no rank*.json files")
        check_trace(out, files)
        return _Checked(out, files)
    data = _read(p)
    if isinstance(data, list):
        out = {0: data}
    elif isinstance(data, dict):
        out = {}
        for k, v in data.items():
            try:
                r = int(k)
            except ValueError:
                raise ValueError(f"trace {p}: key {k!r} is not a rank number (expected an object of per-rank "
                                 f"lists)") from None
            if r < 0:
                raise ValueError(f"trace {p}: rank {k!r} must be >= 0")
            if not isinstance(v, list):
                raise ValueError(f"trace {p} rank {r}: expected a JSON list of entries, got {_kind(v)}")
            out[r] = v
        if not out:
            raise ValueError(f"trace {p} holds no ranks")
    else:
        raise ValueError(f"trace {p}: expected a list of entries or an object of per-rank lists, got {_kind(data)}")
    check_trace(out, {r: p for r in out})
    return _Checked(out, {r: p for r in out}, one_file=isinstance(data, list))


class _Checked(dict):
    """{rank: entries} as ``load_trace`` returns it, already checked (the schedule functions skip
    checking it again: a long trace takes about a second per 200k entries); ``files`` names each
    rank's file, ``one_file`` says every rank shares one list (param's --use-one-trace)."""

    def __init__(self, data: Mapping[int, list], files: Mapping[int, Path] | None = None, one_file: bool = False):
        super().__init__(data)
        self.files = dict(files or {})
        self.one_file = one_file


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), f"the number {v}" if isinstance(v, (int, float)) else type(v).__name__)


def _read(f: Path) -> Any:
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"trace {f}: not valid JSON: {e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"trace {f}: not valid JSON: not UTF-8 text") from None


def _short(v: Any, limit: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _is_count(v: Any) -> bool:
    """A non-negative integer (a JSON int, or a float with an integral value such as 8.0)."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return v >= 0
    return isinstance(v, float) and v.is_integer() and v >= 0


def check_trace(traces: Mapping[int, Any], files: Mapping[int, str | Path] | None = None) -> None:
    """ValueError (one line) naming the file, rank, entry index and field of the first malformed
    entry: not an object, an unsupported collective, an unknown dtype, sizes / splits / ranks that
    are not non-negative integers, a send without its dst_rank. ``load_trace`` calls it; the
    schedule functions call it too, so a trace built in memory gets the same errors."""
    if isinstance(traces, _Checked) and files is None:
        return
    for rank, entries in traces.items():
        src = f"trace {files[rank]} rank {rank}" if files and rank in files else f"trace rank {rank}"
        if not isinstance(entries, list):
            raise ValueError(f"{src}: expected a list of entries, got {_kind(entries)}")
        for pos, e in enumerate(entries):
            where = f"{src} entry {pos}"
            if not isinstance(e, dict):
                raise ValueError(f"{where}: expected an object, got {_short(e)}")
            name = _comm_name(e)
            if name in _SKIP or "compute" in e and "comms" not in e:
                continue
            if name not in SUPPORTED_COMMS:
                raise ValueError(f"{where}: unsupported collective {e.get('comms')!r} (supported: {SUPPORTED_COMMS})")
            where = f"{where} ({e.get('comms')})"
            d = str(e.get("dtype", "float")).lower().replace("torch.", "")
            if d not in DTYPE_BYTES:
                raise ValueError(f"{where}: unknown dtype {e.get('dtype')!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
            for key in ("in_msg_size", "out_msg_size"):
                if e.get(key) is not None and not _is_count(e[key]):
                    raise ValueError(f"{where}: {key} must be an integer >= 0, got {_short(e[key])}")
            for key in ("world_size", "src_rank", "dst_rank"):
                if e.get(key) is not None and not _is_count(e[key]):
                    raise ValueError(f"{where}: {key} must be an integer >= 0, got {_short(e[key])}")
            for key in ("in_split", "out_split", "global_ranks", "groupRanks"):
                v = e.get(key)
                if v is None:
                    continue
                if not isinstance(v, list):
                    raise ValueError(f"{where}: {key} must be a list of non-negative integers, got {_short(v)}")
                if not all(_is_count(x) for x in v):
                    raise ValueError(f"{where}: {key} must be non-negative integers, got {_short(v)}")
            group = e.get("global_ranks") or e.get("groupRanks") or ()
            n = len(group) or int(e.get("world_size") or 0)
            if name in ("all_to_allv", "all_to_all") and n and e.get("in_split") and len(e["in_split"]) != n:
                raise ValueError(f"{where}: in_split has {len(e['in_split'])} entries for a group of {n} ranks")
            pg = e.get("pg_id")
            if pg is not None and (isinstance(pg, bool) or not isinstance(pg, (int, str))):
                raise ValueError(f"{where}: pg_id must be an integer, got {_short(pg)}")
            t = e.get("startTime_ns")
            if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not np.isfinite(t)):
                raise ValueError(f"{where}: startTime_ns must be a number, got {_short(t)}")
            if name == "send" and e.get("dst_rank") is None:
                raise ValueError(f"{where}: a send needs its dst_rank")
            for key in _TIMELINE_INTS:
                if e.get(key) is not None and not (_is_count(e[key]) and isinstance(e[key], int)):
                    raise ValueError(f"{where}: {key} must be an integer >= 0, got {_short(e[key])}")
            if e.get("async") is not None and not isinstance(e["async"], bool):
                raise ValueError(f"{where}: async must be true or false, got {_short(e['async'])}")


# the rank-timeline fields neo_train.comm.trace writes (its TIMELINE_FIELDS)
_TIMELINE_INTS = ("order", "compute_ns", "call_ns", "issue_ns", "step", "step_start_ns", "wait_order",
                  "wait_compute_ns", "wait_ns", "wait_step", "wait_step_start_ns")


def _comm_name(e: Mapping[str, Any]) -> str:
    c = str(e.get("comms", "")).lower()
    return _ALIASES.get(c, c)


def _dtype_bytes(e: Mapping[str, Any]) -> int:
    d = str(e.get("dtype", "float")).lower().replace("torch.", "")
    if d not in DTYPE_BYTES:
        raise ValueError(f"trace: unknown dtype {e.get('dtype')!r} (known: {sorted(DTYPE_BYTES)})")
    return DTYPE_BYTES[d]


def _phase(e: Mapping[str, Any]) -> str:
    m = e.get("markers", e.get("markerStack"))
    if isinstance(m, list) and m:
        return str(m[-1])
    return str(m) if m else "trace"


def trace_phases(traces: Mapping[int, list], devices_per_host: int, compute: Mapping[str, float] | None = None, *,
                 allreduce: str = "ring", default_compute: float = 0.0) -> list[Phase]:
    """The trace as a chain of Compute and Comm phases (see the module docstring). ``compute``
    names phase markers of the trace (``trace_markers``); a name the trace lacks is a ValueError."""
    G = devices_per_host
    world = trace_world_size(traces)
    one_trace = len(traces) == 1 and world > 1
    ordered = _matched(traces)
    check_compute_markers([_phase(by_rank[min(by_rank)]) for _, by_rank in ordered], compute or {})
    phases: list[Phase] = []
    last: tuple[str, ...] = ()
    current = None
    for n, ((pg, k), by_rank) in enumerate(ordered):
        e0 = by_rank[min(by_rank)]
        ph = _phase(e0)
        if ph != current:
            current = ph
            sec = (compute or {}).get(ph, default_compute)
            nm = f"compute:{ph}:{n}"
            phases.append(Compute(nm, float(sec), last))
            last = (nm,)
        comm = _collective(f"{_comm_name(e0)}:{ph}:{n}", by_rank, world, G, one_trace, allreduce, last)
        phases.append(comm)
        last = (comm.name,)
    return phases


def trace_markers(traces: Mapping[int, list]) -> list[str]:
    """The phase markers of the trace's collectives, in schedule order, each once: the names
    ``trace_phases``' ``compute`` (``neo-train simulate --compute``) takes. neo_train's own traces
    (``neo_train.comm.trace``) carry the collective's tag: input_dist, output_dist,
    output_dist_bwd, dense_allreduce, metrics, config_check, ..."""
    return list(dict.fromkeys(_phase(by_rank[min(by_rank)]) for _, by_rank in _matched(traces)))


def check_compute_markers(markers: Sequence[str], compute: Mapping[str, float], what: str = "compute") -> None:
    """ValueError (one line) when ``compute`` names a marker not in ``markers``: such seconds would
    silently go nowhere."""
    known = list(dict.fromkeys(markers))
    unknown = [k for k in compute if k not in known]
    if unknown:
        raise ValueError(f"{what}: the trace has no phase marker(s) {', '.join(map(repr, unknown))}; its markers are "
                         f"{', '.join(known) or '(none)'}")


def _matched(traces: Mapping[int, list]) -> list[tuple[tuple[Any, int], dict[int, dict]]]:
    """The trace's collectives matched across ranks, in schedule order: ((group, k), {rank: entry})."""
    check_trace(traces)
    # per rank: its collectives, numbered within their process group
    colls: dict[tuple[Any, int], dict[int, dict]] = {}
    for rank, entries in traces.items():
        seen: dict[Any, int] = {}
        for pos, e in enumerate(entries):
            name = _comm_name(e)
            if name in _SKIP or "compute" in e and "comms" not in e:
                continue
            if name not in SUPPORTED_COMMS:
                raise ValueError(f"trace rank {rank} entry {pos}: unsupported collective {e.get('comms')!r} "
                                 f"(supported: {SUPPORTED_COMMS})")
            # a process group is its id and its ranks; a send is its own rank's op
            pg = (e.get("pg_id", 0), tuple(e.get("global_ranks") or ())) if name != "send" else ("send", rank)
            k = seen.get(pg, 0)
            seen[pg] = k + 1
            colls.setdefault((pg, k), {})[rank] = dict(e, _pos=pos)
    if not colls:
        raise ValueError("trace holds no collectives")

    def when(item: tuple[tuple[Any, int], dict[int, dict]]) -> tuple[float, float]:
        starts = [e["startTime_ns"] for e in item[1].values() if e.get("startTime_ns") is not None]
        pos = np.mean([e["_pos"] for e in item[1].values()])
        return (float(np.mean(starts)) if starts else float(pos), float(pos))

    return sorted(colls.items(), key=when)


def trace_world_size(traces: Mapping[int, list]) -> int:
    """Ranks the trace spans: the largest world_size or global rank it names."""
    check_trace(traces)
    world = max((int(e.get("world_size", 0) or 0) for es in traces.values() for e in es), default=0)
    ranks = [int(r) for es in traces.values() for e in es for r in (e.get("global_ranks") or ())]
    ranks += [int(e[k]) for es in traces.values() for e in es for k in ("src_rank", "dst_rank")
              if _comm_name(e) == "send" and e.get(k) is not None]
    return max([world, max(traces) + 1] + [r + 1 for r in ranks])


def _group(e: Mapping[str, Any], world: int) -> list[int]:
    ranks = e.get("global_ranks") or e.get("groupRanks")
    if ranks:
        return [int(r) for r in ranks]
    return list(range(int(e.get("world_size") or world)))


def _collective(name: str, by_rank: Mapping[int, dict], world: int, G: int, one_trace: bool, allreduce: str,
                after: tuple[str, ...]) -> Comm:
    e0 = by_rank[min(by_rank)]
    kind = _comm_name(e0)
    size = _dtype_bytes(e0)
    group = _group(e0, world)
    hosts = sorted({r // G for r in group})
    H = max(r // G for r in group) + 1
    if kind in ("all_to_allv", "all_to_all"):
        M = np.zeros((H, H))
        for i, r in enumerate(group):
            e = e0 if one_trace else by_rank.get(r)
            if e is None:
                raise ValueError(f"trace: collective {name} has no entry for rank {r} of its group")
            split = e.get("in_split") or []
            if not split:
                split = [int(e.get("in_msg_size") or 0) // len(group)] * len(group)
            if len(split) != len(group):
                rr = min(by_rank) if one_trace else r
                raise ValueError(f"trace rank {rr} entry {e.get('_pos')} ({name}): in_split has {len(split)} entries "
                                 f"for a group of {len(group)}")
            for j, cnt in enumerate(split):
                M[r // G, group[j] // G] += float(cnt) * size
        i, j = np.nonzero(M)
        return Comm(name, (Transfer(i, j, M[i, j]),), after, "all_to_all", "direct", float(M.sum()))
    S = float(e0.get("in_msg_size") or 0) * size
    if kind == "all_reduce":
        if len(hosts) == 1:
            g = len(group)
            rounds = (Transfer([hosts[0]], [hosts[0]], [2.0 * (g - 1) * S]),) if g > 1 and S > 0 else ()
            return Comm(name, rounds, after, "all_reduce", "ring", S)
        per_host = max(1, len(group) // len(hosts))
        c = all_reduce(allreduce, hosts, S, name=name, after=after, devices_per_host=per_host)
        return c
    if kind in ("all_gather", "reduce_scatter"):
        uneven = e0.get("out_split" if kind == "all_gather" else "in_split") or []
        if uneven:  # per-rank sizes of an uneven collective (neo_train.comm.trace writes them)
            total = float(sum(uneven)) * size
        else:
            total = S * len(group) if kind == "all_gather" else S
        return ring_all_gather(hosts, total, name=name, after=after, collective=kind)
    if kind == "broadcast":
        h = np.asarray(hosts)
        rounds = (Transfer(h[:-1], h[1:], np.full(h.size - 1, S)),) if h.size > 1 and S > 0 else ()
        return Comm(name, rounds, after, "broadcast", "pipeline", S)
    # send: point to point
    src = int(e0["src_rank"]) if e0.get("src_rank") is not None else min(by_rank)
    dst = int(e0["dst_rank"])
    return Comm(name, (Transfer([src // G], [dst // G], [S]),), after, "p2p", "send", S)


# ---- per-rank chains: the ranks' recorded timelines ------------------------------------------------

@dataclass(frozen=True)
class Block:
    """An interval in which rank ``rank`` blocked on communication, and the compute before it."""

    rank: int
    order: int
    kind: str
    """'call' (inside a collective call) or 'wait' (joining async collectives)."""
    compute: float
    """Seconds of compute between the previous block's end and this one's start."""
    blocked: float
    """Seconds it lasted in the run."""
    step: int | None
    """The training step in progress (None outside the loop)."""
    step_lead: float | None
    """A step began this many seconds before the block (None: no step began since the last)."""
    colls: tuple
    """Keys ((pg_id, ranks), k) of the collectives it issued (one) or joined."""
    sync: bool
    """A call that blocked until its collective ended."""
    pos: int
    """Index of its (first) entry in the rank's file."""
    issue: float | None = None
    """An asynchronous launch: seconds into it that the collective was handed to the transport
    (the trace's ``issue_ns``), from when it can progress; None: not recorded (its end)."""

    @property
    def starts_at(self) -> float:
        """Seconds into the call at which its collective can start: 0 for a blocking call, else the
        issue, or without one the whole launch (``timeline_phases``)."""
        return 0.0 if self.sync else self.blocked if self.issue is None else self.issue


def has_recorded_compute(traces: Mapping[int, list]) -> bool:
    """Whether the trace carries its ranks' timelines (neo_train's tracer: ``order``, ``call_ns``)."""
    return any(isinstance(e, dict) and "order" in e and "call_ns" in e for es in traces.values() for e in es)


def trace_transports(traces: Mapping[int, list]) -> list[str]:
    """The transports (``backend``: gloo, nccl) the trace's entries name, each once."""
    return sorted({str(e["backend"]) for es in traces.values() for e in es if isinstance(e, dict) and e.get("backend")})


def _coll_key(e: Mapping[str, Any]) -> tuple:
    return (e.get("pg_id", 0), tuple(e.get("global_ranks") or e.get("groupRanks") or ()))


def rank_timelines(traces: Mapping[int, list]) -> tuple[dict[int, list[Block]], dict[tuple, dict[int, dict]]]:
    """({rank: its blocks in order}, {collective key: {rank: entry}}) of a trace with recorded
    timelines. Collectives (barriers included) are matched as in ``trace_phases``: the k-th of a
    process group on every rank. ValueError naming the file, rank, entry and field when a rank
    lacks the timeline fields or they contradict each other."""
    check_trace(traces)
    files = getattr(traces, "files", {})
    if getattr(traces, "one_file", False) and trace_world_size(traces) > 1:
        raise ValueError(f"trace {files.get(0, '')}: one list for every rank (param's --use-one-trace) has no per-rank "
                         f"compute to replay; give --compute marker=seconds")
    blocks: dict[int, list[Block]] = {}
    colls: dict[tuple, dict[int, dict]] = {}
    for rank, entries in sorted(traces.items()):
        src = f"trace {files[rank]} rank {rank}" if rank in files else f"trace rank {rank}"
        seen: dict[tuple, int] = {}
        mine: list[Block] = []
        waits: dict[int, list[tuple[int, dict, tuple]]] = {}
        for pos, e in enumerate(entries):
            name = _comm_name(e)
            if name in _SKIP and name != "barrier" or "compute" in e and "comms" not in e:
                continue
            where = f"{src} entry {pos} ({e.get('comms')})"
            for key in ("order", "call_ns"):
                if e.get(key) is None:
                    raise ValueError(f"{where}: no recorded timeline (field '{key}' missing); record the run with "
                                     f"neo_train's tracer (neo-train train --trace-dir), or give --compute "
                                     f"marker=seconds")
            if e.get("compute_ns") is None and e["order"] != 0:
                raise ValueError(f"{where}: field 'compute_ns' is missing (only the first blocking interval, order 0, "
                                 f"may lack it)")
            pg = _coll_key(e)
            k = seen.get(pg, 0)
            seen[pg] = k + 1
            key = (pg, k)
            colls.setdefault(key, {})[rank] = dict(e, _pos=pos)
            sync = not e.get("async", False)
            issue = e.get("issue_ns")
            if issue is not None and (sync or issue > e["call_ns"]):
                raise ValueError(f"{where}: field 'issue_ns' ({issue}) " + ("on a blocking call (async is false)" if sync
                                 else f"exceeds the launch's call_ns ({e['call_ns']})"))
            mine.append(Block(rank, int(e["order"]), "call", (e.get("compute_ns") or 0) / 1e9, e["call_ns"] / 1e9,
                              e.get("step"), _lead(e.get("step_start_ns")), (key,), sync, pos,
                              None if issue is None else issue / 1e9))
            if e.get("wait_order") is not None:
                if sync:
                    raise ValueError(f"{where}: field 'wait_order' on a blocking call (async is false)")
                for f in ("wait_ns", "wait_compute_ns"):
                    if e.get(f) is None:
                        raise ValueError(f"{where}: field '{f}' missing beside 'wait_order'")
                waits.setdefault(int(e["wait_order"]), []).append((pos, e, key))
        for order, items in waits.items():
            pos, e, _ = items[0]
            for p2, e2, _ in items[1:]:
                if (e2["wait_ns"], e2["wait_compute_ns"]) != (e["wait_ns"], e["wait_compute_ns"]):
                    raise ValueError(f"{src} entry {p2} ({e2.get('comms')}): its wait (wait_order {order}) disagrees "
                                     f"with entry {pos}'s: wait_ns/wait_compute_ns {e2['wait_ns']}/"
                                     f"{e2['wait_compute_ns']} vs {e['wait_ns']}/{e['wait_compute_ns']}")
            mine.append(Block(rank, order, "wait", e["wait_compute_ns"] / 1e9, e["wait_ns"] / 1e9, e.get("wait_step"),
                              _lead(e.get("wait_step_start_ns")), tuple(k for _, _, k in items), False, pos))
        mine.sort(key=lambda b: b.order)
        for a, b in zip(mine, mine[1:]):
            if a.order == b.order:
                raise ValueError(f"{src} entries {a.pos} and {b.pos}: two blocking intervals share order {a.order} "
                                 f"(field 'order' / 'wait_order')")
        blocks[rank] = mine
    for key, by_rank in colls.items():
        e0 = by_rank[min(by_rank)]
        group = _group(e0, trace_world_size(traces)) if _coll_key(e0)[1] else sorted(by_rank)
        missing = [r for r in group if r not in by_rank and r in traces]
        if missing:
            raise ValueError(f"trace: collective #{key[1]} of process group {key[0][0]} ({e0.get('comms')}, "
                             f"{_phase(e0)}) has no entry on rank(s) {missing} of its group {group}: the ranks' "
                             f"traces disagree")
    return blocks, colls


def _lead(ns: Any) -> float | None:
    return None if ns is None else float(ns) / 1e9


def trace_duties(traces: Mapping[int, list], warmup_steps: int = 0) -> tuple[float, float, dict[str, float]]:
    """(gap, overlap, overlap per kind) in seconds over the steps from ``warmup_steps`` on, every
    rank, from one pass over the ranks' timelines: the mean compute between two blocking
    intervals (the busy calibration's compute bursts, ``--busy-ms``); the mean compute between an
    asynchronous collective's launch and its wait (what the ranks compute while it is in flight,
    ``--overlap-ms``); and that overlap per collective kind (DDP's gradient buckets, all_reduce,
    stay in flight under the rest of the backward, the next batch's ids, all_to_allv, under a
    forward). 0.0 (an empty mapping) where the trace has none."""
    return trace_load(traces, warmup_steps)[:3]


def trace_load(traces: Mapping[int, list], warmup_steps: int = 0) -> tuple[float, float, dict[str, float], float]:
    """``trace_duties`` and ``trace_compute_share`` together, from one reading of the timelines."""
    gaps, overlaps, shares = _duty(traces, warmup_steps)
    every = [x for xs in overlaps.values() for x in xs]
    return _mean(gaps), _mean(every), {k: _mean(xs) for k, xs in sorted(overlaps.items())}, _mean(shares)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _duty(traces: Mapping[int, list], warmup_steps: int) -> tuple[list[float], dict[str, list[float]], list[float]]:
    """The steady steps' compute gaps, per collective kind the compute between each asynchronous
    launch and its wait, and per rank the share of its steady time it computed."""
    blocks, colls = rank_timelines(traces)
    gaps: list[float] = []
    overlaps: dict[str, list[float]] = {}
    shares: list[float] = []
    for rank, bs in blocks.items():
        computed_s = blocked_s = 0.0
        for i, b in enumerate(bs):
            if b.step is None or b.step < warmup_steps:
                continue
            gaps.append(b.compute)
            computed_s += b.compute
            blocked_s += b.blocked
            if b.kind != "call" or b.sync:
                continue
            computed = 0.0
            for later in bs[i + 1:]:
                computed += later.compute
                if later.kind == "wait" and b.colls[0] in later.colls:
                    overlaps.setdefault(_comm_name(colls[b.colls[0]][rank]), []).append(computed)
                    break
        if computed_s + blocked_s > 0:
            shares.append(computed_s / (computed_s + blocked_s))
    return gaps, overlaps, shares


def trace_compute_share(traces: Mapping[int, list], warmup_steps: int = 0) -> float:
    """The share of the steps from ``warmup_steps`` on that a rank spends computing (not in a
    blocking call or a wait), the mean over ranks (0.0 without steps): the load the ranks put on
    their host. On a host whose cores the ranks hold, a collective's threads wait for a core the
    more often the more of the time the ranks compute; a busy calibration reports its own
    (``compute_share`` in its samples) to set beside it."""
    return trace_load(traces, warmup_steps)[3]


# a collective factory: (kind, group, {rank: entry}, name, after) -> (phases, the phase ranks join on),
# or None when the collective crosses no network (a group of one rank: its time is the rank's compute)
CollectiveFactory = Callable[[str, list, Mapping[int, dict], str, tuple], "tuple[list[Phase], str] | None"]
ReturnLags = Callable[[str, list, Mapping[int, dict]], Mapping[int, float]]
"""(kind, group, the entries by rank) of a collective -> {rank: seconds it resumes after the end}."""


@dataclass
class Timeline:
    """The per-rank chains as a schedule, and where each recorded interval sits in it."""

    phases: list[Phase]
    blocks: dict[int, list[Block]]
    nodes: dict[tuple[int, int], tuple[str, str]]
    """(rank, order) -> (the node ending where the block starts, the node ending where it ends)."""
    boundaries: dict[int, list[tuple[int | None, str, Block]]]
    """rank -> [(step that begins, node ending at the boundary, the block after it)]."""
    comm_end: dict[tuple, str]
    """collective key -> the phase whose end is the collective's end."""
    colls: dict[tuple, dict[int, dict]]
    local: set
    """Keys of the collectives that crossed no network (replayed as compute)."""
    comm_start: dict[tuple, str] = field(default_factory=dict)
    """collective key -> its first phase, which starts when the last rank of its group arrives."""


def timeline_phases(traces: Mapping[int, list], factory: CollectiveFactory,
                    return_lags: ReturnLags | None = None, idle: Mapping[tuple, float] | None = None) -> Timeline:
    """Per-rank chains joined at collectives (see the module docstring); ``factory`` turns each
    matched collective into phases (a calibration's latency and fabric transfer, or a topology's).
    ``return_lags`` (e.g. ``trace_sim.calibrated_return_lags``): per collective, the seconds each
    rank resumes after its end when it waited for it, in its blocking call or its wait (default:
    all at once). ``idle``: {collective key: the share of its time its ranks wait idle for it}
    (``trace_sim.idle_shares`` of an earlier simulation), which the factory and ``return_lags``
    see as ``_idle`` in its entries, as they see ``_concurrent``, ``_company`` (``live_company``),
    ``_after`` (``compute_after``) and ``_over`` (``compute_over``), and each rank's entry its place
    in leaving it as ``_leave`` (``leave_order``)."""
    blocks, colls = rank_timelines(traces)
    concurrent = concurrent_collectives(blocks)
    company = live_company(blocks, colls)
    after = compute_after(blocks)
    over = compute_over(blocks, colls)
    leave = leave_order(blocks, colls)
    idle = idle or {}
    lags: dict[tuple, Mapping[int, float]] = {}
    phases: list[Phase] = []
    arrivals: dict[tuple, list[str]] = {}
    world = trace_world_size(traces)
    comm_end: dict[tuple, str] = {}
    local: set = set()
    for key, by_rank in colls.items():
        e0 = by_rank[min(by_rank)]
        kind = _comm_name(e0)
        group = _group(e0, world) if _coll_key(e0)[1] else sorted(by_rank)
        # the factory and the lags see how many others were in flight with it on a rank, its idle
        # share and the compute after and over it
        seen = {f: v for f, v in (("_concurrent", concurrent.get(key)), ("_company", company.get(key)),
                                  ("_idle", idle.get(key)), ("_after", after.get(key)), ("_over", over.get(key))) if v}
        if seen:
            by_rank = {r: dict(e, **seen) for r, e in by_rank.items()}
        if key in leave:  # each rank's place in leaving it (``leave_order``)
            by_rank = {r: dict(e, _leave=leave[key][r]) for r, e in by_rank.items()}
        made = factory(kind, group, by_rank, f"{kind}:{_phase(e0)}:{key[0][0]}:{key[1]}", ())
        if made is None:
            local.add(key)
        else:
            comm_end[key] = made[1]
            arrivals[key] = []
            phases.extend(made[0])
            if return_lags is not None:
                lags[key] = return_lags(kind, group, by_rank)
    nodes: dict[tuple[int, int], tuple[str, str]] = {}
    bounds: dict[int, list] = {}
    for rank, mine in blocks.items():
        prev: tuple[str, ...] = ()
        bounds[rank] = []
        for b in mine:
            c = f"r{rank}:c{b.order}"
            if b.step_lead is not None:
                lead = min(b.step_lead, b.compute)
                phases.append(Compute(c + "a", b.compute - lead, prev))
                bounds[rank].append((b.step, c + "a", b))
                phases.append(Compute(c, lead, (c + "a",)))
            else:
                phases.append(Compute(c, b.compute, prev))
            waits = b.kind == "wait" or b.sync  # the rank waits here for the collectives' ends
            joins = tuple(_resume(phases, rank, k, comm_end[k], lags) for k in b.colls if k not in local) if waits else ()
            end = f"r{rank}:b{b.order}"
            if b.kind == "call" and b.colls[0] in local:
                phases.append(Compute(end, b.blocked, (c,)))  # nothing crossed a network: the rank's work
            elif b.kind == "call" and b.sync:  # a blocking call ends with its collective (and the rank's lag)
                arrivals[b.colls[0]].append(c)
                phases.append(Compute(end, 0.0, (c,) + joins))
            elif b.kind == "call" and b.issue is not None:  # an async launch: the collective starts once
                # handed to the transport, while the rank may still be in its launch (``Block.issue``)
                phases.append(Compute(end + "i", b.issue, (c,)))
                phases.append(Compute(end, b.blocked - b.issue, (end + "i",)))
                arrivals[b.colls[0]].append(end + "i")
            elif b.kind == "call":  # one without the issue recorded: the collective starts once launched
                phases.append(Compute(end, b.blocked, (c,)))
                arrivals[b.colls[0]].append(end)
            elif joins:
                phases.append(Compute(end, 0.0, (c,) + joins))
            else:
                phases.append(Compute(end, b.blocked, (c,)))  # waited on local collectives only
            nodes[(rank, b.order)] = (c, end)
            prev = (end,)
    # every collective's first phases wait for every rank of its group to arrive
    by_name = {p.name: i for i, p in enumerate(phases)}
    comm_start: dict[tuple, str] = {}
    for key, names in arrivals.items():
        first = comm_start[key] = _first_phase(phases, comm_end[key], by_name)
        i = by_name[first]
        p = phases[i]
        phases[i] = Compute(p.name, p.seconds, tuple(names)) if isinstance(p, Compute) else Comm(
            p.name, p.rounds, tuple(names), p.collective, p.algorithm, p.payload)
    return Timeline(phases, blocks, nodes, bounds, comm_end, colls, local, comm_start)


def compute_after(blocks: Mapping[int, Sequence[Block]]) -> dict[tuple, float]:
    """{key: seconds} for the collectives the ranks waited for (a blocking call, or a wait that
    joined it): the compute after that call or wait until the rank's next blocking interval, the
    mean over its ranks (a rank's last block: none). The ranks that return first compute on while
    the others wait for a core to return (``Calibration.lag_after``)."""
    seen: dict[tuple, list[float]] = {}
    for mine in blocks.values():
        for b, nxt in zip(mine, mine[1:]):
            if b.kind == "wait" or b.sync:
                for k in b.colls:
                    seen.setdefault(k, []).append(nxt.compute)
    return {k: sum(v) / len(v) for k, v in seen.items()}


def leave_order(blocks: Mapping[int, Sequence[Block]], colls: Mapping[tuple, Mapping[int, dict]]
                ) -> dict[tuple, dict[int, int]]:
    """{key: {rank: its place in leaving the collective, 0 the first}} for the collectives the
    ranks waited for (a blocking call, or a wait that joined it), by the host's wall clock: each
    call is anchored at its entry's ``startTime_ns`` and the blocks after it follow by their
    recorded compute and length. Only for ranks on the host clock (a CUDA trace's times are the
    stream's, not the wall's); a collective some of whose ranks cannot be placed is left out. In
    the runs the ranks that leave a collective late compute less after it (measured; a scheduler
    that runs a rank that slept first would do that), so the compute replayed after it belongs
    with the order it was recorded in (``trace_sim.calibrated_return_lags``, ``ORDERED_LAGS``)."""
    left: dict[tuple, dict[int, float]] = {}
    for rank, mine in blocks.items():
        wall: float | None = None  # the end of the rank's previous block on the wall clock, seconds
        for b in mine:
            e = colls.get(b.colls[0], {}).get(rank) if b.kind == "call" else None
            if e is not None and e.get("clock") != "cuda" and e.get("startTime_ns") is not None:
                wall = e["startTime_ns"] / 1e9 + b.blocked
            elif wall is not None and b.kind != "call":
                wall += b.compute + b.blocked
            else:
                wall = None
            if wall is not None and (b.kind == "wait" or b.sync):
                for k in b.colls:
                    left.setdefault(k, {})[rank] = wall
    out = {}
    for k, by_rank in left.items():
        if len(by_rank) == len(colls.get(k, {})) and len(by_rank) > 1:
            out[k] = {r: i for i, r in enumerate(sorted(by_rank, key=by_rank.__getitem__))}
    return out


OVER_BLOCKED_SMALLER = 0.5
"""The share of a rank's time blocked in a call of a smaller group than an asynchronous
collective's, made between its launch and its join, that counts as compute over it
(``compute_over``): the call's transport threads take a core as the rank's compute would, about
half of it (``trace_sim.BLOCKED_IDLE``). A one-rank call (a rank's own copy) has no transport and
does not count. W = 4 TWRW's DDP bucket (world) is in flight over each rank's two blocking pair
calls (the cross-node all-to-all and the node-local all-gather of the embedding backward). Counted
as nothing, the bucket came out 17.7 % (pipelined) and 14.3 % (plain) short on average over the
thirteen kept AMD runs FA–FM, one miss (FM, −27.5 %); at this share, −3.0 and +0.6 %, none; in full
(1.0), +11.7 and +15.2 %, two misses. A call of the collective's own group is not counted: at W = 3
TWRW's node-local all-gather is a world call beside the world bucket, and counted at this share the
bucket went from within the goal to +13 % (pipelined) and +25 % (plain) on FM
(notes/sim_validation.md, "2026-11-29, session 35")."""


def compute_over(blocks: Mapping[int, Sequence[Block]], colls: Mapping[tuple, Mapping[int, dict]]
                 ) -> dict[tuple, float]:
    """{key: seconds} for the asynchronous collectives something joined (a wait, or the backward's
    end): the compute between the launch and that join (before each block in between and before
    the join), with ``OVER_BLOCKED_SMALLER`` of the time blocked in calls of a smaller group (of two
    ranks or more, by their matched ranks in ``colls``) in between, the mean over its ranks. The
    longer the ranks compute over it, the later it ends (``Calibration.latency``'s ``over_s``)."""
    seen: dict[tuple, list[float]] = {}
    for mine in blocks.values():
        computed, at_launch, beside = 0.0, {}, {}  # compute so far; at each open launch; its blocked share
        for b in mine:
            computed += b.compute
            if b.kind == "call" and not b.sync:
                at_launch[b.colls[0]] = computed
                beside[b.colls[0]] = 0.0
            elif b.kind == "call":  # a blocking call: the open launches of larger groups count a share of it
                g = len(colls[b.colls[0]])
                for k in at_launch:
                    if 2 <= g < len(colls[k]):  # a one-rank call is the rank's own copy: no transport
                        beside[k] += OVER_BLOCKED_SMALLER * b.blocked
            elif b.kind == "wait":
                for k in b.colls:
                    if k in at_launch:
                        seen.setdefault(k, []).append(computed - at_launch.pop(k) + beside.pop(k))
    return {k: sum(v) / len(v) for k, v in seen.items()}


def concurrent_collectives(blocks: Mapping[int, Sequence[Block]]) -> dict[tuple, int]:
    """{key: company} for the asynchronous collectives that other collectives kept company on some
    rank: how many were issued there (blocking or not) between their launch and their wait, or were
    launched before and waited for after their launch; the most over the ranks. By the recorded
    order alone, not by times: collectives in flight at once share the ranks' cores and the
    transport's threads (a busy calibration measures what one companion adds,
    ``KindFit.concurrent_s``, and ``Calibration.latency`` charges it once). One never waited for
    counts as a point at its launch."""
    out: dict[tuple, int] = {}
    for mine in blocks.values():
        items = sorted(_spans(mine).items(), key=lambda kv: kv[1][0])  # by launch (orders are distinct on a rank)
        open_ends: list[int] = []  # ends of the spans before that may still be open
        for i, (k, (a, w)) in enumerate(items):
            open_ends = [e for e in open_ends if e > a]  # those launched before and waited for after a
            if a != w:
                n = len(open_ends)
                for _, (a2, _) in items[i + 1:]:  # those launched after, before w
                    if a2 >= w:
                        break
                    n += 1
                if n:
                    out[k] = max(out.get(k, 0), n)
            open_ends.append(w)
    return out


def _spans(mine: Sequence[Block]) -> dict[tuple, list[int]]:
    """{key: [launch order, wait order]} of one rank's collectives; a blocking call, or one never
    waited for, is one point at its launch."""
    spans: dict[tuple, list[int]] = {}
    for b in mine:
        if b.kind == "call":
            spans[b.colls[0]] = [b.order, b.order]
        else:
            for k in b.colls:
                if k in spans:
                    spans[k][1] = b.order
    return spans


COMPANY_LARGER_GROUP_ONLY = ("all_reduce",)
"""Kinds of live asynchronous collective whose company reaches a blocking call only where the call's
group is smaller than theirs (``live_company``). The company an all-reduce adds to a call of its
own ranks is real (session 29 measured +0.2 to +0.9 ms at W = 3 beside a 128 KB all-gather), but the
model already carries it there: charged on top, it lengthened W = 2, 3 TWRW's node-local all-gather
in the backward by about as much (+7 to +18 % on average over twelve runs, -2 to +5 % without). An
all-to-all's company on a call of its own group (the next batch's ids beside W = 2, 3 TWRW pipelined's
node-local all-to-all) is kept: without it that row came out 11 % short on average (session 34)."""


def live_company(blocks: Mapping[int, Sequence[Block]], colls: Mapping[tuple, Mapping[int, dict]]
                 ) -> dict[tuple, tuple[str, int]]:
    """{key: (kind, group size)} for the blocking calls made on some rank while an asynchronous
    collective of that rank was in flight (launched before the call, joined after it) and *live*:
    every rank of its group known, by the recorded order, to have launched it by the time the call
    ends. A collective completes on a rank only once all its ranks have issued it, so what a rank
    knows grows through the collectives it completes (happens-before, ``_known_launches``). A
    collective whose ranks have not all launched it waits for the late ones and takes no core; once
    they all have, its transport threads take the cores the blocking call needs on a host the ranks
    crowd (``Calibration.company``). Where several are live, the one of the largest group; one never
    joined counts as a point at its launch, as in ``concurrent_collectives``. W = 4 TWRW's
    node-local all-gather in the backward, called with DDP's bucket live, was 16 - 33 % short in
    every run without it, while the cross-node all-to-all before it, with the bucket not yet
    launched on the other node, was right (notes/sim_validation.md, "2026-11-28, session 29").
    An all-reduce (``COMPANY_LARGER_GROUP_ONLY``) is company only for a call of a smaller group
    than its own: at W = 2, 3 TWRW's node-local all-gather in the backward is a world call beside
    DDP's world bucket, and with the charge it came out 7 - 18 % long on average over twelve runs,
    without it -2 to +5 % (notes/sim_validation.md, "2026-11-29, session 34")."""
    known = _known_launches(blocks, colls)
    spans = {rank: _spans(mine) for rank, mine in blocks.items()}
    out: dict[tuple, tuple[str, int]] = {}
    for rank, mine in blocks.items():
        in_flight: dict[tuple, int] = {}  # launched before, not yet joined: key -> its join's order
        for b in mine:
            if b.kind != "call":
                continue
            k = b.colls[0]
            in_flight = {j: w for j, w in in_flight.items() if w > b.order}
            launch, join = spans[rank][k]
            if not b.sync:
                if join > launch:
                    in_flight[k] = join
                continue
            now = known.get((rank, b.order))
            if now is None or len(colls[k]) < 2:  # the orders never let it complete; a rank's own copy
                continue
            live = [(len(colls[j]), _comm_name(colls[j][min(colls[j])])) for j in in_flight
                    if all(now.get(r, -1) >= spans[r][j][0] for r in colls[j])]
            live = [(g, kind) for g, kind in live if g > len(colls[k]) or kind not in COMPANY_LARGER_GROUP_ONLY]
            if live:
                g, kind = max(live)
                if g > out.get(k, ("", 0))[1]:
                    out[k] = (kind, g)
    return out


def _known_launches(blocks: Mapping[int, Sequence[Block]], colls: Mapping[tuple, Mapping[int, dict]]
                    ) -> dict[tuple[int, int], dict[int, int]]:
    """{(rank, order of one of its blocking calls): {rank r: the latest order of r's blocks known on
    the first rank, when that call ends, to have begun}}: the ranks advance block by block, a
    blocking call or a wait only once every rank of its collectives has issued them, and then knows
    what each of those ranks knew when it issued them (vector clocks over the recorded order). Kept
    for the blocking calls only, the blocks ``live_company`` asks about."""
    ranks = sorted(blocks)
    at = {r: 0 for r in ranks}
    clock: dict[int, dict[int, int]] = {r: {} for r in ranks}
    issued: dict[tuple, dict[int, dict[int, int]]] = {}  # key -> {rank: its clock at the launch}
    out: dict[tuple[int, int], dict[int, int]] = {}
    moved = True
    while moved:
        moved = False
        for r in ranks:
            mine = blocks[r]
            while at[r] < len(mine):
                b = mine[at[r]]
                if b.kind == "call" and r not in issued.get(b.colls[0], {}):
                    issued.setdefault(b.colls[0], {})[r] = {**clock[r], r: b.order}
                joins = (b.colls[0],) if b.kind == "call" and b.sync else b.colls if b.kind == "wait" else ()
                if any(len(issued.get(k, ())) < len(colls[k]) for k in joins):
                    break  # it waits for a rank that has not issued it yet
                mine_clock = clock[r]
                for k in joins:
                    for theirs in issued[k].values():
                        for s, o in theirs.items():
                            if mine_clock.get(s, -1) < o:
                                mine_clock[s] = o
                mine_clock[r] = b.order
                if b.kind == "call" and b.sync:
                    out[(r, b.order)] = dict(mine_clock)
                at[r] += 1
                moved = True
    return out


def _resume(phases: list[Phase], rank: int, key: tuple, comm_end: str, lags: Mapping[tuple, Mapping[int, float]]) -> str:
    """The node after which ``rank`` can resume from collective ``key``: its end, or a lag after it
    (the rank returns at the later of its own arrival and the end plus its lag)."""
    lag = lags.get(key, {}).get(rank, 0.0)
    if lag <= 0:
        return comm_end
    name = f"lag:r{rank}:{comm_end}"
    phases.append(Compute(name, lag, (comm_end,)))
    return name


def _first_phase(phases: list[Phase], last: str, by_name: Mapping[str, int]) -> str:
    """The root of the factory's little chain that ends at ``last``."""
    name = last
    while phases[by_name[name]].after:
        (name,) = phases[by_name[name]].after
    return name


def network_collectives(world: int, devices_per_host: int, allreduce: str = "ring") -> CollectiveFactory:
    """A ``timeline_phases`` factory for a topology: each collective as ``trace_phases`` builds it
    (rank r on host r // devices_per_host), no added latency (the network's hops carry it)."""

    def make(kind: str, group: list, by_rank: Mapping[int, dict], name: str, after: tuple):
        if len(group) < 2:
            return None
        if kind == "barrier":
            c = Comm(name, (), after, "barrier", "", 0.0)
        else:
            c = _collective(name, by_rank, world, devices_per_host, False, allreduce, after)
        return [c], c.name

    return make
