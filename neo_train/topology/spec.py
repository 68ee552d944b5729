"""The cluster a plan is made for: devices, memories, links. Shared by the planner's cost model
and the network simulator, so it imports no torch.distributed (and no torch at all).

    spec = preset_cluster("zionex")                 # 16 nodes x 8 A100-40GB, 200 Gbps NIC per GPU
    spec = spec.replace(nodes=128)                  # 1024 GPUs, same hardware
    spec.dump("cluster.toml"); assert ClusterSpec.load("cluster.toml") == spec

Units: bytes, bytes/s, seconds, FLOP/s. A bandwidth is one direction of a full-duplex link (a
device can send and receive at that rate at the same time). ``intra_node_bandwidth`` is what one
device gets to any peer in its node; ``inter_node_bandwidth`` is one NIC's rate, shared by
``devices_per_nic`` devices (1 on ZionEx: a NIC per GPU).
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ClusterSpec", "CLUSTER_PRESETS", "preset_cluster", "cluster_spec"]

GB = 1e9
GiB = 1 << 30
Gbps = 1e9 / 8  # bytes/s in one Gbit/s


@dataclass(frozen=True)
class ClusterSpec:
    """Nodes of identical devices; every field validated in ``__post_init__`` (errors name it)."""

    name: str
    """A label for reports."""
    nodes: int
    """Number of nodes (hosts) N."""
    devices_per_node: int
    """Devices (ranks) per node G; the world size is W = N * G."""
    device_memory_bytes: float
    """Memory of one device that tables, optimizer state and buffers may use (HBM on a GPU)."""
    host_memory_bytes: float
    """Host DRAM of one node (reported; a UVM-cached table tier would draw on it)."""
    hbm_bandwidth: float
    """Device memory bandwidth, bytes/s: embedding lookups and updates are bound by it."""
    intra_node_bandwidth: float
    """Per device, per direction, to peers in its node (NVLink / loopback), bytes/s."""
    intra_node_latency: float
    """Start-up cost of one intra-node message round, seconds."""
    inter_node_bandwidth: float
    """One NIC's rate per direction, bytes/s (shared by ``devices_per_nic`` devices)."""
    inter_node_latency: float
    """Start-up cost of one inter-node message round, seconds."""
    device_flops: float
    """Dense compute throughput of one device, FLOP/s (MLPs and interaction)."""
    devices_per_nic: int = 1
    """How many devices share one NIC: 1 on ZionEx (a NIC per GPU), 8 in the Opera study."""
    host_link_bandwidth: float = 25e9
    """One device's link to host memory per direction, bytes/s (PCIe 4.0 x16 ~25 GB/s): the
    misses of a cached table (rows fetched from, and written back to, host memory) cross it."""
    ssd_bandwidth: float = 6e9
    """A node's SSD tier per direction, bytes/s (an NVMe drive ~6 GB/s), shared by its devices:
    the misses of tables cached over the SSD tier."""
    hot_set_speedup: float = 1.0
    """How much faster than ``hbm_bandwidth`` the embedding kernels run over a small, hot working
    set that stays in the device's caches: hot-row replicas (``planning.hot_rows``). 1 prices it
    as the tables (GPU presets); a CPU's caches make it several times faster (``cpu_local``)."""

    def __post_init__(self) -> None:
        def check(ok: bool, fld: str, msg: str) -> None:
            if not ok:
                raise ValueError(f"cluster.{fld}: {msg}")

        check(bool(self.name), "name", "must be non-empty")
        for fld in ("nodes", "devices_per_node", "devices_per_nic"):
            v = getattr(self, fld)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, fld, f"must be an integer >= 1, got {v!r}")
        for fld in ("device_memory_bytes", "host_memory_bytes", "hbm_bandwidth", "intra_node_bandwidth",
                    "inter_node_bandwidth", "device_flops", "host_link_bandwidth", "ssd_bandwidth", "hot_set_speedup"):
            v = getattr(self, fld)
            check(isinstance(v, (int, float)) and math.isfinite(v) and v > 0, fld, f"must be a positive number, got {v!r}")
        for fld in ("intra_node_latency", "inter_node_latency"):
            v = getattr(self, fld)
            check(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, fld, f"must be a number >= 0, got {v!r}")
        check(self.devices_per_node % self.devices_per_nic == 0, "devices_per_nic",
              f"{self.devices_per_nic} does not divide devices_per_node {self.devices_per_node}")

    # ---- derived ------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def inter_node_bandwidth_per_device(self) -> float:
        """What one device gets off-node when every device sends at once (all-to-all, all-reduce)."""
        return self.inter_node_bandwidth / self.devices_per_nic

    @property
    def slowest_bandwidth(self) -> float:
        """Per-device bandwidth of the slowest link a world-wide collective crosses."""
        if self.nodes == 1:
            return self.intra_node_bandwidth
        return min(self.intra_node_bandwidth, self.inter_node_bandwidth_per_device)

    @property
    def slowest_latency(self) -> float:
        return self.intra_node_latency if self.nodes == 1 else max(self.intra_node_latency, self.inter_node_latency)

    def replace(self, **changes: Any) -> "ClusterSpec":
        """A copy with some fields changed (validated again), e.g. ``spec.replace(nodes=128)``."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        return (
            f"{self.name}: {self.nodes} nodes x {self.devices_per_node} devices = {self.world_size}; "
            f"{self.device_memory_bytes / GB:.1f} GB/device at {self.hbm_bandwidth / GB:,.1f} GB/s; "
            f"intra {self.intra_node_bandwidth / GB:,.2f} GB/s, inter {self.inter_node_bandwidth_per_device / GB:,.2f} "
            f"GB/s per device; {self.device_flops / 1e12:,.2f} TFLOP/s"
        )

    # ---- TOML ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClusterSpec":
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"cluster: unknown field(s) {unknown} (known: {sorted(names)})")
        missing = sorted(n for n, f in names.items() if n not in d and f.default is dataclasses.MISSING)
        if missing:
            raise ValueError(f"cluster: missing field(s) {missing}")
        kwargs: dict[str, Any] = {}
        for k, v in d.items():
            if names[k].type in ("float", float) and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)  # TOML writes 4e10 as an integer when it is one
            kwargs[k] = v
        return cls(**kwargs)

    def dumps(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.dumps())

    @classmethod
    def loads(cls, text: str) -> "ClusterSpec":
        try:
            d = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"cluster: not valid TOML: {e}") from None
        return cls.from_dict(d.get("cluster", d))

    @classmethod
    def load(cls, path: str | Path) -> "ClusterSpec":
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"cluster file {p} does not exist")
        try:
            return cls.loads(p.read_text())
        except ValueError as e:
            raise ValueError(f"{p}: {e}") from None


# ---- presets ------------------------------------------------------------------------------------

def _zionex() -> ClusterSpec:
    # Neo (ISCA'22), ZionEx: 8 A100-40GB per node (320 GB HBM), each GPU with its own 200 Gbps
    # RoCE NIC; 1.5 TB host DRAM per node. A100-40GB HBM2: 1,555 GB/s. NVLink3 on A100: 600 GB/s
    # total bidirectional, i.e. 300 GB/s per direction. Dense: A100 TF32 tensor-core peak
    # 156 TFLOP/s (the estimate is a lower bound on compute time). Latencies: typical NCCL
    # start-up costs (a few us over NVLink, ~5 us over RDMA), not measured.
    return ClusterSpec(
        name="zionex", nodes=16, devices_per_node=8,
        device_memory_bytes=40 * GiB, host_memory_bytes=1.5e12,
        hbm_bandwidth=1555 * GB,
        intra_node_bandwidth=300 * GB, intra_node_latency=2e-6,
        inter_node_bandwidth=200 * Gbps, inter_node_latency=5e-6,
        device_flops=156e12, devices_per_nic=1,
    )  # fmt: skip


def _opera_study() -> ClusterSpec:
    # The ISI Opera/DLRM study (shared/notes/network-model.md): 8 GPUs folded into one node with
    # one 100 Gbps NIC, 200 Gbps between GPUs in a node, 1 us network latency. GPU memory, HBM
    # and FLOPs are not given there: A100-40GB figures as in `zionex`.
    return ClusterSpec(
        name="opera_study", nodes=16, devices_per_node=8,
        device_memory_bytes=40 * GiB, host_memory_bytes=1.5e12,
        hbm_bandwidth=1555 * GB,
        intra_node_bandwidth=200 * Gbps, intra_node_latency=1e-6,
        inter_node_bandwidth=100 * Gbps, inter_node_latency=1e-6,
        device_flops=156e12, devices_per_nic=8,
    )  # fmt: skip


def _cpu_local() -> ClusterSpec:
    # This development machine (2-core Xeon VM, 23 GiB RAM): gloo ranks on one host, one thread
    # each. Numbers from comm.probe.measure_cpu_local() and benchmarks/embedding.py run here, rounded:
    #   memory      copy 6-17 GB/s (it varies with the other load on the VM), but the fused
    #               embedding kernels gather rows at 1.2-1.9 GB/s forward (embedding.py,
    #               modelA100 slice, 20k-row tables): lookups and updates are priced at an
    #               effective 1.5 GB/s. With small, cache-resident tables (benchmarks/planner.py
    #               part b) fbgemm's forward runs ~4x faster and its backward slower than that:
    #               the sum of the two phases comes out close, the split between them does not
    #   loopback    gloo all-to-all of 16 MB, per direction per rank: 0.98 GB/s at 2 ranks, 0.65
    #               at 4 (2026-11-24, the Intel VM, the ranks with huge pages; an earlier run on
    #               the AMD VM gave 0.17); 0.6 taken, as training's compute shares the cores (the
    #               b = 4096 hot-rows benchmark's pooled exchange moves ~0.8 GB/s at 2 ranks);
    #               200 - 550 us per collective round (tiny all-to-all, 2 and 4 ranks)
    #   dense       ~60 GFLOP/s (1024^3 float32 matmul, one thread)
    #   hot set     hot-row replicas (k rows of a table, a few MB, every step's most used) stay
    #               in the caches: fbgemm's forward on small cache-resident tables runs ~4x the
    #               rate above (benchmarks/planner.py part b); the replicas' replay (its forward
    #               and fused update) moved 12.7 GB/s by the cost formulas' bytes (b = 4096, D =
    #               128, 2 ranks; notes/hot_rows.md); 4x taken
    # Memory: a quarter of the RAM per rank, so 4 ranks plus the OS and the test runner fit.
    # Deterministic on purpose: plans must not change with the machine's load.
    return ClusterSpec(
        name="cpu_local", nodes=1, devices_per_node=2,
        device_memory_bytes=5 * GiB, host_memory_bytes=23 * GiB,
        hbm_bandwidth=1.5 * GB,
        intra_node_bandwidth=0.6 * GB, intra_node_latency=300e-6,
        inter_node_bandwidth=0.6 * GB, inter_node_latency=300e-6,
        device_flops=60e9, devices_per_nic=1, hot_set_speedup=4.0,
    )  # fmt: skip


_PRESETS = {"zionex": _zionex, "opera_study": _opera_study, "cpu_local": _cpu_local}
CLUSTER_PRESETS: tuple[str, ...] = tuple(_PRESETS)


def preset_cluster(name: str, **overrides: Any) -> ClusterSpec:
    """A named cluster; ``overrides`` (e.g. ``nodes=128``) replace fields."""
    if name not in _PRESETS:
        raise ValueError(f"unknown topology '{name}' (known: {', '.join(CLUSTER_PRESETS)})")
    spec = _PRESETS[name]()
    return spec.replace(**overrides) if overrides else spec


def cluster_spec(name_or_path: str) -> ClusterSpec:
    """A cluster preset by name, else a cluster TOML file; neither is one ValueError naming both."""
    if name_or_path in _PRESETS:
        return preset_cluster(name_or_path)
    if not Path(name_or_path).exists():
        raise ValueError(f"topology '{name_or_path}' is neither a cluster preset ({', '.join(CLUSTER_PRESETS)}) "
                         f"nor a cluster TOML file")
    return ClusterSpec.load(name_or_path)
