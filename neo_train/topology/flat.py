"""A full-bisection switch: every host one NIC of bandwidth B into a non-blocking fabric.

    net = FlatNetwork(hosts=16, host_bandwidth=100 * GBPS)

The only shared resources are the NICs (and each host's internal fabric), so an all-to-all takes
exactly its NIC lower bound and a ring step bytes/B. Paths are two links (host -> switch -> host).
"""
from __future__ import annotations

import numpy as np

from .network import GBPS, Network

__all__ = ["FlatNetwork"]


class FlatNetwork(Network):
    name = "flat"

    def __init__(self, hosts: int, host_bandwidth: float = 100 * GBPS, hop_latency: float = 1e-6,
                 devices_per_host: int = 1, intra_bandwidth: float = 200 * GBPS) -> None:
        self._init_host(hosts, host_bandwidth, hop_latency, devices_per_host, intra_bandwidth)
        self.rack_of = np.zeros(hosts, dtype=np.int64)

    def describe(self) -> str:
        return (f"flat: {self.hosts} hosts x {self.devices_per_host} devices, NIC {self.host_bandwidth / GBPS:g} Gbps, "
                f"full bisection")
