"""``--compat flexflow``: the ISI Opera/DLRM study's setup (FlexFlow's task graph replayed in htsim)
as a named simulation mode, so that an iteration time here can be set beside the study's.

    neo-train simulate --compat flexflow --nodes 16 --network fattree --allreduce ring
    neo-train simulate --compat flexflow --nodes 128 --network opera --opera-option KEY=VALUE
    res, row = run_flexflow_iteration(opera_model_a(), cluster_for("opera_study", 128), "opera", "dps")

What the study's pipeline does (its job scripts, and the simulator sources of usc-isi/STEAM-FlexFlow
branch 2024-euromlsys and of its htsim fork Flasew/ffsim-opera at the commit the branch pins; read,
not copied), and what this mode does in its place. N nodes, T tables, B global batch, L ids per
bag, D embedding dimension, G = 8 GPUs per node.

1. Node-serial device. FlexFlow's ``--big-gpu 8`` folds a node's 8 GPUs into one device, and
   htsim runs a device's compute tasks one after another (a ready task waits while the device is
   busy); communication runs beside them wherever the task graph lets it. Every node runs the same
   program, so the mode simulates the nodes in lockstep: one chain of ``Compute`` phases, each as
   long as the slowest node's task in that position (exact for the study's models, whose tables
   are all alike). Order of the chain, as htsim's first-come order gives it:
       emb_fwd_0 .. emb_fwd_{K-1}, bot_fwd_1 .. bot_fwd_Lb, top_fwd_1 .. top_fwd_Lt,
       top_bwd_Lt .. top_bwd_1, bot_bwd_Lb .. bot_bwd_1, emb_bwd_0 .. emb_bwd_{K-1}
   (the bottom MLP's backward needs no network, so it is ready before any embedding gradient).
2. Round-robin placement: table i whole on node i mod N (``workload.node_round_robin_plan``), so
   a node holds K = ceil(T/N) tables; emb_fwd_j / emb_bwd_j are the j-th table of every node (the
   last slot may be held by fewer nodes).
3. Per-table time. FlexFlow measures each embedding operator on one A100 over the full global
   batch and charges it to the table's node. Here: t = c * B * L * D * F seconds per table per
   iteration (forward + backward; F features per table, 1 in the study), c =
   ``table_ps_per_value`` picoseconds per looked-up value, split ``table_fwd_share`` forward and
   the rest backward. c is fitted (below); the split is an assumption (backward ~ 2x forward, as
   for the dense layers), not fitted. Dense layers: the roofline of the cluster (2 * in * out FLOPs
   per sample forward, twice that backward, B / (N * G) samples per GPU, ``device_flops``), one
   Compute per Linear and direction.
4. All-to-all. FlexFlow's embedding output keeps the int64 id tensor's dtype, so every pooled
   element is 8 bytes on the wire (``wire_bytes``). Table i's output goes from its node to every
   other node's B/N samples as soon as emb_fwd of it ends (a2a_fwd_j: one flow per node pair, as
   FlexFlow's one transfer per table and destination); the gradients come back (a2a_bwd_j) when
   the top MLP's backward reaches the concatenation (after top_bwd_1), and emb_bwd_j waits for
   them. The owner's own share stays on the node (not simulated). Input ids never cross the network.
       bytes per iteration = sum over tables of 2 * B * D * F * 8 * (N-1)/N  = 2 T B D 8 (N-1)/N
5. All-reduce: FlexFlow issues one per parameter tensor, started when its layer's backward ends,
   all of them concurrent (htsim finishes a bias's in one round; biases are < 0.03 % of the
   bytes). ``allreduce_per`` 'layer' simulates one per Linear (weight and bias together); the
   default 'group' one per run of equal consecutive Linears, its flows repeated once per layer
   (equal all-reduces started together advance in lockstep and share links flow by flow, so it
   agrees to < 1 % and simulates ~20x faster at 128 nodes). ``ring``: 2(N-1) dependent rounds of
   S/N to the next node (htsim's ring: each round new TCP flows, the next round when all have
   finished); ``dps``: two rounds, every node sending S/N to every other. No update task waits
   for them (htsim's all-reduce tasks have no successors), but the iteration ends with the last.
       bytes per iteration = 2 * (N-1) * 4 * P    (ring and dps alike; P dense parameters)
6. Fat-tree: htsim's TCP (DCTCP) picks one random path per flow: ``routing`` ecmp (one hashed
   path per node pair). TCP's per-flow costs (connection start, slow start, waiting for the last
   ACK, tail retransmissions) are one fitted ``round_latency`` every flow pays, so every dependent
   round pays it once (``FatTree.flow_latency``).
7. Opera: htsim's NDP / RotorLB with every flow on the bulk path (``-cutoff 0``), as
   ``opera.py`` models it; ``opera_options`` are passed to ``OperaNetwork`` unchanged. No TCP
   latency (NDP). Ring all-reduces (``opera_ring`` 'htsim', the default): htsim's RotorLB plans
   host by host per superslice, sends same-rack steps through another rack, and accepts twice
   what an intermediate forwards per matching, so a loaded ring round costs about two cycles;
   ``rotorlb.htsim_ring_round`` emulates its planner for one round carrying every concurrent
   ring's step, and each ring all-reduce lasts its rounds times that (its own lone bytes do not
   load the flow simulation). 'engine' keeps the rings in the flow simulation (slotted RotorLB,
   rack level), where concurrent rings share each round's circuit wait.

Fit (``benchmarks/opera_study.py --compat flexflow --fit``; notes/flexflow_compat.md has the table),
on the study's Model-A baseline only: c = 116.9 ps (490 ms per Model-A table) minimises the largest
|log error| over the fat-tree ring and DPS cells at 16 and 128 nodes (+-11.4 %); round_latency =
25 us is the best of 0..200 us for the 1024-node fat-tree ring. Opera cells are held out. Not
modelled: TCP losses and timeouts, which the study's 16-node ring-vs-DPS gap (7 s) points to.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..config import ModelConfig
from .collectives import all_reduce, all_to_all
from .fattree import ROUTINGS
from .networks import make_network
from .simulator import Comm, Compute, Phase, SimResult, Transfer, simulate
from .spec import ClusterSpec
from .workload import node_round_robin_plan

__all__ = ["COMPAT_MODES", "FlexFlowCompat", "FlexFlowIteration", "build_flexflow_iteration",
           "run_flexflow_iteration", "parse_opera_options", "compat_report", "FIT_TABLE_PS_PER_VALUE", "FIT_ROUND_LATENCY"]

COMPAT_MODES = ("flexflow",)

FIT_TABLE_PS_PER_VALUE = 116.9
"""c, fitted (notes/flexflow_compat.md): picoseconds per looked-up value (id x dim) of a table's
forward + backward on its node."""
FIT_ROUND_LATENCY = 25e-6
"""Fat-tree TCP latency per dependent round, fitted (notes/flexflow_compat.md), seconds."""

_ALGORITHMS = ("ring", "dps")


@dataclass(frozen=True)
class FlexFlowCompat:
    """The mode's knobs; the defaults are the fit to the study's Model-A baseline."""

    table_ps_per_value: float = FIT_TABLE_PS_PER_VALUE
    """Picoseconds per looked-up value (one id times one dimension) of a table's forward +
    backward: a table's time per iteration is this x B x L x D x F."""
    table_fwd_share: float = 1.0 / 3.0
    """Part of a table's time that is its forward (the rest is backward)."""
    round_latency: float = FIT_ROUND_LATENCY
    """Seconds every dependent round of communication pays on the fat-tree (TCP), on top of its
    path's hops x hop latency."""
    wire_bytes: int = 8
    """Bytes per pooled embedding element on the wire (FlexFlow carries the int64 id dtype)."""
    routing: str = "ecmp"
    """Fat-tree routing (htsim's TCP flows: one random path each)."""
    opera_options: tuple[tuple[str, Any], ...] = ()
    """Extra ``OperaNetwork`` keywords, as (name, value) pairs."""
    allreduce_per: str = "group"
    """'layer': one all-reduce per Linear, as FlexFlow issues them (slow to simulate at 1024 nodes:
    39 concurrent rings of 2(N-1) rounds); 'group' (default): one per run of consecutive
    equal-sized Linears of an MLP, started when the run's last backward ends, its flows repeated
    once per layer, so each round carries as many flows (and gets as large a fair share) as the
    layers' own all-reduces would. Model-A: 4 (the first top Linear, the 18 middle ones, the
    logit, the 19 bottom ones); tests/test_flexflow_compat.py checks it against 'layer'."""
    opera_ring: str = "htsim"
    """Ring all-reduces on Opera: 'htsim' (default): every dependent round lasts what htsim's
    RotorLB planner gives a round carrying all concurrent rings' steps (``rotorlb.htsim_ring_round``,
    an emulation of the study's code; no knob); 'engine': flow-simulated like the other traffic."""

    def __post_init__(self) -> None:
        c = self.table_ps_per_value
        if not (isinstance(c, (int, float)) and math.isfinite(c) and 0 < c <= 1e6):
            raise ValueError(f"flexflow compat: table_ps_per_value must be in (0, 1e6] picoseconds, got {c!r}")
        f = self.table_fwd_share
        if not (isinstance(f, (int, float)) and 0 < f < 1):
            raise ValueError(f"flexflow compat: table_fwd_share must be in (0, 1), got {f!r}")
        r = self.round_latency
        if not (isinstance(r, (int, float)) and math.isfinite(r) and 0 <= r <= 1.0):
            raise ValueError(f"flexflow compat: round_latency must be in [0, 1] seconds, got {r!r}")
        if self.wire_bytes not in (1, 2, 4, 8):
            raise ValueError(f"flexflow compat: wire_bytes must be 1, 2, 4 or 8, got {self.wire_bytes!r}")
        if self.opera_ring not in ("htsim", "engine"):
            raise ValueError(f"flexflow compat: opera_ring must be 'htsim' or 'engine', got {self.opera_ring!r}")
        if self.allreduce_per not in ("group", "layer"):
            raise ValueError(f"flexflow compat: allreduce_per must be 'group' or 'layer', got {self.allreduce_per!r}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"flexflow compat: routing must be one of {ROUTINGS}, got {self.routing!r}")
        names = [k for k, _ in self.opera_options]
        if len(set(names)) != len(names) or not all(isinstance(k, str) and k.isidentifier() for k in names):
            raise ValueError(f"flexflow compat: opera option names must be distinct identifiers, got {names}")

    @classmethod
    def named(cls, name: str, **knobs: Any) -> "FlexFlowCompat":
        """The compat mode ``name`` (only 'flexflow') with knobs replaced (None keeps the fit)."""
        if name not in COMPAT_MODES:
            raise ValueError(f"unknown compat mode {name!r} (known: {', '.join(COMPAT_MODES)})")
        return cls(**{k: v for k, v in knobs.items() if v is not None})

    def table_seconds(self, rows_per_iteration: int, pooling_factor: float, dim: int, features: int = 1) -> float:
        """Forward + backward seconds of one table whose node looks up ``rows_per_iteration``
        bags (the global batch) of ``pooling_factor`` ids of ``dim`` values, per feature."""
        return self.table_ps_per_value * 1e-12 * rows_per_iteration * pooling_factor * dim * features


def parse_opera_options(items: list[str] | None) -> tuple[tuple[str, Any], ...]:
    """``KEY=VALUE`` strings to (key, value) pairs; values true/false -> bool, numbers -> int/float,
    anything else stays a string."""
    out = []
    for it in items or ():
        key, sep, raw = it.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--opera-option takes KEY=VALUE, got {it!r}")
        low = raw.strip().lower()
        val: Any
        if low in ("true", "false"):
            val = low == "true"
        else:
            try:
                val = int(raw)
            except ValueError:
                try:
                    val = float(raw)
                except ValueError:
                    val = raw
        out.append((key.strip().replace("-", "_"), val))
    return tuple(out)


@dataclass
class FlexFlowIteration:
    phases: list[Phase]
    compute: dict[str, float]
    """Seconds of the node-serial chain by part (embedding forward / backward, dense)."""
    network_bytes: dict[str, float]
    """Bytes that cross a NIC per iteration, by collective (all_to_all, all_reduce)."""
    dense_params: int
    slots: int
    """K = ceil(T / N): the busiest node's tables."""
    table_seconds: float
    """The slowest table's forward + backward."""
    notes: list[str] = field(default_factory=list)


def _linears(model: ModelConfig) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(in, out) of the bottom MLP's Linears and of the top MLP's (with the logit), FlexFlow's
    concatenation interaction."""
    d, bottom = model.num_dense_features, []
    for w in model.bottom_mlp:
        bottom.append((d, w))
        d = w
    d, top = d + sum(t.dim * len(t.feature_names) for t in model.tables), []
    for w in (*model.top_mlp, 1):
        top.append((d, w))
        d = w
    return bottom, top


def _repeated(comm: Comm, m: int) -> Comm:
    """``comm`` with every flow repeated ``m`` times: m equal collectives run side by side (their
    rounds in lockstep), each flow a TCP flow of its own for fair sharing."""
    if m == 1:
        return comm
    made: dict[int, Transfer] = {}
    for tr in comm.rounds:
        if id(tr) not in made:
            made[id(tr)] = Transfer(np.repeat(tr.src, m), np.repeat(tr.dst, m), np.repeat(tr.nbytes, m))
    return Comm(comm.name, tuple(made[id(tr)] for tr in comm.rounds), comm.after, comm.collective, comm.algorithm,
                comm.payload * m)


def build_flexflow_iteration(model: ModelConfig, cluster: ClusterSpec, allreduce: str = "ring",
                             global_batch: int = 524_288, compat: FlexFlowCompat | None = None) -> FlexFlowIteration:
    """The study's FlexFlow task graph of one iteration as a simulator schedule (module docstring)."""
    cc = compat or FlexFlowCompat()
    N, G = cluster.nodes, cluster.devices_per_node
    if allreduce not in _ALGORITHMS:
        raise ValueError(f"flexflow compat: allreduce must be one of {_ALGORITHMS} (FlexFlow/htsim's), got {allreduce!r}")
    if model.interaction != "cat":
        raise ValueError(f"flexflow compat: FlexFlow's DLRM only concatenates features, got interaction "
                         f"{model.interaction!r}")
    W = N * G
    if global_batch < W or global_batch % W:
        raise ValueError(f"global batch {global_batch} must be a positive multiple of the world size {W}")
    plan = node_round_robin_plan(model, N, G)
    owned: list[list[int]] = [[] for _ in range(N)]  # table indices of each node, in order
    for i, t in enumerate(model.tables):
        owned[plan[t.name].shards[0].rank // G].append(i)
    K = max(len(o) for o in owned)
    secs = [cc.table_seconds(global_batch, t.pooling_factor, t.dim, len(t.feature_names)) for t in model.tables]
    cols = [t.dim * len(t.feature_names) for t in model.tables]
    b = global_batch // W  # samples per GPU (dense roofline)
    per_node = global_batch // N  # samples per node (FlexFlow's data-parallel parts)
    bottom, top = _linears(model)

    def fwd_s(i: int, o: int) -> float:
        return 2.0 * i * o * b / cluster.device_flops

    phases: list[Phase] = []
    compute = {"emb_fwd": 0.0, "emb_bwd": 0.0, "dense": 0.0}
    off = ~np.eye(N, dtype=bool)
    prev: tuple[str, ...] = ()
    a2a_fwd, a2a_bwd_m = [], []
    slot = [[(n, o[j]) for n, o in enumerate(owned) if j < len(o)] for j in range(K)]  # (node, table) by slot
    for j in range(K):
        tf = max(secs[i] for _, i in slot[j]) * cc.table_fwd_share
        phases.append(Compute(f"emb_fwd_{j}", tf, prev))
        compute["emb_fwd"] += tf
        prev = (f"emb_fwd_{j}",)
        width = np.zeros(N)
        for n, i in slot[j]:
            width[n] = cols[i]
        M = np.where(off, per_node * cc.wire_bytes * width[:, None], 0.0)  # owner row -> every other node
        if N > 1:
            phases.append(all_to_all(M, name=f"a2a_fwd_{j}", after=prev))
            a2a_fwd.append(f"a2a_fwd_{j}")
        a2a_bwd_m.append(M.T)
    for i, (a, o) in enumerate(bottom, 1):
        phases.append(Compute(f"bot_fwd_{i}", fwd_s(a, o), prev))
        compute["dense"] += fwd_s(a, o)
        prev = (f"bot_fwd_{i}",)
    for i, (a, o) in enumerate(top, 1):
        phases.append(Compute(f"top_fwd_{i}", fwd_s(a, o), prev + (tuple(a2a_fwd) if i == 1 else ())))
        compute["dense"] += fwd_s(a, o)
        prev = (f"top_fwd_{i}",)
    ar_bytes, run = 0.0, []
    layers = [(f"top_{i}", a, o) for i, (a, o) in reversed(list(enumerate(top, 1)))]
    layers += [(f"bot_{i}", a, o) for i, (a, o) in reversed(list(enumerate(bottom, 1)))]
    for k, (name, a, o) in enumerate(layers):
        phases.append(Compute(f"{name[:3]}_bwd_{name[4:]}", 2 * fwd_s(a, o), prev))
        compute["dense"] += 2 * fwd_s(a, o)
        prev = (f"{name[:3]}_bwd_{name[4:]}",)
        S = 4.0 * (a * o + o)
        run.append(name)
        nxt = layers[k + 1] if k + 1 < len(layers) else None
        if cc.allreduce_per == "layer" or nxt is None or nxt[0][:3] != name[:3] or 4.0 * (nxt[1] * nxt[2] + nxt[2]) != S:
            label = f"ar_{run[0]}" + (f"-{run[-1][4:]}" if len(run) > 1 else "")
            phases.append(_repeated(all_reduce(allreduce, N, S, name=label, after=prev), len(run)))
            ar_bytes += phases[-1].network_bytes
            run = []
        if name == "top_1" and N > 1:  # the concatenation's gradient: back to the tables' owners
            phases += [all_to_all(M, name=f"a2a_bwd_{j}", after=prev) for j, M in enumerate(a2a_bwd_m)]
    for j in range(K):
        tb = max(secs[i] for _, i in slot[j]) * (1 - cc.table_fwd_share)
        phases.append(Compute(f"emb_bwd_{j}", tb, prev + ((f"a2a_bwd_{j}",) if N > 1 else ())))
        compute["emb_bwd"] += tb
        prev = (f"emb_bwd_{j}",)
    net = {"all_to_all": sum(p.network_bytes for p in phases if isinstance(p, Comm) and p.collective == "all_to_all"),
           "all_reduce": ar_bytes}
    P = sum(a * o + o for _, a, o in layers)
    notes = []
    if len({(t.dim, t.pooling_factor, len(t.feature_names)) for t in model.tables}) > 1:
        notes.append("tables differ in shape: each slot runs as long as its slowest table on every node "
                     "(lockstep nodes)")
    return FlexFlowIteration(phases, compute, net, P, K, max(secs), notes)


def run_flexflow_iteration(model: ModelConfig, cluster: ClusterSpec, network: str, allreduce: str = "auto", *,
                           global_batch: int = 524_288, compat: FlexFlowCompat | None = None,
                           bulk_threshold: float = 0.0, vlb: bool = True, seed: int = 0, aggregate: bool = True,
                           fast_forward: bool = True, progress: float | bool = False,
                           ) -> tuple[SimResult, dict[str, Any]]:
    """Simulate one iteration in the flexflow compat mode; returns the result and a flat summary
    row (seconds, bytes), as ``study.run_iteration``."""
    cc = compat or FlexFlowCompat()
    if allreduce == "auto":
        allreduce = "dps" if network == "opera" else "ring"
    it = build_flexflow_iteration(model, cluster, allreduce, global_batch, cc)
    opts: Mapping[str, Any] = dict(cc.opera_options)
    if opts and network != "opera":
        raise ValueError(f"--opera-option {sorted(opts)} given for a {network} network")
    net = make_network(network, cluster, bulk_threshold=bulk_threshold, vlb=vlb, seed=seed, routing=cc.routing,
                       flow_latency=cc.round_latency if network == "fattree" else 0.0, opera_options=opts)
    phases, held = it.phases, {}
    if network == "opera" and allreduce == "ring" and cc.opera_ring == "htsim" and net.time_varying:
        phases, held = _htsim_rings(it.phases, net)
    res = simulate(phases, net, aggregate=aggregate, fast_forward=fast_forward, progress=progress)
    for p in res.phases:  # the emulated rings: report them as the all-reduces they are
        if p.name in held:
            p.kind, p.algorithm, p.rounds, p.network_bytes = "all_reduce", "ring", *held[p.name]
    a2a_b, ar_b = it.network_bytes["all_to_all"], it.network_bytes["all_reduce"]
    tot = res.totals()
    label = network + ("-ecmp" if network == "fattree" and cc.routing == "ecmp" else "")
    row: dict[str, Any] = {
        "compat": "flexflow", "nodes": cluster.nodes, "network": label, "allreduce": allreduce,
        "tables": len(model.tables), "global_batch": global_batch, "iteration_s": res.total,
        "all_to_all_s": tot.get("all_to_all_s", 0.0), "all_reduce_s": tot.get("all_reduce_s", 0.0),
        "compute_s": tot.get("compute_s", 0.0), "a2a_bytes": a2a_b, "allreduce_bytes": ar_b,
        "allreduce_share": ar_b / (a2a_b + ar_b) if a2a_b + ar_b > 0 else 0.0,
        "dense_params": it.dense_params, "slots": it.slots, "table_s": it.table_seconds,
        "emb_fwd_s": it.compute["emb_fwd"], "emb_bwd_s": it.compute["emb_bwd"], "dense_s": it.compute["dense"],
        "last_compute_end_s": max(p.end for p in res.phases if p.kind == "compute"),
        "table_ps_per_value": cc.table_ps_per_value, "round_latency_s": cc.round_latency,
        "opera_options": ";".join(f"{k}={v}" for k, v in cc.opera_options),
        "opera_ring": cc.opera_ring if network == "opera" and allreduce == "ring" else "",
        "sim_wall_s": res.wall_seconds, "notes": "; ".join(it.notes),
    }
    return res, row


HTSIM_EARLY_BYTES = 1500
"""htsim's Opera ring ends a tensor under this many bytes per node after one round
(``FFRingAllreduce``, ffsim-opera-v2/ffapp.cpp)."""


def _htsim_rings(phases: list[Phase], net: Any) -> tuple[list[Phase], dict[str, tuple[int, float]]]:
    """The ring all-reduces replaced by waits of their rounds x ``htsim_ring_round`` for one round
    that carries every ring's step (the rings run concurrently, their flows to the next node share
    its RotorLB queue); returns the phases and, per replaced name, (rounds, network bytes)."""
    from .rotorlb import htsim_ring_round

    rings = [p for p in phases if isinstance(p, Comm) and p.collective == "all_reduce" and p.rounds]
    N = net.hosts
    early = {p.name for p in rings if p.payload / N < HTSIM_EARLY_BYTES}
    step = sum(float(p.rounds[0].nbytes[p.rounds[0].src == 0].sum()) for p in rings if p.name not in early)
    tau = htsim_ring_round(net, step) if step > 0 else 0.0
    out, held, ids = [], {}, {id(p) for p in rings}
    for p in phases:
        if id(p) in ids:
            n = 1 if p.name in early else len(p.rounds)
            held[p.name] = (n, p.network_bytes)
            out.append(Compute(p.name, n * tau, p.after))
        else:
            out.append(p)
    return out, held


def compat_report(res: SimResult) -> str:
    """The timeline in brief: phases grouped by name (emb_fwd_*, a2a_fwd_*, ar_* ...), each
    group's count, first start, last end and bytes on the network (timeline.csv has them all)."""
    groups: dict[str, list] = {}
    for p in res.phases:
        key = p.name.rstrip("0123456789").rstrip("_") if p.kind == "compute" or p.kind == "all_to_all" else p.name
        groups.setdefault(key, []).append(p)
    lines = [f"{res.network}: iteration {res.total:.4f} s (simulated in {res.wall_seconds:.2f} s)",
             f"{'phases':<12} {'n':>4} {'kind':<11} {'start s':>9} {'end s':>9} {'net GB':>9}"]
    for key, ps in sorted(groups.items(), key=lambda kv: min(p.start for p in kv[1])):
        lines.append(f"{key:<12} {len(ps):>4} {ps[0].kind:<11} {min(p.start for p in ps):9.4f} "
                     f"{max(p.end for p in ps):9.4f} {sum(p.network_bytes for p in ps) / 1e9:9.2f}")
    return "\n".join(lines)
