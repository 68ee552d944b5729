"""The Opera/DLRM co-design study (shared/seeds/000_...) reproduced in shape with neo_train's
flow simulator: Model-A strong-scaled on fat-tree and Opera, ring and DPS all-reduce.

    python benchmarks/opera_study.py                        # full, into out/opera_study/: ~1.5 min on 2 cores
    python benchmarks/opera_study.py --quick --out /tmp/os  # 16 and 128 nodes, 5 table counts: ~15 s
    python benchmarks/opera_study.py --compat flexflow      # the study's own setup, beside its numbers
    python benchmarks/opera_study.py --compat flexflow --fit          # refit the mode's two knobs first
    python benchmarks/opera_study.py --compat flexflow --quick --series baseline   # 16 + 128 nodes: ~2 min

``--compat flexflow`` (neo_train/topology/flexflow.py, notes/flexflow_compat.md): every series the
study ran, each changing one knob of its Model-A baseline -- global batch 1,048,576 and 2,097,152,
embedding dimension 40, Model-I (361 tables of dimension 92, MLPs of 43 x 682) -- at 16 / 128 /
1024 nodes on fat-tree (ring, DPS) and Opera (DPS; ring for the baseline), into one CSV
(flexflow_compat.csv: series, nodes, network, all-reduce, seconds, all-reduce byte share, the
study's figure where it published one, the error, and the cell's role: fitted, held out,
or prediction) and the markdown table flexflow_compat.md. ``--fit`` fits the
mode's two knobs on the Model-A baseline first (``fit_knobs``) and uses them; without it the
mode's defaults (flexflow.FIT_*), which are that fit rounded. Opera options pass through
(``--opera-option KEY=VALUE``). Byte formula (per iteration, N nodes, T tables, B global batch,
D dim, P dense parameters): all-to-all 2 T B D 8 (N-1)/N, all-reduce 2 (N-1) 4 P.

Experiments (the study's setup, shared/notes/network-model.md): Model-A of the ISI job scripts
(1000 tables of 10^7 x 80, bags of 100, two 20-layer MLPs of 3375 wide, 703M dense parameters),
global batch 524,288 fixed (strong scaling), 8 A100s per node folded into one host with one
100 Gbps NIC, 200 Gbps between a node's GPUs, 1 us per hop; tables placed table-wise by the
planner (7-8 per node at 128 nodes, one per node at 1024).
  1. strong scaling: 16 / 128 / 1024 nodes x {fat-tree (K = 4, 8, 16) with ideal per-packet
     spraying, the same with per-flow ECMP (one hashed path per flow, as htsim's TCP flows take),
     Opera (4 x 4, 32 x 4, 128 x 8 racks)} x {ring, DPS} all-reduce; the paper compares
     fat-tree+ring with Opera+DPS.
  2. the all-reduce vs all-to-all share of the bytes on the network per iteration, per scale.
  3. table count 10, 25, 50, 75, 100, 200, ..., 2000 at 128 nodes, fat-tree+ring (both routings)
     vs Opera+DPS.
Opera sends every flow on the bulk path (cutoff 0), as the study's runs did.

Compute per iteration (roofline, written out in neo_train/topology/workload.py): dense FLOPs
3 * 2 * sum(in*out) per sample / 156 TFLOP/s (A100 TF32 peak); embedding lookups and the fused
row-wise Adagrad update as HBM bytes / 1,555 GB/s.
Bytes on the network per iteration (what crosses a NIC), N nodes:
  all-to-all  2 * B_global * T * 80 * 4 * (N-1)/N      (pooled embeddings forward, gradients back)
  all-reduce  2 * (N-1) * 4 * P                        (ring or DPS alike; P = dense parameters)
Each collective's lower bound (bytes the busiest host sends / NIC rate) is printed beside its time.

Writes strong_scaling.csv, table_sweep.csv, byte_shares.csv, summary.md and three PNGs.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from neo_train.topology.flexflow import COMPAT_MODES, FlexFlowCompat, parse_opera_options
from neo_train.topology.study import cluster_for, model_for, run_iteration

CONFIGS = (  # (label, network, fat-tree routing, all-reduce)
    ("fattree", "fattree", "spray", "ring"), ("fattree", "fattree", "spray", "dps"),
    ("fattree-ecmp", "fattree", "ecmp", "ring"), ("fattree-ecmp", "fattree", "ecmp", "dps"),
    ("opera", "opera", "spray", "ring"), ("opera", "opera", "spray", "dps"),
)
PAPER = {"fattree": "ring", "fattree-ecmp": "ring", "opera": "dps"}  # the pairings the paper compares


def strong_scaling(nodes_list: list[int], tables: int) -> list[dict[str, Any]]:
    model = model_for("opera_model_a", tables)
    rows = []
    for nodes in nodes_list:
        cluster = cluster_for("opera_study", nodes)
        for _, net, routing, ar in CONFIGS:
            _, row = run_iteration(model, cluster, net, ar, routing=routing)
            rows.append(row)
            _say(row)
    return rows


def table_sweep(counts: list[int], nodes: int) -> list[dict[str, Any]]:
    rows = []
    cluster = cluster_for("opera_study", nodes)
    for t in counts:
        model = model_for("opera_model_a", t)
        for label, net, routing, ar in CONFIGS:
            if PAPER[label] == ar:
                _, row = run_iteration(model, cluster, net, ar, routing=routing)
                rows.append(row)
                _say(row)
    return rows


def _say(row: dict[str, Any]) -> None:
    bound = row["fwd_a2a_bound_s"] + row["bwd_a2a_bound_s"] + row["ar_top_bound_s"] + row["ar_bottom_bound_s"]
    print(f"  {row['nodes']:5d} nodes {row['tables']:5d} tables {row['network']:12s} {row['allreduce']:5s} "
          f"iteration {row['iteration_s'] * 1e3:9.1f} ms | a2a {row['a2a_bytes'] / 1e9:7.1f} GB "
          f"ar {row['allreduce_bytes'] / 1e9:8.1f} GB ({100 * row['allreduce_share']:4.1f}% ar) | "
          f"comm bound {bound * 1e3:8.1f} ms | simulated in {row['sim_wall_s']:5.1f} s", flush=True)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def _get(rows, **match) -> dict[str, Any]:
    return next(r for r in rows if all(r[k] == v for k, v in match.items()))


def summary(scale: list[dict[str, Any]], sweep: list[dict[str, Any]], nodes_list: list[int]) -> str:
    labels = [f"{lab} {ar}" for lab, _, _, ar in CONFIGS]
    out = ["## Strong scaling: iteration time (ms), Model-A, global batch 524,288", "",
           "| nodes | " + " | ".join(labels) + " | Opera DPS vs fat-tree ring | vs fat-tree-ecmp ring |",
           "|---:|" + "---:|" * (len(labels) + 2)]
    for n in nodes_list:
        t = {(r["network"], r["allreduce"]): r["iteration_s"] for r in scale if r["nodes"] == n}
        op = t[("opera", "dps")]
        out.append(f"| {n} | " + " | ".join(f"{1e3 * t[(lab, ar)]:.1f}" for lab, _, _, ar in CONFIGS)
                   + f" | {t[('fattree', 'ring')] / op:.2f}x | {t[('fattree-ecmp', 'ring')] / op:.2f}x |")
    out += ["", "Time by collective (ms; busy time, overlapping phases counted once):", "",
            "| nodes | config | all-to-all | all-reduce | compute | a2a bound | all-reduce bound |",
            "|---:|---|---:|---:|---:|---:|---:|"]
    for n in nodes_list:
        for lab, _, _, ar in CONFIGS:
            r = _get(scale, nodes=n, network=lab, allreduce=ar)
            out.append(f"| {n} | {lab} {ar} | {1e3 * r['all_to_all_s']:.1f} | {1e3 * r['all_reduce_s']:.1f} | "
                       f"{1e3 * r['compute_s']:.1f} | {1e3 * (r['fwd_a2a_bound_s'] + r['bwd_a2a_bound_s']):.1f} | "
                       f"{1e3 * (r['ar_top_bound_s'] + r['ar_bottom_bound_s']):.1f} |")
    out += ["", "## Bytes on the network per iteration", "",
            "| nodes | all-to-all GB | all-reduce GB | all-reduce share |", "|---:|---:|---:|---:|"]
    for n in nodes_list:
        r = _get(scale, nodes=n, network="fattree", allreduce="ring")
        out.append(f"| {n} | {r['a2a_bytes'] / 1e9:,.1f} | {r['allreduce_bytes'] / 1e9:,.1f} | "
                   f"{100 * r['allreduce_share']:.1f}% |")
    if sweep:
        nodes = sweep[0]["nodes"]
        out += ["", f"## Table count at {nodes} nodes: iteration time (ms)", "",
                "| tables | fat-tree ring | fat-tree-ecmp ring | Opera DPS | Opera vs fat-tree | vs fat-tree-ecmp "
                "| all-reduce share |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for t in sorted({r["tables"] for r in sweep}):
            ft = _get(sweep, tables=t, network="fattree")
            fe = _get(sweep, tables=t, network="fattree-ecmp")
            op = _get(sweep, tables=t, network="opera")
            out.append(f"| {t} | {1e3 * ft['iteration_s']:.1f} | {1e3 * fe['iteration_s']:.1f} | "
                       f"{1e3 * op['iteration_s']:.1f} | {ft['iteration_s'] / op['iteration_s']:.2f}x | "
                       f"{fe['iteration_s'] / op['iteration_s']:.2f}x | {100 * ft['allreduce_share']:.1f}% |")
    return "\n".join(out) + "\n"


def plots(out: Path, scale: list[dict[str, Any]], sweep: list[dict[str, Any]], nodes_list: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for lab, _, _, ar in CONFIGS:
        ys = [_get(scale, nodes=n, network=lab, allreduce=ar)["iteration_s"] for n in nodes_list]
        style = "-o" if PAPER[lab] == ar else "--x"
        ax.plot(nodes_list, ys, style, label=f"{lab} + {ar}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes (8 GPUs each)")
    ax.set_ylabel("iteration time (s)")
    ax.set_title("Model-A strong scaling (global batch 524,288)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "strong_scaling.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [_get(scale, nodes=n, network="fattree", allreduce="ring") for n in nodes_list]
    x = range(len(nodes_list))
    a2a = [r["a2a_bytes"] / 1e9 for r in rows]
    ar = [r["allreduce_bytes"] / 1e9 for r in rows]
    ax.bar(x, a2a, label="all-to-all")
    ax.bar(x, ar, bottom=a2a, label="all-reduce")
    for i, r in enumerate(rows):
        ax.text(i, a2a[i] + ar[i], f"{100 * r['allreduce_share']:.0f}% AR", ha="center", va="bottom")
    ax.set_xticks(list(x), [str(n) for n in nodes_list])
    ax.set_xlabel("nodes")
    ax.set_ylabel("GB on the network per iteration")
    ax.set_title("Traffic mix under strong scaling")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "byte_shares.png", dpi=120)
    plt.close(fig)

    if sweep:
        fig, ax = plt.subplots(figsize=(6, 4))
        ts = sorted({r["tables"] for r in sweep})
        for net in PAPER:
            ax.plot(ts, [_get(sweep, tables=t, network=net)["iteration_s"] for t in ts], "-o", ms=3,
                    label=f"{net} + {PAPER[net]}")
        ax.set_xlabel("embedding tables")
        ax.set_ylabel("iteration time (s)")
        ax2 = ax.twinx()
        ax2.plot(ts, [100 * _get(sweep, tables=t, network="fattree")["allreduce_share"] for t in ts], ":", color="grey",
                 label="all-reduce share of bytes")
        ax2.set_ylabel("all-reduce share of bytes (%)")
        ax.set_title(f"Table count at {sweep[0]['nodes']} nodes")
        ax.legend(loc="upper left")
        ax2.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(out / "table_sweep.png", dpi=120)
        plt.close(fig)


# ---- --compat flexflow: the study's setup beside its published numbers ----------------------------

STUDY_S = {  # (nodes, network, all-reduce) -> seconds: the study's released Model-A baseline
    (16, "fattree", "ring"): 36.82, (128, "fattree", "ring"): 4.730, (1024, "fattree", "ring"): 0.723,
    (16, "fattree", "dps"): 29.83, (128, "fattree", "dps"): 4.084,
    (16, "opera", "dps"): 30.76, (128, "opera", "dps"): 4.163, (1024, "opera", "dps"): 0.782,
    (128, "opera", "ring"): 3.844, (1024, "opera", "ring"): 9.946,
}
STUDY_SHARE = {16: 0.118, 128: 0.517, 1024: 0.896}
"""The study's all-reduce share of the bytes on the network, Model-A baseline."""
FIT_TABLE_CELLS = [(n, "fattree", ar) for n in (16, 128) for ar in ("ring", "dps")]
"""The cells the per-table time is fitted on (max |log error| over them is minimised). Fat-tree
only: the Opera cells stay held out, and the fit does not move with the Opera model."""
FIT_LATENCY_CELL = (1024, "fattree", "ring")
"""The cell the fat-tree round latency is fitted on (where 2(N-1) = 2046 dependent rounds show)."""
LATENCY_GRID = tuple(x * 1e-6 for x in range(0, 201, 25))
"""Round latencies tried (seconds): 0 to 200 us; htsim's RTT on the K=16 fat-tree is ~15 us."""
SERIES = {  # name -> (model, global batch, embedding dim or None for the model's)
    "baseline": ("opera_model_a", 524_288, None),
    "batch_1048576": ("opera_model_a", 1_048_576, None),
    "batch_2097152": ("opera_model_a", 2_097_152, None),
    "dim_40": ("opera_model_a", 524_288, 40),
    "model_i": ("opera_model_i", 524_288, None),
}
COMPAT_CONFIGS = (("fattree", "ring"), ("fattree", "dps"), ("opera", "dps"), ("opera", "ring"))


