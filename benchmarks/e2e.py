"""End-to-end training throughput: neo_train vs TorchRec 1.8, same model, data and plan, on W gloo
ranks of this CPU.

    python benchmarks/e2e.py                                   # W = 2 and 4, preset small, b = 512, table-wise
    python benchmarks/e2e.py --world-sizes 2 --sharding row_wise --steps 50 --json e2e.json --plot e2e.png
    python benchmarks/e2e.py --quick --json out.json           # W = 2, preset tiny, 3 steps: a smoke test
    python benchmarks/e2e.py --world-sizes 2 --config emb-heavy # 26 tables x 1M rows, dim 64, pooling 20-40
    python benchmarks/e2e.py --world-sizes 2 --phases          # + per-phase wall/CPU of both frameworks

What runs (each framework in its own set of W fresh processes, one after the other, per W):
    model   the DLRM of ``--preset`` (dot interaction; DCN only when low-rank), or with
            ``--config emb-heavy`` an embedding-heavy one: 26 tables of 1M rows (x ``--row-scale``;
            1e-3 under ``--quick``), dim 64, sum pooling with mean bag sizes 20..40 (mean 30),
            bottom MLP 13-128-64, top MLP 415-128-64-1 (memory: 6.66 GB of weights + 0.10 GB of
            row-wise AdaGrad state over the W ranks, one framework at a time, so it fits 24 GiB
            unscaled); per-rank batch b
            (``--batch-size``); TorchRec: ``torchrec.models.dlrm.DLRM`` (``DLRM_DCN`` for dcn) with
            the same table rows / dims / pooling (sum or mean), the same bottom MLP, and top MLP +
            1-wide logit, its EmbeddingBagCollection built on device meta and sharded by
            ``DistributedModelParallel``, wrapped in ``DLRMTrain`` (BCE-with-logits, batch mean).
    data    the identical per-rank batches: ``SyntheticData(model, data, b, seed, rank, W).batch(s)``
            for s = 0, 1, ...; generated before timing; TorchRec gets ``torchrec.datasets.utils.Batch
            (dense, batch.sparse.to_kjt(), labels)``.
    plan    ``ShardingPlan.uniform(model, --sharding, W)``; TorchRec gets the same placement through
            ``construct_module_sharding_plan`` (table_wise(rank=r) pinned to our rank r, row_wise(),
            column_wise(ranks=ours), data_parallel()); if that cannot express it (column shards of
            unequal width) the TorchRec planner with ``ParameterConstraints(sharding_types=[...])``
            places the tables. The JSON records which, and TorchRec's resulting placement.
    optim   sparse: fused into the backward, ``cfg.train.sparse_optimizer`` (row-wise AdaGrad =
            fbgemm EXACT_ROWWISE_ADAGRAD) at ``sparse_lr``; TorchRec through
            ``apply_optimizer_in_backward``. Dense: ``cfg.train.dense_optimizer`` at ``dense_lr`` on
            both (TorchRec: KeyedOptimizerWrapper in a CombinedOptimizer with the fused one).
    kernels fbgemm's CPU TBE on both (ours: ``kernel_backend="fbgemm"`` when it imports; ``--backend
            reference`` runs neo_train's pure-torch kernels instead), except that TorchRec runs
            data_parallel tables with its DENSE kernel (autograd + DDP).
    loop    neo_train: ``TrainPipeline.step`` (batch i+1's input dist started after batch i's forward
            and in flight during its backward, the host-side input checks on a loader thread), or
            with ``--no-pipeline`` ``Trainer.train_step``; TorchRec: ``TrainPipelineSparseDist.
            progress`` (which overlaps the next batch's input dist with this step).
    malloc  both with the trainer's glibc malloc tuning (``neo_train.train.cpu_malloc``: large tensors
            from the heap, freed memory kept mapped; the neo_train ranks get it from ``Trainer``,
            the TorchRec ranks call it before building their model), unless the environment has
            ``NEO_TRAIN_MALLOC=default``, which leaves both with glibc's defaults.

Timing: ``--warmup`` untimed steps, a barrier, then ``--steps`` timed steps; every rank times its
own loop, one torch thread per rank (``torch.set_num_threads(1)``); the job's time is the max over
ranks; samples/s = steps * b * W / time. Each framework runs ``--repeats`` times per W (fresh
processes, order alternating: neo first, TorchRec first, ...) and the median repeat is reported
(all repeats are in the table and the JSON): this 2-core machine may be shared, and the script
prints how busy it was before each W. The "paired" line gives neo/TorchRec within each repeat's
back-to-back pair (same minutes of the machine): its median and range show how far the ratio of
medians can stray from run to run. "CPU ms/step" is the CPU time (``time.process_time``, all
threads, gloo's included) of the timed loop summed over ranks, per step: with more ranks than
cores, throughput is bounded by cores / CPU time per sample, whatever the per-phase wall times
say; CPU time far below cores x wall time means the ranks mostly wait on each other.

neo_train's per-step breakdown comes from ``Trainer.step_breakdown`` (mean over ranks, ms/step;
input_dist = starting the next batch's input dist + waiting for this batch's ids) plus columns it
leaves out: the loss all-reduce (``comm:metrics``), the wait for the loader thread (data_wait) and
what no phase timer covers ("untimed" = step time - the rest). Phases that end in a blocking
collective include the wait for the slowest rank, so they show where ranks wait, not only what
they compute.

``--phases`` times both frameworks the same way (``PhaseTracker``): neo_train's own phase timers
and TorchRec 1.8's pipeline / sharded-EBC / pooled all-to-all functions are wrapped; each phase's
time is exclusive (nested phases taken out), wall and thread CPU, on the training thread
(neo_train's loader thread is listed as thread:*); "other" is the rest of the step (zero_grad,
bookkeeping). Data generation (outside the timed loop: both get pre-generated batches) is timed
separately. TorchRec internals that moved are named as missing hooks instead of failing.

Bytes over the wire per step, all ranks together (self-sends excluded; N_rf = ids of feature f
on rank r, b local batch, D_f dims, s = one shard of a table, cols(s) its width):
    input dist   sum_r sum_f [owner(s) != r for each shard s needing them] (N_rf*8 + b*4)
                 (TW, CW: every shard's rank gets all ids; RW: a shard gets the ids in its rows,
                 counted here as all N_rf/#shards; DP: none)
    output dist  sum over shards s not DP: (W-1)*b*cols(s)*4      (pooled float32)
    backward     the same again (the mirror exchange of the gradients)
    dense        2*(W-1)*P_dense*4                                 (ring all-reduce, every rank)
"a2a GB/s" is the embedding bytes over the time neo_train spends in input_dist + output_dist +
embedding_comm_backward; "% a2a" compares it with a 4 MB-per-peer gloo all-to-all measured in the
same processes (the practical ceiling of this transport on this machine).

Known TorchRec 1.8 quirks here (none of them changes the work done per step, so none matters for
throughput; numerics are NOT compared and no equality is claimed): DMP does not copy weights from
a CPU-built model (so the tables are built on meta and DMP initialises its own random weights);
it averages embedding gradients over ranks where neo_train scales by 1/W by its own convention;
it reorders the output keys of the sharded EBC (SparseArch looks them up by name).

If TorchRec fails to import or to run, neo_train's numbers are still reported and the TorchRec
error is printed and written to the JSON; no TorchRec number is ever made up.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from neo_train.config import Config, ModelConfig, TableConfig, TrainConfig, preset
from neo_train.data.batch import Batch
from neo_train.data.synthetic import SyntheticData
from neo_train.kernels import available_backends
from neo_train.planning.plan import ShardingPlan, ShardingType
from neo_train.testing import run_ranks

__all__ = ["main", "make_config", "make_plan"]

PHASES = (
    "input_dist",
    "lookup",
    "output_dist",
    "dense_forward",
    "embedding_comm_backward",
    "backward_other",
    "optimizer",
)
EXTRA = ("loss_allreduce", "data_wait", "untimed")
SHARDINGS = ("table_wise", "row_wise", "data_parallel", "column_wise")
EBC_PATH = "model.sparse_arch.embedding_bag_collection"  # inside DLRMTrain(DLRM(...))


@dataclass(frozen=True)
class Run:
    cfg: Config
    plan: ShardingPlan
    warmup: int
    steps: int
    pipeline: bool = True
    phases: bool = False  # --phases: the per-phase instrumentation below, on both frameworks


# ---- shared setup -------------------------------------------------------------------------------
# The embedding-heavy configuration (``--config emb-heavy``): 26 tables (Criteo's count) of 1M rows,
# dim 64, sum pooling with mean bag sizes spread evenly over 20..40 (mean 30), a small dense part.
# Memory at row_scale 1: weights 26 * 1M * 64 * 4 B = 6.66 GB, row-wise AdaGrad state 26 * 1M * 4 B
# = 0.10 GB, split over the W ranks; the two frameworks run one after the other in fresh processes,
# so TorchRec's copy never coexists with ours, and 1M rows fit a 24 GiB machine unscaled.
EMB_HEAVY_TABLES, EMB_HEAVY_ROWS, EMB_HEAVY_DIM, EMB_HEAVY_POOLING = 26, 1_000_000, 64, (20.0, 40.0)
CONFIGS = ("preset", "emb-heavy")


def emb_heavy_config(row_scale: float = 1.0) -> Config:
    """The ``emb-heavy`` model (see EMB_HEAVY_*); ``row_scale`` multiplies the rows (min 1)."""
    n, (lo, hi) = EMB_HEAVY_TABLES, EMB_HEAVY_POOLING
    rows = max(1, int(round(EMB_HEAVY_ROWS * row_scale)))
    tables = tuple(
        TableConfig(f"e{i}", rows, EMB_HEAVY_DIM, pooling="sum", pooling_factor=round(lo + (hi - lo) * i / (n - 1), 2))
        for i in range(n)
    )
    model = ModelConfig(tables, num_dense_features=13, bottom_mlp=(128, EMB_HEAVY_DIM), top_mlp=(128, 64),
                        interaction="dot")  # fmt: skip
    return Config(model, TrainConfig(batch_size=512, steps=30), name="emb-heavy")


def make_config(name: str, batch_size: int, steps: int, config: str = "preset", row_scale: float = 1.0,
                backend: str = "auto") -> Config:  # fmt: skip
    """``config`` "preset": the preset ``name``; "emb-heavy": ``emb_heavy_config(row_scale)``.
    ``backend`` "auto": fbgemm when it imports, else reference (neo_train's kernels)."""
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {CONFIGS}, got {config!r}")
    cfg = emb_heavy_config(row_scale) if config == "emb-heavy" else preset(name, row_scale)
    if backend == "auto":
        backend = "fbgemm" if "fbgemm" in available_backends() else "reference"
    train = cfg.train.replace(batch_size=batch_size, steps=steps, kernel_backend=backend)
    return cfg.replace(train=train)


def make_plan(cfg: Config, sharding: str, world_size: int) -> ShardingPlan:
    plan = ShardingPlan.uniform(cfg.model, sharding, world_size)
    plan.validate(cfg.model, world_size)
    return plan


def local_batches(cfg: Config, rank: int, world_size: int, n: int) -> list[Batch]:
    t = cfg.train
    data = SyntheticData(cfg.model, cfg.data, t.batch_size, seed=t.seed, rank=rank, world_size=world_size)
    return [data.batch(s) for s in range(n)]


def ids_per_feature(batches: Sequence[Batch]) -> list[float]:
    """Mean ids per feature per batch (F,) over ``batches``."""
    counts = torch.tensor([b.sparse.feature_value_counts() for b in batches], dtype=torch.float64)
    return counts.mean(0).tolist()


def a2a_ceiling_gbs(comm, mbytes_per_peer: float = 4.0, repeats: int = 5) -> float:
    """Wire bytes (self-sends excluded, all ranks) per second of a large gloo all-to-all."""
    W = comm.world_size
    n = int(mbytes_per_peer * 2**20 / 4)
    x = torch.ones(W * n)
    comm.all_to_all_v(x, [n] * W, [n] * W)
    best = float("inf")
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_to_all_v(x, [n] * W, [n] * W)
        best = min(best, time.perf_counter() - t0)
    worst = float(comm.all_reduce(torch.tensor([best], dtype=torch.float64), op="max")[0])
    return W * (W - 1) * n * 4 / worst / 1e9


# ---- per-phase instrumentation (--phases) ---------------------------------------------------------
# Both frameworks get the same accounting: a phase is entered/left around a function (or, for
# neo_train, around its own PhaseTimer phases); time is exclusive (a nested phase's time is taken
# out of its parent), per thread, wall (time.perf_counter) and CPU (time.thread_time); only the
# timed loop counts. "main" is the training thread; anything else (neo_train's loader thread) is
# booked under its own phase names. gloo's worker threads are in neither (they are in CPU ms/step).
PHASE_ROWS = ("input_dist", "lookup", "output_dist", "dense_forward", "emb_comm_bwd", "backward_other",
              "optimizer", "other")  # fmt: skip


class PhaseTracker:
    def __init__(self) -> None:
        import threading

        self._local = threading.local()
        self._main = threading.main_thread()
        self.active = False
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.missing: list[str] = []  # hooks that could not be installed (internals moved)

    def __call__(self, phase: str):
        import contextlib
        import threading

        @contextlib.contextmanager
        def span():
            stack = self._local.__dict__.setdefault("stack", [])
            rec = [time.perf_counter(), time.thread_time(), 0.0, 0.0]
            stack.append(rec)
            try:
                yield
            finally:
                stack.pop()
                w, c = time.perf_counter() - rec[0], time.thread_time() - rec[1]
                if stack:  # the parent loses this span's time
                    stack[-1][2] += w
                    stack[-1][3] += c
                if self.active:
                    key = phase if threading.current_thread() is self._main else f"thread:{phase}"
                    self.wall[key] = self.wall.get(key, 0.0) + w - rec[2]
                    self.cpu[key] = self.cpu.get(key, 0.0) + c - rec[3]

        return span()

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        """Book every call of ``owner.name`` (a function, method or staticmethod) under ``phase``."""
        import functools

        raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if raw is None:
            self.missing.append(f"{getattr(owner, '__name__', owner)}.{name}")
            return
        fn = raw.__func__ if isinstance(raw, staticmethod) else raw

        @functools.wraps(fn)
        def wrapped(*a, **k):
            with self(phase):
                return fn(*a, **k)

        setattr(owner, name, staticmethod(wrapped) if isinstance(raw, staticmethod) else wrapped)

    def result(self, steps: int) -> dict[str, Any]:
        per = lambda d: {k: 1e3 * v / steps for k, v in sorted(d.items())}  # noqa: E731
        return {"wall_ms": per(self.wall), "cpu_ms": per(self.cpu), "missing_hooks": self.missing}


def instrument_neo(tracker: PhaseTracker) -> None:
    """neo_train's own phase timers (their names are the trainer's step_breakdown) + its collectives'
    backward exchanges + the pipeline step (the rest of the step lands in "other")."""
    import contextlib

    from neo_train.comm import autograd as comm_autograd
    from neo_train.train import pipeline as neo_pipeline
    from neo_train.train.timing import PhaseTimer

    names = {"pipeline_wait": "input_dist", "input_dist": "input_dist", "lookup": "lookup",
             "output_dist": "output_dist", "forward": "dense_forward", "backward": "backward_other",
             "optimizer": "optimizer", "check_inputs": "input_checks"}  # fmt: skip
    orig = PhaseTimer.__call__

    @contextlib.contextmanager
    def timed(self, phase):
        with tracker(names.get(phase, phase)), orig(self, phase):
            yield

    PhaseTimer.__call__ = timed
    tracker.wrap(neo_pipeline.TrainPipeline, "step", "other")
    tracker.wrap(neo_pipeline.TrainPipeline, "_load", "data_load")
    for cls in ("_AllToAllV", "_AllToAllVWait", "_ReduceScatterV", "_AllGatherV"):
        if hasattr(comm_autograd, cls):
            tracker.wrap(getattr(comm_autograd, cls), "backward", "emb_comm_bwd")


def instrument_torchrec(tracker: PhaseTracker) -> None:
    """TorchRec 1.8's pipeline stages, sharded EBC stages and pooled all-to-all backward."""
    from torchrec.distributed import comm_ops
    from torchrec.distributed.embedding_lookup import GroupedPooledEmbeddingsLookup
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionAwaitable, ShardedEmbeddingBagCollection
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.train_pipeline.runtime_forwards import PipelinedForward
    from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSparseDist

    w = tracker.wrap
    w(TrainPipelineSparseDist, "progress", "other")
    for n in ("start_sparse_data_dist", "wait_sparse_data_dist", "_wait_for_batch"):
        w(TrainPipelineSparseDist, n, "input_dist")
    w(PipelinedForward, "__call__", "input_dist")  # its wait for the ids; the lookup etc. nest inside
    w(DistributedModelParallel, "forward", "dense_forward")  # exclusive: what the embedding stages leave
    w(ShardedEmbeddingBagCollection, "compute_and_output_dist", "output_dist")
    w(GroupedPooledEmbeddingsLookup, "forward", "lookup")
    w(EmbeddingBagCollectionAwaitable, "_wait_impl", "output_dist")
    w(TrainPipelineSparseDist, "_backward", "backward_other")
    for cls in ("All2All_Pooled_Req", "All2All_Pooled_Wait"):
        w(getattr(comm_ops, cls), "backward", "emb_comm_bwd")
    w(TrainPipelineSparseDist, "_optimizer_step", "optimizer")


def data_generation_ms(cfg: Config, world_size: int, n: int = 5) -> dict[str, float]:
    """Median ms to generate one rank's batch (and to wrap it as a KJT for TorchRec); both
    frameworks get pre-generated batches here, so this is outside the timed loop."""
    t = cfg.train
    data = SyntheticData(cfg.model, cfg.data, t.batch_size, seed=t.seed, rank=0, world_size=world_size)
    gen, kjt = [], []
    for s in range(n):
        t0 = time.perf_counter()
        b = data.batch(s)
        t1 = time.perf_counter()
        try:
            b.sparse.to_kjt()
        except Exception:  # noqa: BLE001 - no torchrec: no KJT time
            pass
        gen.append(t1 - t0)
        kjt.append(time.perf_counter() - t1)
    return {"synthetic_batch": 1e3 * sorted(gen)[n // 2], "to_kjt": 1e3 * sorted(kjt)[n // 2]}


def config_from_args(args: argparse.Namespace) -> Config:
    return make_config(args.preset, args.batch_size, args.steps, args.config, args.row_scale, args.backend)


# ---- neo_train on one rank ------------------------------------------------------------------------
def neo_rank(comm, run: Run) -> dict[str, Any]:
    from neo_train.train.trainer import Trainer

    cfg, W = run.cfg, comm.world_size
    tracker = PhaseTracker()
    if run.phases:
        instrument_neo(tracker)
    # the pipeline starts the next batch's input dist in every step: one spare batch keeps that
    # work in the last timed step too
    batches = local_batches(cfg, comm.rank, W, run.warmup + run.steps + 1)
    trainer = Trainer(cfg, comm=comm, plan=run.plan, progress=False, train_data=batches)
    pipe = None
    if run.pipeline:  # neo_train's TrainPipeline: batch i+1's input dist in flight during i's backward
        from neo_train.train.pipeline import TrainPipeline

        pipe = TrainPipeline(trainer, iter(batches))
        step_fn = pipe.step
    else:
        step_fn = lambda s: trainer.train_step(batches[s], s)  # noqa: E731
    for s in range(run.warmup):
        step_fn(s)
    comm.barrier()  # (a pipelined input dist still in flight runs on its own process group)
    trainer.timer.reset()
    tracker.active = run.phases
    t0, c0 = time.perf_counter(), time.process_time()
    loss: Any = float("nan")
    for s in range(run.warmup, run.warmup + run.steps):
        loss = step_fn(s)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    tracker.active = False
    if pipe is not None:
        pipe.close()
    totals = trainer.timer.totals()
    breakdown = trainer.step_breakdown(run.steps)
    step_ms = 1e3 * elapsed / run.steps
    extra = {
        "loss_allreduce": 1e3 * totals.get("comm:metrics", 0.0) / run.steps,
        "data_wait": breakdown.get("data_wait", 0.0),  # the step waiting for the loader thread
    }
    # on the critical path: starting the next batch's input dist and waiting for this batch's ids
    breakdown["input_dist"] = breakdown.get("input_dist", 0.0) + breakdown.get("pipeline_wait", 0.0)
    extra["untimed"] = step_ms - sum(breakdown[k] for k in PHASES) - extra["loss_allreduce"] - extra["data_wait"]
    return {
        "rank": comm.rank,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "step_ms": step_ms,
        "breakdown": breakdown,
        "extra": extra,
        "timer_ms_per_step": {k: 1e3 * v / run.steps for k, v in sorted(totals.items())},
        "last_loss": float(loss),
        "backend": trainer.backend,
        "dense_params": sum(p.numel() for p in trainer.model.dense_parameters()),
        "ids_per_feature": ids_per_feature(batches[run.warmup :]),
        "a2a_ceiling_gbs": a2a_ceiling_gbs(comm),
        "phases": tracker.result(run.steps) if run.phases else None,
    }


# ---- TorchRec on one rank -------------------------------------------------------------------------
def torchrec_sparse_optimizer(kind: str):
    import torchrec.optim as trec_optim

    return {
        "rowwise_adagrad": trec_optim.RowWiseAdagrad,
        "adagrad": torch.optim.Adagrad,
        "sgd": torch.optim.SGD,
        "adam": torch.optim.Adam,
    }[kind]


def torchrec_model(cfg: Config):
    """DLRMTrain(DLRM) with the same tables / MLPs as ours; tables on meta (DMP materialises them)."""
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    m = cfg.model
    tables = [
        EmbeddingBagConfig(
            name=t.name, embedding_dim=t.dim, num_embeddings=t.num_rows, feature_names=list(t.feature_names),
            pooling=PoolingType.MEAN if t.pooling == "mean" else PoolingType.SUM,
        )
        for t in m.tables
    ]  # fmt: skip
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    common = dict(
        embedding_bag_collection=ebc, dense_in_features=m.num_dense_features,
        dense_arch_layer_sizes=list(m.bottom_mlp), over_arch_layer_sizes=[*m.top_mlp, 1],
        dense_device=torch.device("cpu"),
    )  # fmt: skip
    if m.interaction == "dot":
        dlrm = DLRM(**common)
    elif m.interaction == "dcn" and m.dcn_low_rank > 0:
        dlrm = DLRM_DCN(**common, dcn_num_layers=m.dcn_num_layers, dcn_low_rank_dim=m.dcn_low_rank)
    else:
        raise ValueError(
            f"interaction {m.interaction!r} (dcn_low_rank={m.dcn_low_rank}) has no torchrec.models.dlrm "
            "equivalent (DLRM: dot; DLRM_DCN: low-rank DCN)"
        )
    return DLRMTrain(dlrm)


def torchrec_plan(plan: ShardingPlan, ebc, sharder) -> tuple[Any, str]:
    """Our placement as a TorchRec module plan: pinned, or (failing that) from TorchRec's planner."""
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_row_wise,
        table_wise,
    )

    W, L = plan.world_size, plan.local_world_size
    gens = {}
    for tp in plan.tables:
        st = tp.sharding
        if st == ShardingType.TABLE_WISE:
            gens[tp.table] = table_wise(rank=tp.shards[0].rank)
        elif st == ShardingType.ROW_WISE:
            gens[tp.table] = row_wise()
        elif st == ShardingType.COLUMN_WISE:
            gens[tp.table] = column_wise(ranks=[s.rank for s in sorted(tp.shards, key=lambda s: s.col_start)])
        elif st == ShardingType.DATA_PARALLEL:
            gens[tp.table] = data_parallel()
        elif st == ShardingType.TABLE_ROW_WISE:
            gens[tp.table] = table_row_wise(host_index=plan.node_of(tp.shards[0].rank))
        else:
            raise ValueError(f"no TorchRec equivalent wired up for {st.value}")
    try:
        pinned = construct_module_sharding_plan(ebc, gens, sharder=sharder, local_size=L, world_size=W, device_type="cpu")
        return pinned, "pinned"
    except (ValueError, AssertionError) as e:
        pinned_error = f"{type(e).__name__}: {e}"
    import torch.distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    constraints = {tp.table: ParameterConstraints(sharding_types=[tp.sharding.value]) for tp in plan.tables}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=W, local_world_size=L, compute_device="cpu"), constraints=constraints
    )
    full = planner.collective_plan(ebc, [sharder], dist.GroupMember.WORLD)
    return full.plan[""], f"planner (pinned plan failed: {pinned_error})"


