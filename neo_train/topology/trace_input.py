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
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .collectives import all_reduce, ring_all_gather
from .simulator import Comm, Compute, Phase, Transfer

__all__ = ["load_trace", "check_trace", "trace_phases", "trace_world_size", "trace_markers", "check_compute_markers",
           "DTYPE_BYTES", "SUPPORTED_COMMS"]

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
        return _Checked(out)
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
    return _Checked(out)


class _Checked(dict):
    """{rank: entries} as ``load_trace`` returns it, already checked (the schedule functions skip
    checking it again: a long trace takes about a second per 200k entries)."""


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
