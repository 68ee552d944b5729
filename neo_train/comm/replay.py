"""Replay recorded comms traces on a real process group, with any collective algorithm.

    neo-train replay traces/ --rules "all_to_all_v:bruck, all_reduce:ring"    # W = number of files

Every rank replays its own trace (traces[rank]): the same collectives on the same process groups
with the same sizes and dtypes, filled with random data, back to back (no compute in between),
and reports each one's time next to the recorded one. Groups are recreated from the traces'
``pg_id``/``global_ranks`` (the union over all ranks' files, in pg_id order, so every rank
creates them alike); the lowest-numbered group spanning every rank is the communicator given.

``replay_command`` runs under torchrun (one process per trace file: RANK/WORLD_SIZE in the
environment) or, outside torchrun, spawns one local gloo process per trace file itself with
``neo_train.comm.spawn.run_ranks`` (CPU; fine for checking and comparing algorithms on one host).
Before anything runs, the traces are checked against each other (the same collectives in the same
order on each group's members, all-to-all splits that match between sender and receiver), so a
bad set of traces is an error naming the file and entry, not a hang.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from .interface import Communicator
from .trace import TraceError, load_trace, torch_dtype

__all__ = ["replay", "ReplayReport", "ReplayRow", "check_traces", "resolve_traces", "replay_command"]


@dataclass
class ReplayRow:
    index: int
    comms: str
    pg_id: int
    phase: str
    bytes: int  # bytes this rank sends in (input tensor)
    algorithm: str
    recorded_us: float | None
    replayed_us: float


@dataclass
class ReplayReport:
    rank: int
    rules: str
    rows: list[ReplayRow] = field(default_factory=list)

    def by_phase(self) -> dict[str, dict[str, float]]:
        """{phase: {calls, bytes, recorded_us, replayed_us}} (recorded sums only entries with a time)."""
        out: dict[str, dict[str, float]] = {}
        for r in self.rows:
            d = out.setdefault(r.phase, {"calls": 0, "bytes": 0, "recorded_us": 0.0, "replayed_us": 0.0})
            d["calls"] += 1
            d["bytes"] += r.bytes
            d["recorded_us"] += r.recorded_us or 0.0
            d["replayed_us"] += r.replayed_us
        return out

    def table(self, per_op: bool = False) -> str:
        lines = [f"replay of rank {self.rank}'s trace, rules: {self.rules or 'native'}"]
        if per_op:
            lines.append(f"{'#':>4} {'collective':<15} {'pg':>3} {'phase':<22} {'bytes':>10} {'algorithm':<17} {'recorded us':>12} {'replayed us':>12}")
            for r in self.rows:
                rec = f"{r.recorded_us:12.1f}" if r.recorded_us is not None else f"{'-':>12}"
                lines.append(f"{r.index:>4} {r.comms:<15} {r.pg_id:>3} {r.phase:<22} {r.bytes:>10} {r.algorithm:<17} {rec} {r.replayed_us:12.1f}")
        lines.append(f"{'phase':<24} {'calls':>6} {'bytes':>12} {'recorded us':>12} {'replayed us':>12} {'ratio':>6}")
        tot = {"calls": 0, "bytes": 0, "recorded_us": 0.0, "replayed_us": 0.0}
        for phase, d in sorted(self.by_phase().items()):
            ratio = d["replayed_us"] / d["recorded_us"] if d["recorded_us"] else float("nan")
            lines.append(f"{phase:<24} {d['calls']:>6} {d['bytes']:>12} {d['recorded_us']:12.1f} {d['replayed_us']:12.1f} {ratio:6.2f}")
            for k in tot:
                tot[k] += d[k]
        ratio = tot["replayed_us"] / tot["recorded_us"] if tot["recorded_us"] else float("nan")
        lines.append(f"{'total':<24} {tot['calls']:>6} {tot['bytes']:>12} {tot['recorded_us']:12.1f} {tot['replayed_us']:12.1f} {ratio:6.2f}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "rules": self.rules, "rows": [asdict(r) for r in self.rows], "by_phase": self.by_phase()}


def resolve_traces(paths: Sequence[str | Path]) -> list[Path]:
    """Trace files in rank order: the files given, or one directory's trace_rank{r}.json."""
    ps = [Path(p) for p in paths]
    if len(ps) == 1 and ps[0].is_dir():
        found = sorted(ps[0].glob("trace_rank*.json"), key=lambda p: int(p.stem.removeprefix("trace_rank") or -1))
        if not found:
            raise TraceError(f"{ps[0]}: no trace_rank*.json files")
        ranks = [int(p.stem.removeprefix("trace_rank")) for p in found]
        if ranks != list(range(len(found))):
            raise TraceError(f"{ps[0]}: trace files for ranks {ranks}, expected 0..{len(found) - 1}")
        return found
    for p in ps:
        if p.is_dir():
            raise TraceError(f"{p} is a directory: give one directory of trace_rank*.json files, or per-rank trace "
                             f"files in rank order")
    return ps


