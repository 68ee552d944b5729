"""``neo-train simulate --trace``: a recorded comms trace on the cluster it implies.

The cluster follows the trace (``trace_cluster_shape``): GPUs per node = the largest divisor of the
trace's world size up to the topology's (a 4-rank trace on an 8-GPU topology is one node of 4),
nodes = the nodes the ranks fill (Opera: its smallest study layout, 16 / 128 / 1024, that holds
them); an explicit --gpus-per-node must divide the world size and an explicit --nodes must hold the
ranks, else a ValueError naming the flags. ``--compute`` takes the trace's phase markers (seconds
of compute before each run of that marker's collectives); neo_train's traces carry input_dist,
output_dist, output_dist_bwd, dense_allreduce, metrics, ...; a name the trace lacks is an error
listing the ones it has.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from .networks import cluster_for, make_network
from .simulator import SimResult, simulate
from .spec import ClusterSpec
from .trace_input import check_compute_markers, load_trace, trace_markers, trace_phases, trace_world_size

__all__ = ["add_trace_arguments", "simulate_trace", "trace_cluster_shape"]


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """The ``neo-train simulate`` flags of trace mode."""
    p.add_argument("--trace", type=Path, help="simulate a recorded param comms trace (dir or JSON) instead")
    p.add_argument("--compute", default="",
                   help="with --trace: seconds of compute before each run of a phase marker's collectives, e.g. "
                        "output_dist=0.002,output_dist_bwd=0.01,dense_allreduce=0.005 (neo_train's markers; a name "
                        "the trace lacks is an error listing its markers)")


def trace_cluster_shape(world: int, default_gpus: int, *, nodes: int | None = None, gpus_per_node: int | None = None,
                        network: str = "fattree") -> tuple[int, int]:
    """(nodes, GPUs per node) for simulating a trace of ``world`` ranks (rank r on node r // G).

    G: ``gpus_per_node`` when given (it must divide ``world``), else the largest divisor of
    ``world`` up to ``default_gpus`` (the topology's): a trace recorded on one machine with fewer
    ranks than the topology's GPUs per node is one node of ``world`` GPUs; a multiple of the
    topology's keeps it. Nodes: ``nodes`` when given (it must hold world // G nodes), else
    world // G (Opera: the smallest of its study layouts, 16 / 128 / 1024, that holds them).
    Inconsistent explicit values are a one-line ValueError naming the flags."""
    if world < 1:
        raise ValueError(f"the trace's world size must be >= 1, got {world}")
    if gpus_per_node is not None:
        G = gpus_per_node
        if world % G:
            raise ValueError(f"--gpus-per-node {G} does not divide the trace's world size {world} (rank r runs on node "
                             f"r // {G}); give a divisor of {world}, or leave --gpus-per-node out to derive it")
    else:
        G = max(d for d in range(1, min(default_gpus, world) + 1) if world % d == 0)
    need = world // G
    if nodes is not None:
        if nodes < need:
            how = f"--gpus-per-node {G}" if gpus_per_node is not None else f"{G} GPUs per node (derived from the trace)"
            raise ValueError(f"--nodes {nodes} is too few for the trace: its {world} ranks at {how} need {need} nodes")
        return nodes, G
    if network == "opera":
        from .opera import OPERA_PRESETS

        return next((n for n in sorted(OPERA_PRESETS) if n >= need), need), G
    return need, G


def _parse_compute(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        if "=" not in part:
            raise ValueError(f"--compute: expected marker=seconds, got {part!r}")
        k, v = (x.strip() for x in part.rsplit("=", 1))
        try:
            sec = float(v)
        except ValueError:
            raise ValueError(f"--compute: {k}={v!r} is not a number of seconds") from None
        if not math.isfinite(sec):
            raise ValueError(f"--compute: {k}={v}: seconds must be a finite number, got {v}")
        if sec < 0:
            raise ValueError(f"--compute: {k}={v}: seconds must be >= 0, got {v}")
        out[k] = sec
    return out


def simulate_trace(args: argparse.Namespace, overrides: dict[str, Any], bulk_threshold: float
                   ) -> tuple[SimResult, dict[str, Any], ClusterSpec]:
    """``neo-train simulate --trace``: the recorded trace on the cluster it derives (see the module
    docstring); returns the result, the summary row and the cluster."""
    compute = _parse_compute(args.compute)
    traces = load_trace(args.trace)
    world = trace_world_size(traces)
    check_compute_markers(trace_markers(traces), compute, "--compute")
    default_gpus = cluster_for(args.topology, 1).devices_per_node
    nodes, G = trace_cluster_shape(world, default_gpus, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                                   network=args.network)
    cluster = cluster_for(args.topology, nodes, G, **overrides)
    derived = "" if args.gpus_per_node else f" (GPUs per node derived from the trace; the topology has {default_gpus})"
    print(f"trace: {world} ranks on {world // G} node(s) of {G} GPUs{derived}")
    ar = "ring" if args.allreduce == "auto" and args.network != "opera" else (
        "dps" if args.allreduce == "auto" else args.allreduce)
    net = make_network(args.network, cluster, bulk_threshold=bulk_threshold, vlb=not args.no_vlb, seed=args.seed,
                       routing=args.routing)
    net.hosts_for(world)  # a clear error when the trace needs more hosts
    phases = trace_phases(traces, G, compute, allreduce=ar)
    res = simulate(phases, net, aggregate=not args.exact, fast_forward=not args.exact)
    row: dict[str, Any] = {"trace": str(args.trace), "nodes": cluster.nodes, "network": args.network,
                           "allreduce": ar, "iteration_s": res.total, **res.totals()}
    return res, row, cluster
