"""A k-ary fat-tree (Al-Fares et al.): k pods of k/2 edge and k/2 aggregation switches, (k/2)^2
core switches, k/2 hosts per edge switch, k^3/4 hosts. 1:1 (full bisection) unless
``oversubscription`` > 1 thins the edge and core uplinks.

    net = FatTree(nodes=128)                  # K = 8, the smallest even K with K^3/4 >= 128
    net = FatTree(nodes=128, routing="ecmp")  # every flow pinned to one hashed path
    net.k, net.describe()

Routing, two flow models:
- ``spray`` (default): traffic is spread evenly over the equal-cost paths (per-packet ECMP), so
  the k/2 uplinks of an edge switch act as one pooled link of k/2 * B / o and the (k/2)^2 core
  links of a pod as one of (k/2)^2 * B / o. With o = 1 these pools never bind before the NICs
  do: the fat-tree is a non-blocking switch.
- ``ecmp``: each flow takes one path chosen by a hash of (source, destination), as TCP flows do
  under per-flow ECMP: uplink j1 of its edge switch (to aggregation switch j1), then core port j2
  of that switch (to core switch (j1, j2)), down through aggregation switch j1 of the destination
  pod. Collisions of large flows on one link then slow an all-to-all below the NIC bound. Every
  link is its own constraint of B / o.
TCP's own dynamics (slow start, incast losses) are not modelled; ``flow_latency`` adds a fixed
TCP-like cost to every inter-host flow instead (connection start, slow start, the last ACK), which
the simulator charges once per dependent round, at the round's end, on top of the path's hops x
hop_latency (``--compat flexflow`` fits it: ``flexflow.py``). Hops: 2 within an edge switch, 4
within a pod, 6 across pods.
"""
from __future__ import annotations

import math

import numpy as np

from .network import GBPS, Network, Routes

__all__ = ["FatTree", "fat_tree_k", "ROUTINGS"]

ROUTINGS = ("spray", "ecmp")


