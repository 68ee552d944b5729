"""``neo-train simulate``: one DLRM iteration (or a recorded trace) on a simulated network.

    neo-train simulate --nodes 128 --network opera --allreduce dps
    neo-train simulate --model model_a --nodes 1024 --network fattree --allreduce ring --out sim/
    neo-train simulate --tables 100 --nodes 128 --network opera --bulk-threshold-mb 15
    neo-train simulate --nodes 16 --network fattree --routing ecmp
    neo-train simulate --trace traces/ --network fattree --compute output_dist=0.002,output_dist_bwd=0.01

The model defaults to the ISI Opera/DLRM study's Model-A (``workload.opera_model_a``: 1000 tables
of 10^7 x 80, bags of 100, two 20-layer MLPs of 3375) at a global batch of 524,288, on the
``opera_study`` cluster (8 A100s per node folded into one host with a 100 Gbps NIC, 200 Gbps
between GPUs, 1 us per hop). ``--model`` also takes a config preset (``model_a`` is Neo's).
Opera runs every flow on the bulk path by default (``--bulk-threshold-mb 0``), as the study did;
Opera's own default cutoff is 15 MB. ``--allreduce auto`` is the study's pairing: ring on
fat-tree and flat, DPS on Opera.

Prints the timeline with each collective's lower bound beside its simulated time, and the
all-reduce vs all-to-all byte shares; ``--out DIR`` writes timeline.csv and summary.json.
``simulate_command`` returns the exit status; ``add_simulate_arguments`` fills a subparser.

``--trace``: a recorded trace instead (``trace_sim``).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path
from typing import Any

from ..config import nonnegative_float, positive_float, positive_int
from .collectives import ALL_REDUCE_ALGORITHMS
from .fattree import ROUTINGS
from .networks import NETWORKS, cluster_for, make_network
from .simulator import SimResult, simulate
from .spec import CLUSTER_PRESETS, ClusterSpec
from .trace_sim import add_trace_arguments, simulate_trace
from .workload import PLACEMENTS, IterationSpec, build_iteration, opera_model_a

__all__ = ["add_simulate_arguments", "simulate_command", "make_network", "run_iteration", "NETWORKS",
           "cluster_for", "model_for"]

def model_for(name: str, tables: int | None = None):
    """'opera_model_a' (the study's Model-A, ``tables`` of them) or a config preset's model."""
    if name == "opera_model_a":
        return opera_model_a(tables if tables is not None else 1000)
    from ..config import preset

    m = preset(name).model
    if tables is not None:
        m = m.replace(tables=m.tables[:tables])
    return m


def run_iteration(model, cluster: ClusterSpec, network: str, allreduce: str, *, global_batch: int = 524_288,
                  bulk_threshold: float = 0.0, vlb: bool = True, a2a: str = "direct", input_dist: bool = False,
                  placement: str = "planner", aggregate: bool = True, fast_forward: bool = True,
                  seed: int = 0, routing: str = "spray", table_wise_only: bool = True
                  ) -> tuple[SimResult, dict[str, Any]]:
    """Simulate one iteration; returns the result and a flat summary row (seconds, bytes)."""
    if allreduce == "auto":
        allreduce = "dps" if network == "opera" else "ring"
    it = build_iteration(IterationSpec(model, cluster, global_batch, allreduce, a2a, input_dist, placement,
                                       table_wise_only))
    net = make_network(network, cluster, bulk_threshold=bulk_threshold, vlb=vlb, seed=seed, routing=routing)
    res = simulate(it.phases, net, aggregate=aggregate, fast_forward=fast_forward)
    a2a_b, ar_b = it.network_bytes.get("all_to_all", 0.0), it.network_bytes.get("all_reduce", 0.0)
    tot = res.totals()
    row: dict[str, Any] = {
        "nodes": cluster.nodes, "network": network + ("-ecmp" if network == "fattree" and routing == "ecmp" else ""),
        "allreduce": allreduce, "tables": len(model.tables),
        "iteration_s": res.total,
        "all_to_all_s": tot.get("all_to_all_s", 0.0), "all_reduce_s": tot.get("all_reduce_s", 0.0),
        "compute_s": tot.get("compute_s", 0.0),
        "a2a_bytes": a2a_b, "allreduce_bytes": ar_b,
        "allreduce_share": ar_b / (a2a_b + ar_b) if a2a_b + ar_b > 0 else 0.0,
        "dense_params": it.dense_params, "sim_wall_s": res.wall_seconds,
    }
    for p in res.phases:
        row[f"{p.name}_s"] = p.duration
        if p.kind != "compute":
            row[f"{p.name}_bound_s"] = p.lower_bound
    row["notes"] = "; ".join(it.notes)
    return res, row


# ---- the command ---------------------------------------------------------------------------------

def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="opera_model_a",
                   help="opera_model_a (the ISI study's Model-A, default) or a config preset (model_a is Neo's)")
    p.add_argument("--tables", type=positive_int, help="use this many tables (opera_model_a: 1000 by default)")
    p.add_argument("--nodes", type=positive_int,
                   help="hosts (nodes of --gpus-per-node GPUs); default 128, with --trace the nodes its ranks fill")
    p.add_argument("--gpus-per-node", type=positive_int,
                   help="GPUs per node (default: the topology's, 8; with --trace the largest divisor of the trace's "
                        "world size up to that)")
    p.add_argument("--network", choices=NETWORKS, default="opera")
    p.add_argument("--allreduce", choices=("auto",) + ALL_REDUCE_ALGORITHMS, default="auto",
                   help="dense all-reduce; auto = the study's pairing (DPS on opera, ring otherwise)")
    p.add_argument("--a2a", choices=("direct", "pairwise"), default="direct", help="all-to-all algorithm")
    p.add_argument("--global-batch", type=positive_int, default=524_288, help="samples per iteration (strong scaling)")
    p.add_argument("--topology", default="opera_study",
                   help=f"cluster preset ({', '.join(CLUSTER_PRESETS)}) or TOML: GPUs, HBM, FLOP/s, NIC")
    p.add_argument("--nic-gbps", type=positive_float, help="NIC (and Opera uplink) Gbit/s, overriding the topology's")
    p.add_argument("--gpu-tflops", type=positive_float, help="dense TFLOP/s per GPU for the roofline")
    p.add_argument("--hbm-gbps", type=positive_float, help="HBM GB/s per GPU for the roofline")
    p.add_argument("--bulk-threshold-mb", type=nonnegative_float, default=0.0,
                   help="Opera: flows below this take multi-hop low-latency paths (study: 0; Opera's default 15)")
    p.add_argument("--no-vlb", action="store_true", help="Opera: direct circuits only (no RotorLB/VLB)")
    p.add_argument("--routing", choices=ROUTINGS, default="spray",
                   help="fat-tree: spray (per-packet, ideal) or ecmp (one hashed path per flow, as TCP)")
    p.add_argument("--input-dist", action="store_true", help="also exchange ids/lengths (off in the study)")
    p.add_argument("--placement", choices=PLACEMENTS, default="planner", help="how tables are placed")
    p.add_argument("--any-sharding", action="store_true",
                   help="let the planner use every sharding type (default: whole tables only, as the study)")
    add_trace_arguments(p)
    p.add_argument("--exact", action="store_true", help="every flow alone, no fast-forward (slow; a check)")
    p.add_argument("--seed", type=int, default=0, help="Opera schedule search seed")
    p.add_argument("--out", type=Path, help="write timeline.csv and summary.json here")


def _check_out_dir(out: Path) -> None:
    """``--out``: a directory, or a path one can create as one (checked before simulating)."""
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"--out {out} is not a directory (a file is there); give a directory path")
        if not os.access(out, os.W_OK):
            raise ValueError(f"--out {out} is not writable")
        return
    probe = out.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"--out {out} lies under {probe}, which is a file, not a directory")
    if not os.access(probe, os.W_OK):
        raise ValueError(f"--out {out} cannot be created: {probe} is not writable")


def simulate_command(args: argparse.Namespace) -> int:
    GB = 1e9
    overrides = dict(inter_node_bandwidth=args.nic_gbps * 1e9 / 8 if args.nic_gbps else None,
                     device_flops=args.gpu_tflops * 1e12 if args.gpu_tflops else None,
                     hbm_bandwidth=args.hbm_gbps * GB if args.hbm_gbps else None)
    thr = args.bulk_threshold_mb * 1e6
    if args.out:
        _check_out_dir(args.out)
    if args.compute and not args.trace:
        raise ValueError("--compute applies to --trace only (a model's compute comes from its roofline)")
    t0 = time.perf_counter()
    if args.trace:
        res, row, cluster = simulate_trace(args, overrides, thr)
    else:
        cluster = cluster_for(args.topology, args.nodes or 128, args.gpus_per_node, **overrides)
        model = model_for(args.model, args.tables)
        res, row = run_iteration(model, cluster, args.network, args.allreduce, global_batch=args.global_batch,
                                 bulk_threshold=thr, vlb=not args.no_vlb, a2a=args.a2a, input_dist=args.input_dist,
                                 placement=args.placement, aggregate=not args.exact, fast_forward=not args.exact,
                                 seed=args.seed, routing=args.routing, table_wise_only=not args.any_sharding)
    print(f"cluster: {cluster.describe()}")
    print(res.report())
    a2a_b = sum(p.network_bytes for p in res.phases if p.kind == "all_to_all")
    ar_b = sum(p.network_bytes for p in res.phases if p.kind == "all_reduce")
    if a2a_b + ar_b > 0:
        print(f"bytes on the network per iteration: all-to-all {a2a_b / GB:,.1f} GB, all-reduce {ar_b / GB:,.1f} GB "
              f"({100 * ar_b / (a2a_b + ar_b):.1f}% all-reduce)")
    if row.get("notes"):
        print(f"note: {row['notes']}")
    print(f"simulated in {time.perf_counter() - t0:.1f} s (network {res.wall_seconds:.1f} s, {res.stats})")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "timeline.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["phase", "kind", "algorithm", "start_s", "end_s", "duration_s", "lower_bound_s",
                        "network_bytes"])
            for p in res.phases:
                w.writerow([p.name, p.kind, p.algorithm, p.start, p.end, p.duration, p.lower_bound, p.network_bytes])
        (args.out / "summary.json").write_text(json.dumps({**row, "network_description": res.network}, indent=2))
        print(f"wrote {args.out / 'timeline.csv'} and {args.out / 'summary.json'}")
    return 0
