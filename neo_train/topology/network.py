"""What the flow simulator needs from a network: hosts with NICs, racks, links and routes.

A *host* is a node of G devices (GPUs) behind one NIC of ``host_bandwidth`` (the ISI study folds 8
GPUs into one host with a 100 Gbps NIC). Traffic between two devices of one host crosses the
node's internal fabric instead, modelled as one link per host of G * ``intra_bandwidth``.

Link index space (what ``simulator.max_min_rates`` allocates over), for N hosts:

    [0, N)        NIC up (host -> network)          capacity host_bandwidth
    [N, 2N)       NIC down (network -> host)        capacity host_bandwidth
    [2N, 3N)      intra-host fabric                  capacity G * intra_bandwidth
    [3N, ...)     the topology's own links (switch uplinks, pods, Opera circuits ...)

Units: bytes, bytes/s, seconds. Bandwidths are per direction of a full-duplex link.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Network", "Routes", "GBPS", "check_positive"]

GBPS = 1e9 / 8  # bytes/s in one Gbit/s


def check_positive(where: str, **values: float) -> None:
    for k, v in values.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{where}.{k} must be a positive number, got {v!r}")


@dataclass(frozen=True)
class Routes:
    """Static network links of a batch of host-to-host flows: flow ``member[i]`` crosses link
    ``link[i]`` (one entry per link crossed; NIC and intra-host links are not listed)."""

    member: np.ndarray
    link: np.ndarray


class Network:
    """Base of the topologies: hosts, racks, the NIC/intra-host links and a static route table.

    Subclasses set ``hosts``, ``host_bandwidth``, ``hop_latency``, ``devices_per_host``,
    ``intra_bandwidth`` and ``rack_of`` (an (N,) int array), and override ``net_capacity``,
    ``relation`` and ``routes``. ``time_varying`` networks (Opera) add an epoch model the
    simulator asks for separately.
    """

    name: str = "network"
    hosts: int
    host_bandwidth: float
    hop_latency: float
    devices_per_host: int
    intra_bandwidth: float
    rack_of: np.ndarray
    time_varying: bool = False
    class_split: bool = True
    """Whether the simulator splits bundles by host class (``flows.host_classes``). Off where flows
    of one bundle differ anyway (per-flow ECMP paths), so splitting would only cost time."""

    # ---- link space -------------------------------------------------------------------------
    @property
    def first_net_link(self) -> int:
        return 3 * self.hosts

    def net_capacity(self) -> np.ndarray:
        """Capacities of the topology's own links (bytes/s), indexed from ``first_net_link``."""
        return np.zeros(0)

    def capacity(self) -> np.ndarray:
        """Capacity of every link: NICs, intra-host fabrics, then the topology's links."""
        N = self.hosts
        return np.concatenate([
            np.full(2 * N, float(self.host_bandwidth)),
            np.full(N, float(self.devices_per_host * self.intra_bandwidth)),
            self.net_capacity(),
        ])

    @property
    def intra_capacity(self) -> float:
        return float(self.devices_per_host * self.intra_bandwidth)

    # ---- routing ----------------------------------------------------------------------------
    def relation(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """An int per flow such that flows with equal bytes and equal relation are symmetric
        (the simulator may merge them into one bundle). 0 is reserved for same-host flows."""
        return np.where(src == dst, 0, 1)

    def routes(self, src: np.ndarray, dst: np.ndarray) -> Routes:
        """Static topology links each flow crosses (besides its NICs); none for a flat switch."""
        e = np.zeros(0, dtype=np.int64)
        return Routes(e, e)

    def hops(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Links on each flow's path (latency = hops * hop_latency); 0 within a host."""
        return np.where(src == dst, 0, 2)

    # ---- sizes ------------------------------------------------------------------------------
    def hosts_for(self, world_size: int) -> int:
        """Hosts a job of ``world_size`` ranks occupies (G per host); a clear error when the
        topology cannot host it."""
        G = self.devices_per_host
        if world_size < 1 or world_size % G:
            raise ValueError(f"{self.name}: world size {world_size} is not a positive multiple of the "
                             f"{G} devices per host")
        if world_size // G > self.hosts:
            raise ValueError(f"{self.name}: world size {world_size} needs {world_size // G} hosts of {G} devices "
                             f"but the topology has {self.hosts}")
        return world_size // G

    def describe(self) -> str:
        return f"{self.name}: {self.hosts} hosts, NIC {self.host_bandwidth / GBPS:g} Gbps"

    def _init_host(self, hosts: int, host_bandwidth: float, hop_latency: float, devices_per_host: int,
                   intra_bandwidth: float) -> None:
        if not (isinstance(hosts, int) and hosts >= 1):
            raise ValueError(f"{self.name}: hosts must be an integer >= 1, got {hosts!r}")
        if not (isinstance(devices_per_host, int) and devices_per_host >= 1):
            raise ValueError(f"{self.name}: devices_per_host must be an integer >= 1, got {devices_per_host!r}")
        check_positive(self.name, host_bandwidth=host_bandwidth, intra_bandwidth=intra_bandwidth)
        if not (math.isfinite(hop_latency) and hop_latency >= 0):
            raise ValueError(f"{self.name}.hop_latency must be >= 0, got {hop_latency!r}")
        self.hosts = hosts
        self.host_bandwidth = float(host_bandwidth)
        self.hop_latency = float(hop_latency)
        self.devices_per_host = devices_per_host
        self.intra_bandwidth = float(intra_bandwidth)