class _CellTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise _CellTimeout()


def compat_cell(series: str, nodes: int, network: str, allreduce: str, cc: FlexFlowCompat,
                timeout_s: int = 0) -> dict[str, Any]:
    """One cell of the reproduction; ``timeout_s`` > 0 gives up on a simulation after that long
    (the row then has seconds NaN and says so in its role)."""
    model_name, batch, dim = SERIES[series]
    old = signal.signal(signal.SIGALRM, _alarm) if timeout_s else None
    signal.alarm(timeout_s)
    try:
        _, row = run_iteration(model_for(model_name, dim=dim), cluster_for("opera_study", nodes), network, allreduce,
                               global_batch=batch, compat=cc)
    except _CellTimeout:
        row = {"iteration_s": math.nan, "allreduce_share": math.nan, "sim_wall_s": float(timeout_s),
               "network": network, "notes": f"simulation stopped after {timeout_s} s"}
    finally:
        signal.alarm(0)
        if old is not None:
            signal.signal(signal.SIGALRM, old)
    row = {"series": series, "nodes": nodes, "network": network, "allreduce": allreduce,
           "seconds": row["iteration_s"], "allreduce_share": row["allreduce_share"], **row}
    study = STUDY_S.get((nodes, network, allreduce)) if series == "baseline" else None
    share = STUDY_SHARE.get(nodes) if series == "baseline" else None
    if series != "baseline":
        role = "prediction"
    elif (nodes, network, allreduce) in FIT_TABLE_CELLS:
        role = "fitted (table time)"
    elif (nodes, network, allreduce) == FIT_LATENCY_CELL:
        role = "fitted (round latency)"
    else:
        role = "held out" if study is not None else "prediction"
    if math.isnan(row["seconds"]):
        role += f" (timed out after {timeout_s} s)"
    row.update(study_s=study, error=row["seconds"] / study - 1 if study else None, study_share=share,
               share_error=row["allreduce_share"] - share if share is not None else None, role=role)
    print(f"  {series:14s} {nodes:5d} {network:7s} {allreduce:4s} {row['seconds']:9.3f} s"
          + (f"  study {study:7.3f} ({100 * row['error']:+6.1f} %)" if study else "")
          + f"  ar share {row['allreduce_share']:.3f}  [{role}]  simulated in {row['sim_wall_s']:.1f} s", flush=True)
    return row