def check_traces(traces: Sequence[list[dict]], names: Sequence[str] | None = None) -> dict[int, list[int]]:
    """Check per-rank traces against each other; return {pg_id: global ranks}.

    On every process group, each member must record the same collectives in the same order with
    matching sizes (all-to-all: what i sends j is what j expects from i)."""
    W = len(traces)
    names = list(names) if names is not None else [f"rank {r}" for r in range(W)]
    groups: dict[int, list[int]] = {}
    per_pg: dict[int, dict[int, list[tuple[int, dict]]]] = {}
    for r, entries in enumerate(traces):
        for i, e in enumerate(entries):
            pg, ranks = e["pg_id"], e["global_ranks"]
            if groups.setdefault(pg, ranks) != ranks:
                raise TraceError(f"{names[r]}: entry {i}: process group {pg} has ranks {ranks}, another file says {groups[pg]}")
            if r not in ranks:
                raise TraceError(f"{names[r]}: entry {i}: recorded on group {pg} {ranks}, which does not hold rank {r}")
            if max(ranks) >= W:
                raise TraceError(f"{names[r]}: entry {i}: group {pg} names rank {max(ranks)} but there are {W} trace files")
            per_pg.setdefault(pg, {}).setdefault(r, []).append((i, e))
    for pg, members in per_pg.items():
        ranks = groups[pg]
        seqs = [members.get(g, []) for g in ranks]
        lens = [len(s) for s in seqs]
        if len(set(lens)) > 1:
            raise TraceError(f"group {pg} {ranks}: members recorded different numbers of collectives {dict(zip(ranks, lens))}")
        for k in range(lens[0]):
            ents = [s[k] for s in seqs]
            first_i, first = ents[0]
            for g, (i, e) in zip(ranks, ents):
                where = f"{names[g]}: entry {i} ({e['comms']}, #{k} on group {pg})"
                if e["comms"] != first["comms"]:
                    raise TraceError(f"{where}: rank {ranks[0]} has {first['comms']} at that point (its entry {first_i})")
                if e["comms"] != "barrier" and e["dtype"] != first["dtype"]:
                    raise TraceError(f"{where}: field 'dtype' {e['dtype']} differs from rank {ranks[0]}'s {first['dtype']}")
                if e["comms"] == "all_reduce" and e["in_msg_size"] != first["in_msg_size"]:
                    raise TraceError(f"{where}: field 'in_msg_size' {e['in_msg_size']} differs from rank {ranks[0]}'s {first['in_msg_size']}")
                if e["comms"] in ("all_gather", "reduce_scatter"):
                    key = "out_split" if e["comms"] == "all_gather" else "in_split"
                    if e[key] != first[key]:
                        raise TraceError(f"{where}: field '{key}' {e[key]} differs from rank {ranks[0]}'s {first[key]}")
            if first["comms"] == "all_to_allv":
                for a, (ia, ea) in enumerate(ents):
                    for b, (ib, eb) in enumerate(ents):
                        if ea["in_split"][b] != eb["out_split"][a]:
                            raise TraceError(
                                f"{names[ranks[a]]}: entry {ia} (all_to_allv, #{k} on group {pg}): field 'in_split'[{b}] = "
                                f"{ea['in_split'][b]}, but {names[ranks[b]]} entry {ib} expects {eb['out_split'][a]} ('out_split'[{a}])"
                            )
    return groups


