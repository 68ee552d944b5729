"""Executor overhead: every scheduled collective algorithm against the native gloo collective, and
the cost of tracing.

    python benchmarks/collectives.py                 # W in {2, 4}, 1 KB .. 4 MB per peer
    python benchmarks/collectives.py --quick         # W = 2, three sizes, few iterations
    python benchmarks/collectives.py --json out.json --png out.png   # + time vs size per (op, W)

All-to-all rows: every rank sends ``size`` bytes to every peer (float32), i.e. the all_to_all_v of
a (W * size/4,) tensor with equal splits; native = ``dist.all_to_all_single``. All-reduce rows:
a tensor of W * size bytes (the same bytes per rank as the all-to-all); native = ``dist.all_reduce``.

Bytes moved per rank (the figure the GB/s column divides by the time):
    all-to-all:  (W - 1) * size                     (what one rank sends; its own block stays)
    all-reduce:  2 * (W - 1) / W * (W * size)       (the bandwidth-optimal ring's send volume)
These are loopback TCP ranks on a shared CPU host: there is no meaningful hardware limit to
quote, so the table gives the ratio to native, the number this benchmark exists for (the goal:
pairwise within 1.1x of all_to_all_single at >= 1 MB per peer). On a host with fewer cores than
ranks (plus gloo's threads) every wake-up can wait a scheduler slice (~4 ms); each P2P message
costs such hand-offs, so the medians are noisy there; the best-of-N ratio is printed beside them.

Time per collective: every rank runs ``iters`` timed calls of each variant, the variants taking
turns call by call (a noisy stretch on a shared host hits all alike), each after a barrier; a
rank's time is its median; the table reports the slowest rank's median.

The chart (``--png``, drawn from the JSON report alone): median time per call against bytes per
peer, log-log, one panel per (operation, W), native in black; each legend entry gives the ratio
to native at the largest size.

Tracing overhead: the same all_to_all_v loop through TracingCommunicator and without it, and the
tracer's bookkeeping alone (a no-op inner communicator: no network noise).

Calibration for the simulator (``--calibrate FILE``): instead of the above, the latency and
bandwidth of every collective kind, group size and message size on W = the first --worlds ranks
(``neo_train.topology.calibrate.measure_collectives``, fitted by ``fit_calibration``), written
as the file ``neo-train simulate --trace DIR --calibration FILE`` reads (``neo-train calibrate``
writes the same):

    python benchmarks/collectives.py --calibrate calib_w4.json --worlds 4 [--busy-ms 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from neo_train.comm.executor import ScheduleCommunicator
from neo_train.comm.schedules.rules import parse_bytes
from neo_train.comm.interface import Communicator
from neo_train.comm.schedules import TopologyHint
from neo_train.comm.trace import TracingCommunicator
from neo_train.testing import cpu_model, run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parent))  # report_io, when imported as a module
from report_io import write_outputs  # noqa: E402  (benchmarks/ is on the path: run as a script)

A2A_ALGS = ["pairwise", "bruck", "hierarchical", "opera"]
AR_ALGS = ["ring", "halving_doubling", "dps", "hierarchical"]


def _time_interleaved(comm, fns: dict, iters: int, warmup: int = 2) -> dict[str, tuple[float, float]]:
    """(median, min) seconds per call of each fn, the fns taking turns every iteration (so a
    noisy stretch of a shared host hits all of them alike); a barrier before every call."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    ts: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(iters):
        for k, fn in fns.items():
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in ts.items()}