def fit_knobs(cc: FlexFlowCompat) -> tuple[FlexFlowCompat, dict[str, Any]]:
    """Fit the per-table time c and the fat-tree round latency on the Model-A baseline.

    c: every fitted cell's time is affine in c (the node-serial chain is c x values plus the
    exposed network, which does not depend on c); two simulations per cell give the line, and c is
    the value minimising the largest |ln(ours / study)| over FIT_TABLE_CELLS (a grid of 1e-4
    relative steps). Round latency: the 1024-node fat-tree ring (2046 dependent rounds) simulated
    at the fitted c for LATENCY_GRID; the value with the smallest |ln(ours / study)| (the response
    is neither linear nor monotonic: concurrent rings' rounds interleave differently)."""
    def t(c: float, lat: float, cell: tuple) -> float:
        n, net, ar = cell
        return compat_cell("baseline", n, net, ar, dataclasses.replace(cc, table_ps_per_value=c,
                                                                          round_latency=lat))["seconds"]

    c0, c1, lat0 = cc.table_ps_per_value, cc.table_ps_per_value * 1.1, cc.round_latency
    lines = {cell: (t(c0, lat0, cell), t(c1, lat0, cell)) for cell in FIT_TABLE_CELLS}
    grid = np.linspace(0.5 * c0, 2.0 * c0, 15001)
    worst = np.zeros_like(grid)
    for cell, (y0, y1) in lines.items():
        y = y0 + (grid - c0) * (y1 - y0) / (c1 - c0)
        worst = np.maximum(worst, np.abs(np.log(y / STUDY_S[cell])))
    c = round(float(grid[int(np.argmin(worst))]), 1)
    study = STUDY_S[FIT_LATENCY_CELL]
    response = {lat: t(c, lat, FIT_LATENCY_CELL) for lat in LATENCY_GRID}
    lat = min(response, key=lambda x: (abs(math.log(response[x] / study)), x))
    info = {"table_ps_per_value": c, "round_latency_s": lat, "table_cells": [list(k) for k in FIT_TABLE_CELLS],
            "latency_cell": list(FIT_LATENCY_CELL), "worst_table_log_error": float(worst.min()),
            "table_lines": {f"{k[0]} {k[1]} {k[2]}": [c0, y0_, c1, y1_] for k, (y0_, y1_) in lines.items()},
            "latency_response_s": {f"{k * 1e6:g} us": v for k, v in response.items()}}
    print(f"fit: table_ps_per_value = {c:.1f} ps (largest |log error| over the table cells {worst.min():.3f}), "
          f"round latency = {lat * 1e6:g} us (1024-node fat-tree ring: "
          + ", ".join(f"{k * 1e6:g} us -> {v:.3f} s" for k, v in response.items()) + ")")
    return dataclasses.replace(cc, table_ps_per_value=c, round_latency=lat), info


