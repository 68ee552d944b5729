"""Topology: the cluster a plan is made for (devices, memories, links); imports no torch.distributed."""
from .spec import CLUSTER_PRESETS, ClusterSpec, measure_cpu_local, preset_cluster

__all__ = ["ClusterSpec", "CLUSTER_PRESETS", "preset_cluster", "measure_cpu_local"]
