"""The Opera/DLRM co-design study (shared/seeds/000_...) reproduced in shape with neo_train's
flow simulator: Model-A strong-scaled on fat-tree and Opera, ring and DPS all-reduce.

    python benchmarks/opera_study.py                        # full, into out/opera_study/: ~1.5 min on 2 cores
    python benchmarks/opera_study.py --quick --out /tmp/os  # 16 and 128 nodes, 5 table counts: ~15 s

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
import sys
import time
from pathlib import Path
from typing import Any

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("out/opera_study"), help="output directory")
    p.add_argument("--quick", action="store_true", help="16 and 128 nodes, 5 table counts (< 30 s)")
    p.add_argument("--sweep-nodes", type=int, default=128, help="nodes of the table-count sweep")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
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