def compat_markdown(rows: list[dict[str, Any]], cc: FlexFlowCompat) -> str:
    """The study reproduction as a markdown table: every series x nodes x network/algorithm."""
    out = [f"Knobs: per-table time {cc.table_ps_per_value:g} ps per looked-up value "
           f"({cc.table_seconds(524_288, 100, 80) * 1e3:.0f} ms per Model-A table), fat-tree round latency "
           f"{cc.round_latency * 1e6:g} us. Error = ours / study - 1.", "",
           "| series | nodes | network | all-reduce | ours (s) | study (s) | error | AR share ours | AR share study "
           "| cell |", "|---|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        st = f"{r['study_s']:.3f}" if r["study_s"] else "–"
        err = f"{100 * r['error']:+.1f} %" if r["error"] is not None else "–"
        sh = f"{r['study_share']:.3f}" if r["study_share"] is not None else "–"
        out.append(f"| {r['series']} | {r['nodes']} | {r['network']} | {r['allreduce']} | {r['seconds']:.3f} | {st} | "
                   f"{err} | {r['allreduce_share']:.3f} | {sh} | {r['role']} |")
    return "\n".join(out) + "\n"


def compat_main(args: argparse.Namespace) -> int:
    cc = FlexFlowCompat.named(args.compat, table_ps_per_value=args.table_ps_per_value,
                              round_latency=None if args.round_latency_us is None else args.round_latency_us * 1e-6,
                              opera_options=parse_opera_options(args.opera_option))
    out = args.out or Path("notes/opera_study")
    out.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(args.series) - set(SERIES))
    if unknown:
        raise SystemExit(f"unknown series {unknown} (known: {', '.join(SERIES)})")
    t0 = time.perf_counter()
    if args.fit:
        cc, info = fit_knobs(cc)
        (out / "flexflow_fit.json").write_text(json.dumps(info, indent=1))
    nodes_list = [16, 128] if args.quick else [16, 128, 1024]
    rows = []
    for series in args.series:
        for n in nodes_list:
            for net, ar in COMPAT_CONFIGS:
                if (net, ar) == ("opera", "ring") and series != "baseline":
                    continue  # the study ran Opera with DPS; its ring figures are for the baseline only
                row = compat_cell(series, n, net, ar, cc, args.cell_timeout)
                if math.isnan(row["seconds"]) and net == "opera" and args.retry_opera_option:
                    retry = dataclasses.replace(cc, opera_options=cc.opera_options
                                                + parse_opera_options(args.retry_opera_option))
                    row = compat_cell(series, n, net, ar, retry, args.cell_timeout)
                    row["role"] += f" (Opera with {', '.join(args.retry_opera_option)}: the default timed out)"
                rows.append(row)
    keys = ["series", "nodes", "network", "allreduce", "seconds", "allreduce_share", "study_s", "error",
            "study_share", "share_error", "role"]
    _write_csv(out / "flexflow_compat.csv", [{k: r[k] for k in keys} | {k: v for k, v in r.items() if k not in keys}
                                             for r in rows])
    text = compat_markdown(rows, cc)
    (out / "flexflow_compat.md").write_text(text)
    print()
    print(text)
    print(f"wrote {out / 'flexflow_compat.csv'} and {out / 'flexflow_compat.md'} in {time.perf_counter() - t0:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="output directory (default out/opera_study; with --compat notes/opera_study)")
    p.add_argument("--quick", action="store_true", help="16 and 128 nodes, 5 table counts (< 30 s)")
    p.add_argument("--sweep-nodes", type=int, default=128, help="nodes of the table-count sweep")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--compat", choices=COMPAT_MODES, help="flexflow: the study's own setup beside its numbers")
    p.add_argument("--series", nargs="+", default=list(SERIES), help=f"--compat: series to run ({', '.join(SERIES)})")
    p.add_argument("--fit", action="store_true", help="--compat: fit the two knobs on the Model-A baseline first")
    p.add_argument("--table-ps-per-value", type=float, help="--compat: per-table time knob (default: the fit)")
    p.add_argument("--round-latency-us", type=float, help="--compat: fat-tree round latency knob (default: the fit)")
    p.add_argument("--opera-option", action="append", metavar="KEY=VALUE", help="--compat: an OperaNetwork keyword")
    p.add_argument("--cell-timeout", type=int, default=1800,
                   help="--compat: give up on one cell's simulation after this many seconds (0: never)")
    p.add_argument("--retry-opera-option", action="append", metavar="KEY=VALUE",
                   help="--compat: simulate a timed-out Opera cell again with this OperaNetwork keyword added")
    args = p.parse_args(argv)
    if args.compat:
        return compat_main(args)
    if args.fit or args.opera_option or args.table_ps_per_value is not None or args.round_latency_us is not None:
        p.error("--fit, --opera-option, --table-ps-per-value and --round-latency-us go with --compat flexflow")
    args.out = args.out or Path("out/opera_study")
    nodes_list = [16, 128] if args.quick else [16, 128, 1024]
    counts = [10, 100, 500, 1000, 2000] if args.quick else [10, 25, 50, 75] + list(range(100, 2001, 100))
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print("strong scaling (Model-A, 1000 tables):")
    scale = strong_scaling(nodes_list, 1000)
    print(f"table count at {args.sweep_nodes} nodes:")
    sweep = table_sweep(counts, args.sweep_nodes)
    _write_csv(args.out / "strong_scaling.csv", scale)
    _write_csv(args.out / "table_sweep.csv", sweep)
    _write_csv(args.out / "byte_shares.csv", [
        {k: r[k] for k in ("nodes", "a2a_bytes", "allreduce_bytes", "allreduce_share")}
        for r in scale if r["network"] == "fattree" and r["allreduce"] == "ring"])
    text = summary(scale, sweep, nodes_list)
    (args.out / "summary.md").write_text(text)
    if not args.no_plots:
        plots(args.out, scale, sweep, nodes_list)
    print()
    print(text)
    print(f"wrote {args.out}/ (strong_scaling.csv, table_sweep.csv, byte_shares.csv, summary.md"
          f"{'' if args.no_plots else ', *.png'}) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
