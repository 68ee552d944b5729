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

``--compat flexflow``: the study's own setup, to set our times beside its published ones
(``flexflow.py``, notes/flexflow_compat.md): each node one device running its tasks one after
another, tables round-robin by node, a per-table time (``--table-ps-per-value``, picoseconds per
looked-up value, fitted to the study's Model-A baseline), 8-byte all-to-all elements, one
all-reduce per layer (ring: 2(N-1) dependent rounds; DPS: two), and on the fat-tree per-flow
ECMP and a TCP latency per dependent round (``--round-latency-us``, fitted). ``--opera-option
KEY=VALUE`` passes any further ``OperaNetwork`` keyword through (in either mode).

    neo-train simulate --compat flexflow --nodes 16 --network fattree --allreduce ring
    neo-train simulate --compat flexflow --model opera_model_i --nodes 128 --network opera
    neo-train simulate --compat flexflow --nodes 128 --global-batch 1048576 --embedding-dim 40
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from ..config import nonnegative_float, positive_float, positive_int
from ..planning.plan import ShardingPlan
from .collectives import ALL_REDUCE_ALGORITHMS
from .fattree import ROUTINGS
from .flexflow import COMPAT_MODES, FIT_ROUND_LATENCY, FIT_TABLE_PS_PER_VALUE, FlexFlowCompat, compat_report, \
    parse_opera_options, run_flexflow_iteration
from .networks import NETWORKS, cluster_for, make_network
from .simulator import SimResult, simulate
from .spec import CLUSTER_PRESETS, ClusterSpec
from .trace_sim import add_trace_arguments, free_core_flag, simulate_trace
from .workload import PLACEMENTS, IterationSpec, build_iteration, opera_model_a, opera_model_i

__all__ = ["add_simulate_arguments", "simulate_command", "make_network", "run_iteration", "NETWORKS",
           "cluster_for", "model_for"]

def model_for(name: str, tables: int | None = None, dim: int | None = None):
    """'opera_model_a' / 'opera_model_i' (the study's Model-A / Model-I, ``tables`` of them, of
    embedding dimension ``dim``) or a config preset's model."""
    studies = {"opera_model_a": (opera_model_a, 1000, 80), "opera_model_i": (opera_model_i, 361, 92)}
    if name in studies:
        make, t, d = studies[name]
        if dim is not None and dim < 1:
            raise ValueError(f"embedding dimension must be >= 1, got {dim}")
        return make(tables if tables is not None else t, dim=dim if dim is not None else d)
    if dim is not None:
        raise ValueError(f"--embedding-dim applies to opera_model_a / opera_model_i, not to {name!r}")
    from ..config import preset

    m = preset(name).model
    if tables is not None:
        m = m.replace(tables=m.tables[:tables])
    return m


def run_iteration(model, cluster: ClusterSpec, network: str, allreduce: str, *, global_batch: int = 524_288,
                  bulk_threshold: float = 0.0, vlb: bool = True, a2a: str = "direct", input_dist: bool = False,
                  placement: str = "planner", aggregate: bool = True, fast_forward: bool = True,
                  seed: int = 0, routing: str = "spray", table_wise_only: bool = True,
                  compat: FlexFlowCompat | None = None, opera_options: dict[str, Any] | None = None,
                  plan: ShardingPlan | None = None, progress: float | bool = False,
                  ) -> tuple[SimResult, dict[str, Any]]:
    """Simulate one iteration; returns the result and a flat summary row (seconds, bytes).
    ``compat``: the flexflow compat mode instead (``flexflow.run_flexflow_iteration``; ``a2a``,
    ``input_dist``, ``placement``, ``routing`` and ``table_wise_only`` are the mode's own then).
    ``plan``: simulate this plan instead of placing the tables (``IterationSpec.plan``).
    ``progress``: ``simulate``'s (a stderr line every that many seconds of a long simulation)."""
    if compat is not None:
        if plan is not None:
            raise ValueError("a plan cannot be given with the flexflow compat mode (it places tables round robin)")
        if opera_options:
            compat = dataclasses.replace(compat, opera_options=compat.opera_options + tuple(opera_options.items()))
        return run_flexflow_iteration(model, cluster, network, allreduce, global_batch=global_batch, compat=compat,
                                      bulk_threshold=bulk_threshold, vlb=vlb, seed=seed, aggregate=aggregate,
                                      fast_forward=fast_forward, progress=progress)
    if allreduce == "auto":
        allreduce = "dps" if network == "opera" else "ring"
    it = build_iteration(IterationSpec(model, cluster, global_batch, allreduce, a2a, input_dist, placement,
                                       table_wise_only, plan=plan))
    net = make_network(network, cluster, bulk_threshold=bulk_threshold, vlb=vlb, seed=seed, routing=routing,
                       opera_options=opera_options)
    res = simulate(it.phases, net, aggregate=aggregate, fast_forward=fast_forward, progress=progress)
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
    p.add_argument("--model", "--preset", dest="model", default="opera_model_a",
                   help="opera_model_a (the ISI study's Model-A, default), opera_model_i (its Model-I) or a config "
                        "preset (model_a is Neo's; --preset, as in train and plan, is the same option)")
    p.add_argument("--tables", type=positive_int,
                   help="use this many tables (opera_model_a: 1000 by default, opera_model_i: 361)")
    p.add_argument("--embedding-dim", type=positive_int,
                   help="opera_model_a / opera_model_i: embedding dimension (80 / 92 by default)")
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
    p.add_argument("--routing", choices=ROUTINGS,
                   help="fat-tree: spray (per-packet, ideal; the default) or ecmp (one hashed path per flow, as TCP; "
                        "the default with --compat flexflow)")
    p.add_argument("--opera-option", action="append", metavar="KEY=VALUE",
                   help="Opera: pass a further OperaNetwork keyword (repeatable; true/false and numbers are parsed)")
    p.add_argument("--input-dist", action="store_true", help="also exchange ids/lengths (off in the study)")
    p.add_argument("--placement", choices=PLACEMENTS,
                   help="how tables are placed (default planner; --compat flexflow: round_robin by node)")
    p.add_argument("--plan", type=Path,
                   help="simulate this sharding plan (the JSON `neo-train plan --out` writes) instead of planning one")
    p.add_argument("--any-sharding", action="store_true",
                   help="let the planner use every sharding type (default: whole tables only, as the study)")
    p.add_argument("--compat", choices=COMPAT_MODES,
                   help="flexflow: the ISI study's FlexFlow + htsim setup (node-serial nodes, round-robin tables, a "
                        "per-table time, 8-byte all-to-all elements, one all-reduce per layer, TCP round latency and "
                        "ECMP on the fat-tree; notes/flexflow_compat.md)")
    p.add_argument("--table-ps-per-value", type=positive_float,
                   help=f"--compat flexflow: a table's forward + backward time, picoseconds per looked-up value "
                        f"(global batch x ids per bag x dim); default {FIT_TABLE_PS_PER_VALUE:g} (fitted)")
    p.add_argument("--round-latency-us", type=nonnegative_float,
                   help=f"--compat flexflow: fat-tree TCP latency per dependent round, microseconds; default "
                        f"{FIT_ROUND_LATENCY * 1e6:g} (fitted)")
    p.add_argument("--opera-ring", choices=("htsim", "engine"),
                   help="--compat flexflow, Opera + ring: 'htsim' (default) every dependent round lasts what the "
                        "study's RotorLB planner gives it (rotorlb.htsim_ring_round); 'engine' flow-simulates the "
                        "rings like the other traffic (concurrent rings share each round's circuit wait)")
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


def _compat_from_args(args: argparse.Namespace) -> FlexFlowCompat | None:
    """The compat mode's knobs from the flags; flags that contradict the mode (or its knobs
    without the mode) are a one-line ValueError."""
    knobs = {"--table-ps-per-value": args.table_ps_per_value, "--round-latency-us": args.round_latency_us,
             "--opera-ring": args.opera_ring}
    if args.compat is None:
        given = [k for k, v in knobs.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to --compat flexflow only")
        return None
    clash = [flag for flag, bad in (("--trace", args.trace is not None), ("--input-dist", args.input_dist),
                                    ("--any-sharding", args.any_sharding), ("--a2a pairwise", args.a2a != "direct"),
                                    ("--placement planner", args.placement == "planner"),
                                    ("--plan", args.plan is not None),
                                    ("--allreduce hier_*", args.allreduce.startswith("hier"))) if bad]
    if clash:
        raise ValueError(f"--compat {args.compat} fixes these itself (the study's setup): {', '.join(clash)} "
                         "cannot be combined with it")
    return FlexFlowCompat.named(args.compat, table_ps_per_value=args.table_ps_per_value,
                                round_latency=None if args.round_latency_us is None else args.round_latency_us * 1e-6,
                                routing=args.routing, opera_ring=args.opera_ring)


def _plan_from_args(args: argparse.Namespace) -> ShardingPlan | None:
    """``--plan FILE`` read (a one-line ValueError naming the file when it cannot be), or None;
    the flags that place tables themselves cannot come with it."""
    if args.plan is None:
        return None
    clash = [flag for flag, bad in (("--trace", args.trace is not None), ("--any-sharding", args.any_sharding),
                                    ("--placement", args.placement is not None)) if bad]
    if clash:
        raise ValueError(f"--plan places the tables itself: {', '.join(clash)} cannot be combined with it")
    try:
        return ShardingPlan.from_json(str(args.plan))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--plan {args.plan}: not a readable sharding plan ({e})") from None


def simulate_command(args: argparse.Namespace) -> int:
    GB = 1e9
    overrides = dict(inter_node_bandwidth=args.nic_gbps * 1e9 / 8 if args.nic_gbps else None,
                     device_flops=args.gpu_tflops * 1e12 if args.gpu_tflops else None,
                     hbm_bandwidth=args.hbm_gbps * GB if args.hbm_gbps else None)
    thr = args.bulk_threshold_mb * 1e6
    if args.out:
        _check_out_dir(args.out)
    if not args.trace:  # these describe a recorded run; a model's compute comes from its roofline
        given = [flag for flag, v in (("--compute", args.compute), ("--calibration", args.calibration),
                                      ("--warmup-steps", args.warmup_steps is not None)) if v]
        free_core = free_core_flag(args)
        if free_core:
            given.append(free_core)
        if given:
            raise ValueError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --trace only "
                             "(they describe a recorded run)")
    plan = _plan_from_args(args)
    compat = _compat_from_args(args)
    opera_options = dict(parse_opera_options(args.opera_option))
    if opera_options and args.network != "opera":
        raise ValueError(f"--opera-option applies to --network opera, not {args.network}")
    args.routing = args.routing or "spray"
    args.placement = args.placement or "planner"
    t0 = time.perf_counter()
    if args.trace:
        if opera_options:
            raise ValueError("--opera-option does not apply to --trace")
        res, row, cluster = simulate_trace(args, overrides, thr)
    else:
        cluster = cluster_for(args.topology, args.nodes or 128, args.gpus_per_node, **overrides)
        model = model_for(args.model, args.tables, args.embedding_dim)
        res, row = run_iteration(model, cluster, args.network, args.allreduce, global_batch=args.global_batch,
                                 bulk_threshold=thr, vlb=not args.no_vlb, a2a=args.a2a, input_dist=args.input_dist,
                                 placement=args.placement, aggregate=not args.exact, fast_forward=not args.exact,
                                 seed=args.seed, routing=args.routing, table_wise_only=not args.any_sharding,
                                 compat=compat, opera_options=opera_options, plan=plan, progress=True)
    print(f"cluster: {cluster.describe()}")
    print(compat_report(res) if compat is not None else res.report())
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