def _data(n: int, dtype: torch.dtype, device, g: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype).to(device)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool().to(device)
    return torch.randint(0, 100, (n,), generator=g).to(dtype).to(device)


def _run_one(g: Communicator, e: dict, x: torch.Tensor) -> None:
    c = e["comms"]
    if c == "all_to_allv":
        g.all_to_all_v(x, e["in_split"], e["out_split"])
    elif c == "all_gather":
        g.all_gather_v(x, e["out_split"])
    elif c == "reduce_scatter":
        g.reduce_scatter_v(x, e["in_split"])
    elif c == "all_reduce":
        op = e.get("reduce_op", "sum")
        g.all_reduce(x, op if (op != "avg" or x.dtype.is_floating_point) else "sum")
    else:
        g.barrier()


def replay(
    traces: Sequence[str | Path],
    comm: Communicator,
    algorithm_rules=None,
    *,
    hint=None,
    iters: int = 1,
    seed: int = 0,
) -> ReplayReport:
    """Replay ``traces[comm.rank]`` on ``comm`` (collective: every rank calls it with the same list).

    ``algorithm_rules``: None/'' for the native collectives, else ScheduleCommunicator rules;
    ``hint``: its TopologyHint. Each entry's replayed time is the median over ``iters`` passes.
    """
    from .executor import ScheduleCommunicator, format_rules, parse_rules

    W, rank = comm.world_size, comm.rank
    paths = [Path(p) for p in traces]
    if len(paths) != W:
        raise ValueError(f"replay: {len(paths)} trace files for a world of {W} ranks (one per rank)")
    loaded = [load_trace(p) for p in paths]
    groups = check_traces(loaded, [str(p) for p in paths])
    rules = parse_rules(algorithm_rules)
    comms: dict[int, Communicator] = {}
    world_used = False
    for pg, ranks in sorted(groups.items()):
        if ranks == list(range(W)) and not world_used:
            g: Communicator | None = comm
            world_used = True
        else:
            g = comm.subgroup(ranks, name=f"pg{pg}")  # type: ignore[call-arg]
        if g is not None:
            comms[pg] = ScheduleCommunicator(g, rules, hint=hint) if rules else g
    device = getattr(comm, "device", torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    mine = loaded[rank]
    inputs = [None if e["comms"] == "barrier" else _data(e["in_msg_size"], torch_dtype(e["dtype"]), device, gen) for e in mine]
    times: list[list[float]] = [[] for _ in mine]
    algs = ["native"] * len(mine)
    # one process group after another, each group's ops in recorded order: the training threads
    # (the pipeline's input dist, DDP's hooks) interleave groups differently on different ranks,
    # but within one group every rank issued the same sequence
    order = sorted(range(len(mine)), key=lambda i: (mine[i]["pg_id"], i))
    for _ in range(max(1, iters)):
        for i in order:
            e = mine[i]
            g = comms[e["pg_id"]]
            before = dict(getattr(g, "stats", {}))
            x = inputs[i]
            x = x.clone() if x is not None and e["comms"] == "all_reduce" else x  # all-reduce is in place
            t0 = time.perf_counter()
            _run_one(g, e, x)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[i].append((time.perf_counter() - t0) * 1e6)
            after = getattr(g, "stats", {})
            used = [k[1] for k, v in after.items() if v != before.get(k, 0)]
            algs[i] = used[0] if used else "native"
    report = ReplayReport(rank, format_rules(rules) if rules else "")
    for i, e in enumerate(mine):
        dt = torch_dtype(e["dtype"]) if e["comms"] != "barrier" else torch.uint8
        nbytes = (e.get("in_msg_size") or 0) * torch.empty(0, dtype=dt).element_size()
        rec = e.get("duration_ns")
        report.rows.append(
            ReplayRow(i, e["comms"], e["pg_id"], (e["markers"] or [""])[-1], nbytes, algs[i],
                      None if rec is None else rec / 1e3, statistics.median(times[i]))
        )
    return report


# ---- the CLI entry point ------------------------------------------------------------------------
def _hint(args: argparse.Namespace):
    from .schedules import TopologyHint
    from .schedules.rules import parse_bytes

    lws = args.local_world_size or (int(os.environ["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in os.environ else None)
    try:
        bulk = int(parse_bytes(str(args.bulk_threshold)))
    except ValueError:
        raise ValueError(f"--bulk-threshold: cannot read size {args.bulk_threshold!r} (e.g. 0, 65536, 64KB, 15MB)") from None
    return TopologyHint(local_world_size=lws, hosts_per_rack=args.hosts_per_rack, bulk_threshold_bytes=bulk)


def _check_json_out(path: str) -> None:
    """``--json``: a file path in an existing, writable directory (checked before replaying)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--json {path} is a directory; give a file path")
    parent = p.parent
    if not parent.is_dir():
        raise ValueError(f"--json {path}: directory {parent} does not exist")
    if not os.access(p if p.exists() else parent, os.W_OK):
        raise ValueError(f"--json {path} is not writable")


def _replay_rank(comm: Communicator, paths: list[str], rules: str, hint, iters: int) -> dict:
    return replay(paths, comm, rules, hint=hint, iters=iters).to_dict()


def replay_command(args: argparse.Namespace) -> int:
    """``neo-train replay``: under torchrun each process replays its rank's file; otherwise one
    local gloo process per file is spawned here. Rank 0 prints its report; --json gets all."""
    from .schedules.rules import parse_rules

    paths = [str(p) for p in resolve_traces(args.traces)]
    parse_rules(args.rules)  # fail on bad rules before starting processes
    if args.json:
        _check_json_out(args.json)
    if "RANK" not in os.environ:  # bad trace files: one error line here, not one per rank
        check_traces([load_trace(p) for p in paths], paths)
    hint = _hint(args)  # a bad --bulk-threshold: said before starting processes
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        from .native import init_distributed

        comm = init_distributed(timeout_s=args.timeout_s)
        assert comm is not None
        report = replay(paths, comm, args.rules, hint=hint, iters=args.iters)
        gathered = [report.to_dict()]
        if comm.world_size > 1:
            import torch.distributed as dist

            everyone: list[Any] = [None] * comm.world_size
            dist.all_gather_object(everyone, report.to_dict())
            gathered = everyone
        if comm.rank == 0:
            print(report.table(args.per_op))
            if args.json:
                Path(args.json).write_text(json.dumps(gathered, indent=1))
        return 0
    from .spawn import run_ranks

    W = len(paths)
    lws = hint.local_world_size if hint.local_world_size and W % hint.local_world_size == 0 else None
    results = run_ranks(_replay_rank, W, paths, args.rules, hint, args.iters, local_world_size=lws,
                        collective_timeout_s=args.timeout_s, timeout_s=max(600.0, 4 * args.timeout_s))
    r0 = results[0]
    report = ReplayReport(0, r0["rules"], [ReplayRow(**row) for row in r0["rows"]])
    print(report.table(args.per_op))
    for res in results[1:]:
        tot = sum(row["replayed_us"] for row in res["rows"])
        print(f"rank {res['rank']}: {len(res['rows'])} collectives, {tot:.1f} us replayed")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0