def torchrec_rank(comm, run: Run) -> dict[str, Any]:
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)  # torchrec trips a deprecation warning
    import torch.distributed as dist
    import torchrec
    from torchrec.datasets.utils import Batch as TRBatch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.distributed.types import ShardingEnv
    from torchrec.distributed.types import ShardingPlan as TRShardingPlan
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from neo_train.train.cpu_malloc import tune_cpu_malloc
    from neo_train.train.trainer import make_dense_optimizer

    tune_cpu_malloc()  # the same host allocator settings as neo_train's ranks (module docstring)
    cfg, t = run.cfg, run.cfg.train
    tracker = PhaseTracker()
    if run.phases:
        instrument_torchrec(tracker)
    cpu = torch.device("cpu")
    # the pipeline fetches ahead: two spare batches keep it full through the last timed step
    batches = [
        TRBatch(dense_features=b.dense, sparse_features=b.sparse.to_kjt(), labels=b.labels)
        for b in local_batches(cfg, comm.rank, comm.world_size, run.warmup + run.steps + 2)
    ]
    model = torchrec_model(cfg)
    ebc = model.model.sparse_arch.embedding_bag_collection
    opt_kwargs = {"lr": t.sparse_lr, "eps": t.eps, "weight_decay": t.weight_decay}
    if t.sparse_optimizer == "sgd":
        opt_kwargs = {"lr": t.sparse_lr, "weight_decay": t.weight_decay}
    apply_optimizer_in_backward(torchrec_sparse_optimizer(t.sparse_optimizer), ebc.parameters(), opt_kwargs)
    sharder = EmbeddingBagCollectionSharder()
    module_plan, plan_source = torchrec_plan(run.plan, ebc, sharder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch 2.13's broadcast_buffers deprecation, in DMP's DDP
        dmp = DistributedModelParallel(
            module=model, env=ShardingEnv.from_process_group(dist.GroupMember.WORLD), device=cpu,
            plan=TRShardingPlan({EBC_PATH: module_plan}), sharders=[sharder],
        )  # fmt: skip
    dense_opt = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda ps: make_dense_optimizer(t, ps)
    )
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense_opt])
    pipeline = TrainPipelineSparseDist(dmp, optimizer, device=cpu)
    it = iter(batches)
    for _ in range(run.warmup):
        pipeline.progress(it)
    comm.barrier()
    tracker.active = run.phases
    t0, c0 = time.perf_counter(), time.process_time()
    out = None
    for _ in range(run.steps):
        out = pipeline.progress(it)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    tracker.active = False
    placement = {
        name: {"sharding": ps.sharding_type, "ranks": list(ps.ranks or []), "kernel": ps.compute_kernel}
        for name, ps in module_plan.items()
    }
    return {
        "rank": comm.rank,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "step_ms": 1e3 * elapsed / run.steps,
        "last_loss": float(out[0]) if out is not None else float("nan"),
        "plan_source": plan_source,
        "placement": placement,
        "phases": tracker.result(run.steps) if run.phases else None,
        "torchrec": getattr(torchrec, "__version__", "unknown"),
    }