def fat_tree_k(nodes: int) -> int:
    """The smallest even K with K^3/4 >= nodes (4 for 16, 8 for 128, 16 for 1024)."""
    if nodes < 1:
        raise ValueError(f"fat-tree: nodes must be >= 1, got {nodes}")
    k = 2
    while k**3 // 4 < nodes:
        k += 2
    return k


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a well-spread 64-bit hash of each element."""
    with np.errstate(over="ignore"):
        x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class FatTree(Network):
    name = "fattree"

    def __init__(self, nodes: int, host_bandwidth: float = 100 * GBPS, hop_latency: float = 1e-6,
                 devices_per_host: int = 1, intra_bandwidth: float = 200 * GBPS, k: int | None = None,
                 oversubscription: float = 1.0, routing: str = "spray", seed: int = 0,
                 flow_latency: float = 0.0) -> None:
        self._init_host(nodes, host_bandwidth, hop_latency, devices_per_host, intra_bandwidth)
        if k is None:
            k = fat_tree_k(nodes)
        if k < 2 or k % 2:
            raise ValueError(f"fat-tree: k must be an even integer >= 2, got {k}")
        if k**3 // 4 < nodes:
            raise ValueError(f"fat-tree: k = {k} hosts only {k**3 // 4} nodes, fewer than {nodes}")
        if not oversubscription >= 1:
            raise ValueError(f"fat-tree: oversubscription must be >= 1, got {oversubscription}")
        if routing not in ROUTINGS:
            raise ValueError(f"fat-tree: routing must be one of {ROUTINGS}, got {routing!r}")
        if not (isinstance(flow_latency, (int, float)) and math.isfinite(flow_latency) and flow_latency >= 0):
            raise ValueError(f"fat-tree: flow_latency must be a finite number of seconds >= 0, got {flow_latency!r}")
        if flow_latency > 0 and self.hop_latency <= 0:
            raise ValueError("fat-tree: flow_latency needs hop_latency > 0 (it is charged in units of hop_latency)")
        self.k, self.oversubscription, self.routing, self.seed = k, float(oversubscription), routing, seed
        self.flow_latency = float(flow_latency)
        self.half = half = k // 2
        self.rack_of = np.arange(nodes) // half  # edge switch of each host
        self.pod_of_rack = np.arange(k * half) // half
        self.edges, self.pods = k * half, k
        # links, per direction: spray: one pool per edge and per pod; ecmp: edge uplink j of
        # each edge (half per edge), core port (j1, j2) of each pod (half^2 per pod)
        self.per_edge = 1 if routing == "spray" else half
        self.per_pod = 1 if routing == "spray" else half * half
        self.class_split = routing == "spray"

    def net_capacity(self) -> np.ndarray:
        half, B, o = self.half, self.host_bandwidth, self.oversubscription
        if self.routing == "spray":
            return np.concatenate([np.full(2 * self.edges, half * B / o), np.full(2 * self.pods, half * half * B / o)])
        return np.full(2 * self.edges * self.per_edge + 2 * self.pods * self.per_pod, B / o)

    def _link(self, kind: str, idx: np.ndarray) -> np.ndarray:
        E, P = self.edges * self.per_edge, self.pods * self.per_pod
        base = self.first_net_link + {"edge_up": 0, "edge_down": E, "pod_up": 2 * E, "pod_down": 2 * E + P}[kind]
        return base + idx

    def _path(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(aggregation switch j1, core port j2) each flow hashes to (ecmp)."""
        key = src.astype(np.uint64) * np.uint64(self.hosts) + dst.astype(np.uint64)
        h = _mix(key + np.uint64(self.seed) * np.uint64(1 << 40))
        half = np.uint64(self.half)
        return (h % half).astype(np.int64), ((h // half) % half).astype(np.int64)

    def relation(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """0 same host, 1 same edge switch, 2 same pod, 3 across pods; under ecmp also the hashed
        path (flows on different paths load different links)."""
        rs, rd = self.rack_of[src], self.rack_of[dst]
        same_pod = self.pod_of_rack[rs] == self.pod_of_rack[rd]
        rel = np.select([src == dst, rs == rd, same_pod], [0, 1, 2], 3)
        if self.routing == "ecmp":
            j1, j2 = self._path(src, dst)
            rel = np.where(rel >= 2, rel + 4 * (1 + j1 * self.half + np.where(rel == 3, j2, 0)), rel)
        return rel

    def hops(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Links on each flow's path; with ``flow_latency`` the latency in hop_latency units: an
        inter-host flow's hops plus flow_latency / hop_latency (the simulator charges a round's
        latency as hops x hop_latency)."""
        rs, rd = self.rack_of[src], self.rack_of[dst]
        same_pod = self.pod_of_rack[rs] == self.pod_of_rack[rd]
        h = np.select([src == dst, rs == rd, same_pod], [0, 2, 4], 6)
        if self.flow_latency > 0:
            return np.where(src == dst, h, h + self.flow_latency / self.hop_latency)
        return h

    def routes(self, src: np.ndarray, dst: np.ndarray) -> Routes:
        rs, rd = self.rack_of[src], self.rack_of[dst]
        ps, pd = self.pod_of_rack[rs], self.pod_of_rack[rd]
        up = np.flatnonzero(rs != rd)
        core = np.flatnonzero(ps != pd)
        if self.routing == "spray":
            e_up, e_down = rs[up], rd[up]
            c_up, c_down = ps[core], pd[core]
        else:
            j1, j2 = self._path(src, dst)
            e_up, e_down = rs[up] * self.half + j1[up], rd[up] * self.half + j1[up]
            port = j1[core] * self.half + j2[core]
            c_up, c_down = ps[core] * self.per_pod + port, pd[core] * self.per_pod + port
        members = np.concatenate([up, up, core, core]).astype(np.int64)
        links = np.concatenate([self._link("edge_up", e_up), self._link("edge_down", e_down),
                                self._link("pod_up", c_up), self._link("pod_down", c_down)]).astype(np.int64)
        return Routes(members, links)

    def describe(self) -> str:
        o = "" if self.oversubscription == 1 else f", {self.oversubscription:g}:1 oversubscribed"
        r = "per-packet spraying" if self.routing == "spray" else "per-flow ECMP"
        lat = f", {self.flow_latency * 1e6:g} us per flow (TCP)" if self.flow_latency > 0 else ""
        return (f"fat-tree K={self.k}: {self.hosts} of {self.k**3 // 4} hosts x {self.devices_per_host} devices, "
                f"NIC {self.host_bandwidth / GBPS:g} Gbps{o}, {r}{lat}")
