"""Topology: the cluster a plan is made for (devices, memories, links), network models (flat,
fat-tree, Opera) and the flow-level simulator; imports no torch.distributed."""
from .collectives import all_reduce, all_to_all, dps_all_reduce, hierarchical_all_reduce, ring_all_reduce
from .fattree import FatTree
from .flat import FlatNetwork
from .opera import OperaNetwork
from .simulator import Comm, Compute, SimResult, Transfer, simulate
from .spec import CLUSTER_PRESETS, ClusterSpec, preset_cluster

__all__ = [
    "ClusterSpec", "CLUSTER_PRESETS", "preset_cluster",
    "FlatNetwork", "FatTree", "OperaNetwork",
    "Transfer", "Comm", "Compute", "SimResult", "simulate",
    "all_to_all", "ring_all_reduce", "dps_all_reduce", "hierarchical_all_reduce", "all_reduce",
]  # fmt: skip
