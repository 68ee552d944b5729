"""The simulated network of a cluster: ``make_network`` (flat / fat-tree / Opera, cached),
``cluster_for`` (a preset or TOML cluster with its nodes and GPUs per node replaced) and
``job_cluster`` (the cluster a job's ranks run on, as its cost model prices it).

    net = make_network("opera", cluster_for("opera_study", 128))
"""
from __future__ import annotations

from typing import Any, Mapping

from .fattree import FatTree
from .flat import FlatNetwork
from .network import Network
from .opera import OperaNetwork
from .spec import ClusterSpec, cluster_spec

__all__ = ["NETWORKS", "make_network", "cluster_for", "job_cluster"]

NETWORKS = ("opera", "fattree", "flat")
_NETS: dict = {}


def make_network(kind: str, cluster: ClusterSpec, *, bulk_threshold: float = 0.0, vlb: bool = True,
                 seed: int = 0, k: int | None = None, routing: str = "spray", flow_latency: float = 0.0,
                 opera_options: Mapping[str, Any] | None = None) -> Network:
    """The network of ``cluster.nodes`` hosts, each with the cluster's NIC, GPUs and intra-node
    bandwidth, and its inter-node latency per hop. Opera: the study's rack layout for 16 / 128 /
    1024 nodes, else ``k`` ToR ports, plus any further ``OperaNetwork`` keyword ``opera_options``
    (passed through unchecked here; an unknown one is a ValueError naming it); fat-tree:
    ``routing`` spray or ecmp and a TCP-like ``flow_latency`` per flow (seconds, charged once per
    dependent round). Cached: an Opera schedule search takes up to seconds."""
    opts = dict(opera_options or {})
    if "k" in opts and kind == "opera":  # the ToR ports, an option of the rack layout (from_nodes)
        k = int(opts.pop("k"))
    if opts and kind != "opera":
        raise ValueError(f"opera options {sorted(opts)} given for a {kind} network")
    if flow_latency and kind != "fattree":
        raise ValueError(f"flow_latency applies to the fat-tree (TCP), not to {kind}")
    key = (kind, cluster, bulk_threshold, vlb, seed, k, routing, flow_latency, tuple(sorted(opts.items())))
    if key in _NETS:
        return _NETS[key]
    common = dict(host_bandwidth=cluster.inter_node_bandwidth, hop_latency=cluster.inter_node_latency,
                  devices_per_host=cluster.devices_per_node,
                  intra_bandwidth=cluster.intra_node_bandwidth)
    if kind == "flat":
        net: Network = FlatNetwork(cluster.nodes, **common)
    elif kind == "fattree":
        net = FatTree(cluster.nodes, k=k, routing=routing, seed=seed, flow_latency=flow_latency, **common)
    elif kind == "opera":
        try:
            net = OperaNetwork.from_nodes(cluster.nodes, k=k, bulk_threshold=bulk_threshold, vlb=vlb, seed=seed,
                                          **opts, **common)
        except TypeError as e:
            if not opts:
                raise
            raise ValueError(f"opera: an option in {sorted(opts)} is not an OperaNetwork parameter ({e})") from None
    else:
        raise ValueError(f"network must be one of {NETWORKS}, got {kind!r}")
    _NETS[key] = net
    if len(_NETS) > 16:
        _NETS.pop(next(iter(_NETS)))
    return net


def cluster_for(topology: str, nodes: int, gpus_per_node: int | None = None, **overrides: Any) -> ClusterSpec:
    """A cluster preset (or TOML file) with ``nodes`` (and optionally GPUs per node) replaced. An
    Opera-study-style cluster keeps one NIC per node: devices_per_nic follows the GPUs."""
    spec = cluster_spec(topology)
    G = gpus_per_node or spec.devices_per_node
    per_nic = G if spec.devices_per_nic == spec.devices_per_node else spec.devices_per_nic
    return spec.replace(nodes=nodes, devices_per_node=G, devices_per_nic=per_nic,
                        **{k: v for k, v in overrides.items() if v is not None})


def job_cluster(topology: str, world_size: int, local_world_size: int, device_type: str) -> ClusterSpec:
    """The cluster a job of ``world_size`` ranks, ``local_world_size`` a node, runs on, as the cost
    model sees it: ``topology`` (a preset or a cluster TOML file; '' -> ``cpu_local`` for CPU
    ranks, ``zionex`` for GPUs) with the job's nodes and devices per node (``cluster_for``). The
    auto planner and hot-row replication's ``auto`` (``planning.hot_rows.choose_hot_rows``) price
    the same cluster."""
    name = topology or ("cpu_local" if device_type == "cpu" else "zionex")
    return cluster_for(name, world_size // local_world_size, local_world_size)