def _bench_body(comm, sizes: list[int], iters: int, algs_a2a: list[str], algs_ar: list[str]):
    W = comm.world_size
    hint = TopologyHint(local_world_size=2 if W % 2 == 0 and W > 2 else W, hosts_per_rack=2 if W > 2 else 1, bulk_threshold_bytes=0)
    a2a = {a: ScheduleCommunicator(comm, [("all_to_all_v", None, a)], hint=hint) for a in algs_a2a}
    ar = {a: ScheduleCommunicator(comm, [("all_reduce", None, a)], hint=hint) for a in algs_ar}
    rows = []
    for size in sizes:
        n = size // 4  # float32 elements per peer
        x = torch.randn(W * n)
        splits = [n] * W
        its = max(5, iters if size <= (1 << 20) else iters // 2)
        fns = {"native": lambda: comm.all_to_all_v(x, splits, splits)}
        fns |= {a: (lambda sc=sc: sc.all_to_all_v(x, splits, splits)) for a, sc in a2a.items()}
        rows.append({"op": "all_to_all_v", "W": W, "size": size, "times": _time_interleaved(comm, fns, its)})
        if not ar:
            continue
        y = torch.randn(W * n)
        fns = {"native": lambda: comm.all_reduce(y.clone())}
        fns |= {a: (lambda sc=sc: sc.all_reduce(y.clone())) for a, sc in ar.items()}
        rows.append({"op": "all_reduce", "W": W, "size": size, "times": _time_interleaved(comm, fns, its)})
    return rows


def _trace_body(comm, sizes: list[int], iters: int):
    W = comm.world_size
    tc = TracingCommunicator(comm)
    out = []
    for size in sizes:
        n = size // 4
        x = torch.randn(W * n)
        splits = [n] * W
        t = _time_interleaved(comm, {
            "plain": lambda: comm.all_to_all_v(x, splits, splits, tag="output_dist"),
            "traced": lambda: tc.all_to_all_v(x, splits, splits, tag="output_dist"),
        }, iters)
        out.append({"W": W, "size": size, "plain_s": t["plain"][0], "traced_s": t["traced"][0], "entries": len(tc.entries)})
    return out


class _NullComm(Communicator):
    """Returns at once: isolates the tracer's own bookkeeping from communication noise."""

    rank, world_size, global_ranks = 0, 4, [0, 1, 2, 3]

    def all_to_all_v(self, x, in_splits, out_splits, *, async_op=False, tag=""):
        return x

    def all_gather_v(self, x, sizes, *, async_op=False, tag=""):
        return x

    def all_reduce(self, x, op="sum", *, async_op=False, tag=""):
        return x

    def barrier(self) -> None:
        pass

    def subgroup(self, ranks):
        return None


def _bookkeeping_us(calls: int = 50_000) -> tuple[float, float]:
    """Microseconds per all_to_all_v call through a no-op communicator, untraced and traced."""
    x, splits = torch.ones(16, 8), [4, 4, 4, 4]
    out = []
    for c in (_NullComm(), TracingCommunicator(_NullComm(), pg_id=0)):
        for _ in range(1000):
            c.all_to_all_v(x, splits, splits, tag="output_dist")
        t0 = time.perf_counter()
        for _ in range(calls):
            c.all_to_all_v(x, splits, splits, tag="output_dist")
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return out[0], out[1]


def _slowest(per_rank: list[list[dict]]) -> list[dict]:
    """Merge per-rank rows: the slowest rank's median (and min) per cell."""
    rows = per_rank[0]
    for i, row in enumerate(rows):
        for k in row["times"]:
            row["times"][k] = [max(r[i]["times"][k][j] for r in per_rank) for j in (0, 1)]
    return rows


def _fmt_size(b: int) -> str:
    return f"{b / 2**20:.4g} MB" if b >= 1 << 20 else f"{b / 2**10:.4g} KB" if b >= 1 << 10 else f"{b} B"


def _moved(op: str, W: int, size: int) -> float:
    return (W - 1) * size if op == "all_to_all_v" else 2 * (W - 1) / W * (W * size)


def _calibrate(path: str, W: int, sizes: list[int] | None, iters: int, busy_s: float) -> int:
    """Measure and fit the simulator's calibration on W local gloo ranks; write it to ``path``."""
    from neo_train.cli import _calibrate_rank
    from neo_train.topology.calibrate import DEFAULT_SIZES, fit_calibration

    load, t0 = os.getloadavg()[0], time.perf_counter()
    samples = run_ranks(_calibrate_rank, W, sizes or list(DEFAULT_SIZES), iters, busy_s, None, timeout_s=1800)[0]
    meta = {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_before": load, "load_after": os.getloadavg()[0],
            "seconds": time.perf_counter() - t0, "iters": iters, "busy_s": busy_s}
    cal = fit_calibration(samples, world_size=W, transport="gloo", device="cpu", meta=meta)
    cal.save(path)
    print(cal.table())
    print(f"{'kind':<21} {'g':>2} {'bytes':>9} {'measured us':>12} {'model us':>9} {'GB/s':>7}")
    for smp in samples:
        a = bool(smp.get("async", False))  # a busy calibration's asynchronous calls: their own fit
        pred = cal.predict(smp["kind"], smp["group"], smp["bytes"], async_op=a)
        print(f"{smp['kind'] + (' async' if a else ''):<21} {smp['group']:>2} {smp['bytes']:>9} "
              f"{smp['seconds'] * 1e6:12.0f} {pred * 1e6:9.0f} {smp['bytes'] / smp['seconds'] / 1e9:7.3f}")
    print(f"calibration written to {path} (load {load:.2f} -> {os.getloadavg()[0]:.2f})")
    return 0


def _median_s(times: dict[str, Any], alg: str) -> float:
    """A report cell's median seconds; 0 where the cell is missing or empty (nothing to draw)."""
    t = times.get(alg)
    return t[0] if t and t[0] else 0.0


def write_png(path: str, report: dict[str, Any]) -> None:
    """Median time per call vs bytes per peer, log-log: a panel per (op, W) in ``report["collectives"]``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter, NullLocator

    rows = report["collectives"]
    ops = [op for op in ("all_to_all_v", "all_reduce") if any(r["op"] == op for r in rows)]
    ops += sorted({r["op"] for r in rows} - set(ops))
    worlds = sorted({r["W"] for r in rows})
    colors = {a: f"C{i}" for i, a in enumerate(dict.fromkeys(A2A_ALGS + AR_ALGS))}
    # a row per op and a column per W; a single W: the ops side by side
    nr, nc = (len(ops), len(worlds)) if len(worlds) > 1 else (1, len(ops))
    fig, axes = plt.subplots(nr, nc, figsize=(6.4 * nc, 5.4 * nr), squeeze=False)
    for (oi, op), (wi, W) in ((o, w) for o in enumerate(ops) for w in enumerate(worlds)):
        ax = axes[oi][wi] if len(worlds) > 1 else axes[0][oi]
        sel = sorted((r for r in rows if r["op"] == op and r["W"] == W), key=lambda r: r["size"])
        if not sel:
            ax.set_axis_off()
            continue
        algs = list(dict.fromkeys(a for r in sel for a in r["times"]))
        for a in ["native"] + [a for a in algs if a != "native"]:
            # (size, median s) where measured: a missing cell or a zero time has no place on a log axis
            pts = [(r["size"], _median_s(r["times"], a)) for r in sel if _median_s(r["times"], a) > 0]
            if not pts:
                continue
            if a == "native":
                label, style = "native (gloo)", {"color": "k", "lw": 2.8, "marker": "s", "zorder": 3}
            else:
                color = colors.setdefault(a, f"C{len(colors) % 10}")  # an algorithm registered since
                label, style = a, {"color": color, "lw": 1.4, "marker": "o", "ms": 4}
                nat, t = _median_s(sel[-1]["times"], "native"), _median_s(sel[-1]["times"], a)
                if nat and t:  # the number this benchmark exists for, at the largest size
                    label += f": {t / nat:.2f}x native at {_fmt_size(sel[-1]['size'])}"
            ax.plot([p[0] for p in pts], [p[1] * 1e6 for p in pts], label=label, **style)
        sizes = [r["size"] for r in sel]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlim(min(sizes) / 2, max(sizes) * 2)
        ax.set_xticks(sizes, [_fmt_size(s) for s in sizes], fontsize=8)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(LogFormatter())  # 300, 1000 rather than 3 x 10^2
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.set_xlabel("bytes per peer" + (" (tensor = W x size)" if op == "all_reduce" else ""))
        ax.set_ylabel("median time per call (µs, slowest rank)")
        ax.set_title(f"{op}, W = {W}", fontsize=11)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    m = report.get("machine")  # absent from reports written before the chart existed
    where = f"{m['cpu']}, {m['cpu_count']} CPUs" if m else "machine not recorded"
    if m and "loadavg_1m_at_end" in m:
        where += f", load average {m['loadavg_1m_at_start']:.2f} at start, {m['loadavg_1m_at_end']:.2f} at end"
    fig.suptitle(("SMOKE RUN (--quick, toy sizes) - not a measurement\n" if report.get("quick") else "")
                 + f"schedule executor vs native gloo collectives: {where}", fontsize=11)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="W = 2, three sizes, few iterations")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--png", default="", help="write the chart here: time per call vs size, a panel per (op, W)")
    ap.add_argument("--iters", type=int, default=0, help="timed calls per cell (default 20, quick 5)")
    ap.add_argument("--sizes", default="", help="bytes per peer, comma-separated (e.g. 1MB,4MB)")
    ap.add_argument("--algorithms", default="", help="only these algorithms, comma-separated (e.g. pairwise,ring)")
    ap.add_argument("--worlds", default="", help="world sizes, comma-separated (default 2,4; quick 2)")
    ap.add_argument("--calibrate", metavar="FILE", help="write the simulator's calibration of the first --worlds size "
                                                         "here instead (see the module docstring)")
    ap.add_argument("--busy-ms", type=float, default=0.0, help="with --calibrate: ranks compute this long between "
                                                              "calls (CPU-bound ranks, as in training)")
    args = ap.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")] if args.worlds else ([2] if args.quick else [2, 4])
    if args.calibrate:
        return _calibrate(args.calibrate, worlds[0], [int(parse_bytes(v)) for v in args.sizes.split(",")]
                          if args.sizes else None, args.iters or (5 if args.quick else 9), args.busy_ms / 1e3)
    sizes = [1 << 10, 64 << 10, 1 << 20] if args.quick else [1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20]
    if args.sizes:
        sizes = [int(parse_bytes(v)) for v in args.sizes.split(",")]
    iters = args.iters or (5 if args.quick else 20)
    only = set(args.algorithms.split(",")) if args.algorithms else None
    info = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "loadavg_1m_at_start": os.getloadavg()[0]}  # fmt: skip
    rows: list[dict] = []
    for W in worlds:
        a2a = [a for a in A2A_ALGS if not (a == "hierarchical" and W == 2) and (only is None or a in only)]
        ar = [a for a in AR_ALGS if not (a == "hierarchical" and W == 2) and (only is None or a in only)]
        rows += _slowest(run_ranks(_bench_body, W, sizes, iters, a2a, ar, timeout_s=1800))
    print("executor overhead vs native gloo: time / native time, as median ratio / best-of-N ratio")
    print("(slowest rank; the best-of-N ratio shows the overhead without the host's scheduling noise)")
    for op in ("all_to_all_v", "all_reduce"):
        algs = A2A_ALGS if op == "all_to_all_v" else AR_ALGS
        print(f"\n{op}: size = bytes per peer" + ("" if op == "all_to_all_v" else " (tensor = W x size)"))
        print(f"{'W':>2} {'size':>7} {'moved/rank':>11} {'native us':>10} {'GB/s':>6} " + " ".join(f"{a:>16}" for a in algs))
        for r in (r for r in rows if r["op"] == op):
            t = r["times"]
            nat = t["native"]
            moved = _moved(op, r["W"], r["size"])
            cells = [f"{t[a][0] / nat[0]:6.2f}x /{t[a][1] / nat[1]:5.2f}x" if a in t else f"{'-':>16}" for a in algs]
            print(f"{r['W']:>2} {_fmt_size(r['size']):>7} {moved / 1e6:9.3f}MB {nat[0] * 1e6:10.0f} {moved / nat[0] / 1e9:6.2f} " + " ".join(cells))
    tsizes = [1 << 10, 1 << 20]
    trace = run_ranks(_trace_body, 2, tsizes, max(iters, 20) * 5, timeout_s=900)
    print("\ntracing overhead: all_to_all_v loop, W = 2, traced vs untraced (slowest rank's median)")
    print(f"{'size':>7} {'plain us':>9} {'traced us':>10} {'overhead us':>12} {'overhead':>9}")
    tr_rows = []
    for i, size in enumerate(tsizes):
        plain = max(r[i]["plain_s"] for r in trace)
        traced = max(r[i]["traced_s"] for r in trace)
        tr_rows.append({"size": size, "plain_s": plain, "traced_s": traced})
        print(f"{_fmt_size(size):>7} {plain * 1e6:9.1f} {traced * 1e6:10.1f} {(traced - plain) * 1e6:12.1f} {(traced / plain - 1) * 100:8.1f}%")
    plain_us, traced_us = _bookkeeping_us()
    print(f"tracer bookkeeping alone (no-op communicator): {traced_us - plain_us:.1f} us per call "
          f"({plain_us:.2f} us untraced, {traced_us:.2f} us traced)")
    info["loadavg_1m_at_end"] = os.getloadavg()[0]
    report = {"benchmark": "collectives", "quick": args.quick, "machine": info, "args": vars(args), "collectives": rows,
              "tracing": tr_rows, "tracer_bookkeeping_us": traced_us - plain_us}  # fmt: skip
    write_outputs(report, args.json, args.png, write_png, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