# ---- bytes --------------------------------------------------------------------------------------
def wire_bytes(cfg: Config, plan: ShardingPlan, ids: list[list[float]], dense_params: int) -> dict[str, float]:
    """Bytes over the wire per step, all ranks together (formulas in the module docstring)."""
    W, b = plan.world_size, cfg.train.batch_size
    feat = {f: i for i, f in enumerate(cfg.model.feature_names)}
    inp = out = 0.0
    for t in cfg.model.tables:
        tp = plan[t.name]
        if tp.sharding == ShardingType.DATA_PARALLEL:
            continue
        row_split = tp.sharding in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)
        for f in t.feature_names:
            for s in tp.shards:
                for r in range(W):
                    if r != s.rank:
                        n = ids[r][feat[f]] / (len(tp.shards) if row_split else 1)
                        inp += n * 8 + b * 4
                out += (W - 1) * b * s.cols * 4
    return {"input_dist": inp, "output_dist": out, "backward": out, "dense_allreduce": 2.0 * (W - 1) * dense_params * 4}


# ---- the driver -----------------------------------------------------------------------------------
def run_world(args: argparse.Namespace, W: int) -> dict[str, Any]:
    """Both frameworks on W ranks, ``--repeats`` times in alternating order; the median repeat counts."""
    cfg = config_from_args(args)
    plan = make_plan(cfg, args.sharding, W)
    run = Run(cfg, plan, args.warmup, args.steps, pipeline=not args.no_pipeline, phases=args.phases)
    b = cfg.train.batch_size
    # start-up grows with the tables (initialising 1.7G floats takes tens of seconds per framework)
    timeout = max(180.0, 30.0 * W + 2.0 * (args.warmup + args.steps) + 60.0 * cfg.model.num_embedding_params / 1e9)
    result: dict[str, Any] = {"world_size": W, "batch_size": b, "plan": plan.to_dict(), "rows": []}
    result["background_cpu_busy"] = cpu_busy()
    busy = result["background_cpu_busy"]
    print(f"# W={W}: machine busy {100 * busy:.0f}% before starting (other processes)", flush=True)
    reps: dict[str, list[list[dict[str, Any]]]] = {"neo_train": [], "torchrec": []}
    for i in range(args.repeats):
        order = ("neo_train", "torchrec") if i % 2 == 0 else ("torchrec", "neo_train")
        for fw in order:
            if fw == "torchrec" and (args.no_torchrec or "torchrec_error" in result):
                continue
            t0 = time.perf_counter()
            try:
                ranks = run_ranks(neo_rank if fw == "neo_train" else torchrec_rank, W, run, threads=1,
                                  timeout_s=timeout, collective_timeout_s=120.0)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - TorchRec's failure is reported, ours is fatal
                if fw == "neo_train":
                    raise
                result["torchrec_error"] = f"{type(e).__name__}: {e}"
                err = _tail(result["torchrec_error"])
                print(f"# W={W}: TorchRec FAILED, no TorchRec number for this W:\n{err}", flush=True)
                continue
            reps[fw].append(ranks)
            secs = max(r["seconds"] for r in ranks)
            print(f"# W={W} repeat {i + 1}/{args.repeats}: {fw:<9} {args.steps * b * W / secs:>9,.0f} samples/s "
                  f"({time.perf_counter() - t0:.0f} s with start-up)", flush=True)  # fmt: skip

    neo = _median_repeat(reps["neo_train"])
    result["neo_ranks"] = neo
    result["neo_repeats_seconds"] = [max(r["seconds"] for r in rep) for rep in reps["neo_train"]]
    result["rows"].append(_row("neo_train", W, b, args.steps, result["neo_repeats_seconds"], neo,
                               f"{neo[0]['backend']} kernels, " + ("TrainPipeline" if run.pipeline else "Trainer.train_step")))  # fmt: skip
    result["neo_pipelined"] = run.pipeline
    result["neo_exposed_comm_ms"] = sum(r["breakdown"]["exposed_comm"] for r in neo) / W
    result["breakdown"] = {k: sum(r["breakdown"][k] for r in neo) / W for k in PHASES}
    result["breakdown_extra"] = {k: sum(r["extra"][k] for r in neo) / W for k in EXTRA}
    result["breakdown_max_rank"] = {k: max(r["breakdown"][k] for r in neo) for k in PHASES}
    result["breakdown_ms_step"] = max(r["step_ms"] for r in neo)
    bytes_ = wire_bytes(cfg, plan, [r["ids_per_feature"] for r in neo], neo[0]["dense_params"])
    emb = bytes_["input_dist"] + bytes_["output_dist"] + bytes_["backward"]
    emb_ms = sum(result["breakdown"][k] for k in ("input_dist", "output_dist", "embedding_comm_backward"))
    result["bytes_per_step"] = bytes_
    result["embedding_a2a_gbs"] = emb / emb_ms / 1e6 if emb_ms > 0 else 0.0
    result["a2a_ceiling_gbs"] = min(r["a2a_ceiling_gbs"] for r in neo)
    if reps["torchrec"]:
        trec = _median_repeat(reps["torchrec"])
        result["torchrec_ranks"] = trec
        result["torchrec_plan_source"] = trec[0]["plan_source"]
        result["torchrec_repeats_seconds"] = [max(r["seconds"] for r in rep) for rep in reps["torchrec"]]
        result["rows"].append(_row("torchrec", W, b, args.steps, result["torchrec_repeats_seconds"], trec,
                                   f"DMP + TrainPipelineSparseDist, plan {trec[0]['plan_source']}"))  # fmt: skip
        result["ratio_neo_over_torchrec"] = result["rows"][0]["samples_per_s"] / result["rows"][1]["samples_per_s"]
        # repeat i of each framework ran back to back (order alternating): their ratio sees the
        # same minutes of this shared machine, so its spread says how far one run's median can stray
        result["paired_ratios"] = [t / n for n, t in zip(result["neo_repeats_seconds"], result["torchrec_repeats_seconds"])]
    if args.phases:
        result["phases"] = {"data_generation_ms": data_generation_ms(cfg, W)}
        for fw in ("neo_train", "torchrec"):
            if reps[fw]:
                result["phases"][fw] = _mean_phases(_median_repeat(reps[fw]))
    return result


def _mean_phases(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-phase wall / CPU ms per step, mean over ranks, plus the step and its CPU (all threads)."""
    out: dict[str, Any] = {}
    for kind in ("wall_ms", "cpu_ms"):
        keys = sorted({k for r in ranks for k in r["phases"][kind]})
        out[kind] = {k: sum(r["phases"][kind].get(k, 0.0) for r in ranks) / len(ranks) for k in keys}
    out["step_ms"] = sum(r["step_ms"] for r in ranks) / len(ranks)
    # CPU of the whole process (every thread) per step: cpu_seconds over the timed steps
    out["process_cpu_ms"] = sum(r["cpu_seconds"] * r["step_ms"] / r["seconds"] for r in ranks) / len(ranks)
    out["missing_hooks"] = sorted({h for r in ranks for h in r["phases"]["missing_hooks"]})
    return out


def _median_repeat(reps: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The repeat whose job time (max over ranks) is the median (the faster middle one when even)."""
    ordered = sorted(reps, key=lambda rep: max(r["seconds"] for r in rep))
    return ordered[(len(ordered) - 1) // 2]


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of the machine's CPU time that was busy over ``seconds`` (from /proc/stat)."""
    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait

    try:
        t0, i0 = read()
        time.sleep(seconds)
        t1, i1 = read()
    except OSError:
        return float("nan")
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def _row(framework: str, W: int, b: int, steps: int, seconds: list[float], ranks: list[dict[str, Any]],
         note: str) -> dict[str, Any]:  # fmt: skip
    med = sorted(seconds)[(len(seconds) - 1) // 2]
    return {
        "world_size": W,
        "framework": framework,
        "samples_per_s": steps * b * W / med,
        "ms_per_step": 1e3 * med / steps,
        "seconds": med,
        "samples_per_s_repeats": [steps * b * W / s for s in seconds],
        "cpu_ms_per_step": 1e3 * sum(r["cpu_seconds"] for r in ranks) / steps,  # all ranks, median repeat
        "note": note,
    }


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def machine_info() -> dict[str, Any]:
    from neo_train.testing import cpu_model

    cpu = cpu_model()
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads_per_rank": 1,
        "backends": available_backends(),
        "loadavg_1m_at_start": os.getloadavg()[0],
    }
    for mod in ("torchrec", "fbgemm_gpu"):
        try:
            info[mod] = getattr(__import__(mod), "__version__", "unknown")
        except Exception as e:  # noqa: BLE001 - a broken install is information, not a crash
            info[mod] = f"unavailable ({type(e).__name__}: {e})"
    return info


def print_tables(worlds: list[dict[str, Any]]) -> None:
    head = (f"{'W':>3} {'framework':<10} {'samples/s':>11} {'ms/step':>9} {'neo/torchrec':>13} {'CPU ms/step':>12} "
            f"{'repeats (samples/s)':>27}  note")  # fmt: skip
    print(head + "\n" + "-" * len(head))
    for w in worlds:
        ratio = w.get("ratio_neo_over_torchrec")
        for r in w["rows"]:
            rs = f"{ratio:.2f}" if ratio is not None and r["framework"] == "neo_train" else ""
            rep = " ".join(f"{v:,.0f}" for v in r["samples_per_s_repeats"])
            print(f"{r['world_size']:>3} {r['framework']:<10} {r['samples_per_s']:>11,.0f} {r['ms_per_step']:>9.2f} "
                  f"{rs:>13} "
                  f"{r['cpu_ms_per_step']:>12.2f} {rep:>27}  {r['note']}")  # fmt: skip
        pairs = w.get("paired_ratios")
        if pairs:
            print(f"{w['world_size']:>3} {'paired':<10} neo/torchrec of each repeat's back-to-back pair: median "
                  f"{statistics.median(pairs):.2f}, range {min(pairs):.2f}-{max(pairs):.2f} "
                  f"({' '.join(f'{x:.2f}' for x in pairs)})")  # fmt: skip
        if "torchrec_error" in w:
            msg = w["torchrec_error"].strip().splitlines()[-1][:120]
            print(f"{w['world_size']:>3} {'torchrec':<10} {'FAILED':>11} {'-':>9} {'-':>13} {'-':>12} {'-':>27}  {msg}")
    print()
    cols = [*PHASES, *EXTRA]
    short = {"embedding_comm_backward": "emb_comm_bwd", "loss_allreduce": "loss_allred"}
    names = [short.get(c, c) for c in cols]
    head = f"{'W':>3} " + " ".join(f"{n:>14}" for n in names)
    head += f" {'step':>8} {'emb MB':>7} {'a2a GB/s':>9} {'% a2a':>6}"
    print("neo_train per-step breakdown (ms/step, mean over ranks):")
    print(head + "\n" + "-" * len(head))
    for w in worlds:
        vals = [w["breakdown"][k] for k in PHASES] + [w["breakdown_extra"][k] for k in EXTRA]
        emb = sum(w["bytes_per_step"][k] for k in ("input_dist", "output_dist", "backward"))
        pct = 100 * w["embedding_a2a_gbs"] / w["a2a_ceiling_gbs"] if w["a2a_ceiling_gbs"] else 0.0
        print(
            f"{w['world_size']:>3} " + " ".join(f"{v:>14.2f}" for v in vals) + f" {w['rows'][0]['ms_per_step']:>8.2f}"
            f" {emb / 1e6:>7.2f} {w['embedding_a2a_gbs']:>9.2f} {pct:>5.1f}%"
        )


def print_phases(worlds: list[dict[str, Any]]) -> None:
    """--phases: both frameworks side by side, ms per step (mean over ranks), wall / thread CPU."""
    for w in worlds:
        ph = w.get("phases")
        if not ph:
            continue
        fws = [fw for fw in ("neo_train", "torchrec") if fw in ph]
        print(f"\nper-phase ms/step at W={w['world_size']} (training thread; exclusive; wall / CPU; mean over ranks):")
        head = f"{'phase':<24}" + "".join(f"{fw + ' wall':>16}{fw + ' CPU':>16}" for fw in fws)
        print(head + "\n" + "-" * len(head))
        rows = list(PHASE_ROWS)
        extra = sorted({k for fw in fws for k in ph[fw]["wall_ms"] if k not in PHASE_ROWS})
        for k in rows + extra:
            label = {"backward_other": "backward (+fused update)", "other": "other (rest of step)"}.get(k, k)
            line = f"{label:<24}"
            for fw in fws:
                line += f"{ph[fw]['wall_ms'].get(k, 0.0):>16.2f}{ph[fw]['cpu_ms'].get(k, 0.0):>16.2f}"
            print(line)
        line = f"{'step / process CPU':<24}"
        for fw in fws:
            line += f"{ph[fw]['step_ms']:>16.2f}{ph[fw]['process_cpu_ms']:>16.2f}"
        print(line)
        dg = ph["data_generation_ms"]
        print(f"data generation (outside the timed loop): {dg['synthetic_batch']:.2f} ms per rank batch "
              f"(+ {dg['to_kjt']:.3f} ms to wrap it as a KJT for TorchRec)")
        for fw in fws:
            if ph[fw]["missing_hooks"]:
                print(f"{fw}: hooks not installed (internals moved): {', '.join(ph[fw]['missing_hooks'])}")


def plot(worlds: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [*PHASES, *EXTRA]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = list(range(len(worlds)))
    bottom = [0.0] * len(worlds)
    cmap = plt.get_cmap("tab10")
    for i, c in enumerate(cols):
        vals = [max(0.0, (w["breakdown"] | w["breakdown_extra"])[c]) for w in worlds]
        ax.bar(xs, vals, 0.5, bottom=bottom, label=c, color=cmap(i))
        bottom = [a + v for a, v in zip(bottom, vals)]
    trec = [(x, r["ms_per_step"]) for x, w in zip(xs, worlds) for r in w["rows"] if r["framework"] == "torchrec"]
    if trec:
        ax.hlines([y for _, y in trec], [x - 0.35 for x, _ in trec], [x + 0.35 for x, _ in trec],
                  colors="black", linewidths=2.5, label="TorchRec ms/step", zorder=5)  # fmt: skip
    ax.set_xticks(xs, [f"W={w['world_size']}" for w in worlds])
    ax.set_ylabel("ms / step")
    ax.set_title("neo_train step breakdown (mean over ranks) vs TorchRec")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", default=None, help="comma list of W (default 2,4; 2 with --quick)")
    p.add_argument("--config", default="preset", choices=CONFIGS, help="'preset': the model of --preset; "
                   "'emb-heavy': 26 tables x 1M rows, dim 64, pooling 20-40 (rows x --row-scale)")
    p.add_argument("--preset", default=None, help="model preset (default small; tiny with --quick)")
    p.add_argument("--row-scale", type=float, default=None, help="multiply every table's rows (default 1; "
                   "1e-3 with --quick --config emb-heavy)")
    p.add_argument("--backend", default="auto", choices=("auto", "fbgemm", "reference"),
                   help="neo_train's kernel backend (auto: fbgemm when it imports); TorchRec always runs fbgemm")
    p.add_argument("--batch-size", type=int, default=None, help="per-rank batch b (default 512; 64 with --quick)")
    p.add_argument("--sharding", default="table_wise", choices=SHARDINGS, help="sharding type of every table")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 30; 3 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5; 1 with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="runs per framework and W, order alternating; "
                   "the median counts (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="W=2, tiny preset, 3 steps: a smoke test, not a measurement")
    p.add_argument("--no-torchrec", action="store_true", help="run neo_train only")
    p.add_argument("--no-pipeline", action="store_true", help="neo_train's plain loop instead of its TrainPipeline")
    p.add_argument("--phases", action="store_true", help="per-phase wall and CPU time of both frameworks "
                   "(same instrumentation on both; adds a little overhead to the timed loop)")
    p.add_argument("--json", default=None, help="write every number and the machine info here")
    p.add_argument("--plot", default=None, help="write neo_train's breakdown as a stacked-bar PNG here")
    args = p.parse_args(argv)
    q = args.quick
    args.world_sizes = [int(w) for w in (args.world_sizes or ("2" if q else "2,4")).split(",")]
    args.preset = args.preset or ("tiny" if q else "small")
    args.row_scale = args.row_scale or (1e-3 if q and args.config == "emb-heavy" else 1.0)
    args.batch_size = args.batch_size or (64 if q else 512)
    args.steps = args.steps or (3 if q else 30)
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 5)
    args.repeats = args.repeats or (1 if q else 3)

    info = machine_info()
    cfg = config_from_args(args)
    print(
        f"# {info['cpu']}, {info['cpu_count']} CPUs, torch {info['torch']}, torchrec {info['torchrec']}, "
        f"fbgemm_gpu {info['fbgemm_gpu']}, 1 thread/rank, load average {info['loadavg_1m_at_start']:.2f}\n"
        f"# {cfg.name} ({len(cfg.model.tables)} tables, {cfg.model.num_embedding_params / 1e6:.2f}M "
        f"embedding params, {cfg.model.interaction}), b={args.batch_size}/rank, {args.sharding}, "
        f"sparse {cfg.train.sparse_optimizer} lr {cfg.train.sparse_lr}, dense {cfg.train.dense_optimizer} "
        f"lr {cfg.train.dense_lr}, kernels {cfg.train.kernel_backend}, warmup {args.warmup} + {args.steps} timed steps",
        flush=True,
    )
    worlds = []
    for W in args.world_sizes:
        worlds.append(run_world(args, W))
    print()
    print_tables(worlds)
    if args.phases:
        print_phases(worlds)
    errors = [w for w in worlds if "torchrec_error" in w]
    for w in errors:
        print(f"\nTorchRec error at W={w['world_size']} (full text in the JSON):\n{_tail(w['torchrec_error'])}")
    if args.json:
        report = {"machine": info, "args": vars(args), "argv": sys.argv, "config": cfg.to_dict(), "worlds": worlds,
                  "rows": [r for w in worlds for r in w["rows"]]}  # fmt: skip
        if errors:
            report["torchrec_error"] = errors[0]["torchrec_error"]
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plot:
        plot(worlds, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
