"""Hot-row replication and quantized pooled-embedding exchange: bytes on the wire and step time,
measured on gloo ranks of this CPU and simulated at Model-A scale (issue 13, item 7).

    python benchmarks/hot_rows.py --json hot_rows.json --png hot_rows.png    # the default (~3 min, 2 cores)
    python benchmarks/hot_rows.py --quick --json h.json --png h.png          # a smoke run (~15 s)
    python benchmarks/hot_rows.py --world-sizes 2 --zipf 1.05 --sharding row_wise --steps 60
    python benchmarks/hot_rows.py --pooling 1 --zipf 1.05 --batch-size 4096 --dim 128 --steps 20 \
        --codecs '' --no-sim                   # the large-batch rows of notes/hot_rows.md (~3 min)

Issue 13's goal: at Zipf 1.05, ``dist.hot_rows = auto`` sends >= 2x fewer all-to-all bytes per
step than no replication, with a lower measured step time. The verdict is printed per W (PASS /
FAIL), from the numbers in the table, next to the reason.

1. Measured. For each W in --world-sizes (default 2, 4) and Zipf exponent in --zipf (default
   0.8, 1.05, 1.2; ``data.zipf_alpha``), one set of W gloo ranks (one torch thread each) trains
   every variant of the same model on the same batches:
       off       no replication, fp32 exchange (the baseline, measured in the same processes)
       auto      dist.hot_rows = "auto": per table the k that ``choose_hot_rows`` (the cost model,
                 pricing on the job's cluster: cpu_local here) expects to save the most step time,
                 0 where nothing pays
       K=<K>     dist.hot_rows = K (--fixed-k, default 1024; --quick 64; a comma list gives one variant
                 each, 0 none) rows of every table
       <codec>   no replication; dist.forward_comm_dtype = backward_comm_dtype = codec, for each
                 --codecs entry (default fp16, bf16, fp8_e4m3, int8; the list is checked against
                 neo_train.comm.CODECS, names it lacks are skipped with a note)
       off@RW    no replication on the row-wise plan (off@TW for a --sharding row_wise run): the
                 losses' rounding control (see "Losses"), not a contender (--no-control: left out)
   Model (flags change it): 8 tables of --rows 100,000 rows, D = --dim 64, sum pooling, rows
   drawn by the synthetic generator's power law; half of them (t0-t3) one-hot (pooling factor
   1: 5 % empty bags, the rest 1 + Poisson(0.05) ids), half (t4-t7) multi-hot (pooling factor
   --pooling 20). Bottom MLP 13-128-D, dot interaction, top MLP 128-64-1; the MLPs trained by
   Adam (lr 1e-3), the tables by the fused SGD (lr 0.05; see "Losses" below for why not the
   trainer's AdaGrad / row-wise AdaGrad); per-rank batch --batch-size 512; fbgemm kernels when they import;
   plan --sharding (table_wise: ``ShardingPlan.uniform``, which balances one- and multi-hot
   tables over the ranks). Steps: the pipelined loop (``TrainPipeline``, batch i+1's input dist
   in flight during batch i's backward) plus ``HotRowSchedule.after_step``, as ``Trainer.run``
   does. --warmup steps (default --window + 2: the first profiling window ends and the hot sets
   switch from rows 0..k-1 to the profiled top-k), then --steps (default 40) measured steps per
   variant, run in turns of --chunk (default 5) steps, the variants taking turns (round robin)
   so a shared machine's load spreads over all of them alike (there are no separate repeats:
   the median over the interleaved steps stands in for them). All variants of one (W, Zipf) live
   in the same W processes. The hot sets keep switching every --window (default 10) steps during the
   measurement, so the switches' collectives (``hot_rows_*``) are in the bytes: a pessimistic
   amortisation next to the config's default window of 100.
   Bytes: the trainer's own counters (``Trainer.comm_bytes_per_step``'s source: each
   collective's input tensor, by tag), differenced over the measured steps, mean over ranks, per
   step. An all-to-all's count includes the rank's segment to itself (1/W of a table-wise
   output dist); an all-reduce counts its tensor once (a ring sends 2(W-1)/W of it). Tags:
       input_dist       ids + lengths (int64 each) to the owners, and the split sizes
       output_dist      pooled rows (forward; codec bytes: the encoded wire tensor; a table-wise
                        table with replication: only its bags with a cold id)
       output_dist_bwd  their gradients (backward)
       dp_grad_counts   the replicas' gradient sync, every step: each rank's touched-row count per table
       dp_grad_sparse   then either each rank's touched rows (D float32 + an int32 id each, all-gathered)
       dp_grad_allreduce  or the (k, D) gradients + k touched-row marks (all-reduced), whichever moves
                        fewer bytes that step (``sharding/data_parallel.py``)
       hot_rows_*       switching hot sets: the pick all-reduce, the hash check, the replica gather
   "a2a" = input_dist + output_dist + output_dist_bwd (the goal's all-to-all bytes); "emb" = a2a
   + dp_grad_* + hot_rows_* (everything the embeddings send but the dense all-reduce,
   which is the same for every variant). Step time: per step the slowest rank's wall time;
   ms/step is the median over the measured steps, samples/s = W * b / that median (and the mean
   over the steps, in the JSON). Losses: the global-batch mean loss of every step (warm-up
   included); a replication variant must match "off" within 1e-5 relative at every step ("DIFF@s":
   it did not, first past 1e-6 at step s); a codec variant is lossy: "loss vs off" is then the
   relative difference of its mean loss over the measured steps. Replication is exact up to
   float32 rounding only (a bag's pooled row is summed as cold part + hot part, a hot row's
   gradient is all-reduced rather than summed by its owner), and a training trajectory can
   amplify rounding: a value within rounding of a decision point (a ReLU input at 0, ...) takes
   the other side and the losses part by 1e-5 to 1e-4 from there on. The extra variant "off@RW"
   (no replication on the other plan: row-wise for a table-wise run, else table-wise; float32
   sums in another order, nothing else changed) is that effect's control, reported next to any
   replication variant that drifts. Seen while writing this (W = 2 and 4, 52 steps): with the
   trainer's default optimizers (AdaGrad on the MLPs, row-wise AdaGrad on the tables) drifts
   were common, with or without any hot-set switch; with Adam (lr 1e-3) on the MLPs and SGD
   (lr 0.05) on the tables, the default here (--dense-optimizer / --sparse-optimizer / --*-lr),
   they are rarer, and the control drifted the same way in some of those runs (W = 4, Zipf 1.2:
   K=1024 and off@RW both 1.2e-5 from step 26). Where replication drifted alone (W = 2, Zipf
   1.2, auto: 1e-4 from step 19), its tables matched "off" to 3e-10 and the MLP to 3e-8 after 18
   steps; one update later the MLP differed by 1e-4 (an adaptive optimizer's full-size step on a
   weight whose gradient is exactly zero in one run and rounding noise in the other) and the
   tables by ~5e-8 on rows of every table, not at the hot rows.
   hot% = the share of the measured steps' ids that went to the replicas (one-hot / multi-hot
   tables), allhot% = the share of non-empty bags whose ids were all hot.

   The pooled exchange with replication (table-wise plans): a bag of a replicated table with no
   cold id (all its ids hot, or empty) pools to zeros on the owner, so its row skips output_dist
   and its gradient output_dist_bwd; both sides know which bags from the lengths they already
   hold (the owner from the input dist, the receiver from its own split), so no mask is sent
   (``neo_train/sharding/table_wise.py``). skip% = the share of the replicated tables' bags with
   no cold id; pool/off = (output_dist + output_dist_bwd) / off's. A one-hot bag skips with
   probability ~ its table's coverage c (plus the 5 % empty bags), a multi-hot one with ~c^L
   (L = 20: the empty bags only), so multi-hot features still save only their ids' input bytes:
   with D = 64 and fp32 a bag sends 8 (L + 1) id + length bytes and receives 4 D pooled bytes
   forward plus 4 D backward. Row-wise (reduce-scatter) and table-row-wise (reduce-scatter, then
   an all-to-all of summed rows) stay dense: a row shard's owner does not know a bag's whole cold
   length. --pooling 1 makes every table one-hot (a Criteo-like DLRM).

   Measured (2026-11-23, AMD EPYC, 2 CPUs shared with other jobs, load 3-7, fbgemm, table_wise,
   defaults: 100,000 x 64 tables, b = 512, window 10, 40 measured steps, --codecs '' --no-sim;
   the replicas' sync sparse at W = 2, dense at W = 4; notes/hot_rows_bench/out.txt):

       model             W  Zipf  auto k 1h|mh  a2a/off auto  K=1024  ms/step off -> auto
       4 one-hot +       2  0.8    256|4          0.876      0.819   37.1 -> 56.3
       4 multi-hot       2  1.05   512|16         0.690      0.632   31.3 -> 51.8
       (L = 20)          2  1.2   1024|16         0.581      0.524   19.5 -> 32.1
                         4  0.8     16|4          0.920      0.820   73.1 -> 108.5
                         4  1.05    32|16         0.774      0.633   52.9 -> 83.8
                         4  1.2     64|16         0.644      0.524   42.2 -> 76.0
       8 one-hot         2  0.8    256            0.777      0.734   16.2 -> 27.8
       (--pooling 1)     2  1.05   512            0.431      0.411   20.5 -> 29.5
                         2  1.2   1024            0.235      0.235   20.4 -> 41.2
                         4  0.8     16            0.877      0.735   46.3 -> 63.5
                         4  1.05    32            0.622      0.411   43.3 -> 71.6
                         4  1.2     64            0.378      0.235   41.1 -> 64.4

   (with the dense sync only, auto picked k = 16-64 | 4-16 at every W: 0.773 / 0.621 at Zipf
   1.05; before the skip, 0.96 on the mixed model.) The bytes goal is met on the all one-hot
   model at W = 2 (2.32x fewer all-to-all bytes), not elsewhere, and the time goal nowhere:
   replication is 1.5-1.7x slower per step here (medians over interleaved runs). Bytes: auto picks
   the k with the largest net saving; the replicas' sync costs the cheaper of the dense (k, D)
   all-reduce (8 (D + 1) (W - 1) / W bytes a row, touched or not) and the all-gather of the rows a
   rank touched ((W - 1) 4 (D + 1) bytes each): at W = 2 the latter lets k grow to rows hit about
   once per step (k = 512, coverage 0.61), at W = 4 a touched row costs 3 peers' worth and k = 32
   dense nets more. Multi-hot tables (L = 20) save their ids only: their bags are rarely all hot.
   Time: on one host the all-to-all is a memory copy, so the replication's extra work (the id
   split, the replica lookups, the sync's rendezvous and the fused update, the profiler) costs
   more than the bytes it saves (lookup, dense_fwd and bwd_other grow, output_dist does not).

2. Simulated (``benchmarks/opera_study.py``'s simulator and setup): the ISI study's Model-A
   (``opera_model_a``: 1000 tables of 10^7 x 80, bags of 100) at --sim-nodes 128 nodes x 8
   GPUs, global batch 524,288 (b = 512 per GPU), tables placed table-wise by the planner, fat-tree
   (ring all-reduce, per-packet spraying) and Opera (DPS all-reduce, every flow on the bulk
   path), the study's pairings. Unlike the study, the id exchange is simulated (input_a2a,
   ``IterationSpec(input_dist=True)``: G * b * (4 + L * 8) bytes per feature and host pair),
   since that is what replication shrinks. Variants:
       off      as is (fp32)
       auto@a   per table auto's k from ``choose_hot_rows`` on a Config of that model (its
                planner plan, W = 1024 ranks, Zipf a, b = 512) and its coverage c = zipf_coverage;
                the ids' share of the input dist is scaled by 1 - c (lengths still cross), and
                the replicas' gradient + marks, 4 k (D + 1) bytes per table, join the top MLP's
                all-reduce (as the simulator prices data-parallel tables: at W = 1024 the sparse
                all-gather of touched rows, (W - 1) x the rows a rank touches, never costs less,
                so ``choose_hot_rows`` expects the dense sync there too); the pooled
                exchange stays dense (bags of 100 ids: a bag has no cold id with ~c^100 ~ 0)
       <codec>  pooled bytes (forward and backward) per element: fp16/bf16 2, fp8 1 + 4/D (a
                4-byte scale per row), int8 1 + 8/D (scale + min), D = 80; a row here is one
                table's pooled vector (neo_train scales one row per sample and peer, which can
                span several tables, so this is an upper bound on the overhead)
   Reported per network: bytes on the network per iteration by phase, each communication phase's
   simulated time, the time some communication is in flight (the union of the phases: "comm
   ms") and the iteration's makespan, with the ratios to "off".

--json writes every number (per-step times and losses, per-table k and coverages, the simulated
phases) and the machine; --png a chart: measured bytes per step by tag and variant, the
replication variants' ratios to "off" per Zipf exponent, and the simulated communication time.
--quick: W = 2, Zipf 1.05, 20,000-row tables of D = 16, b = 64, window 3, 4 measured steps, the
simulation at 16 nodes: a smoke test of the script, its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from neo_train.comm import make_codec
from neo_train.config import DENSE_OPTIMIZERS, SPARSE_OPTIMIZERS, Config, DataConfig, DistConfig, ModelConfig
from neo_train.config import TableConfig, TrainConfig
from neo_train.kernels import available_backends
from neo_train.planning.plan import ShardingPlan
from neo_train.testing import run_ranks
from report_io import write_outputs  # noqa: E402  (benchmarks/ is on the path: run as a script)

__all__ = ["main", "make_config", "Variant", "simulate_model_a"]

GOAL = {"zipf": 1.05, "max_a2a_ratio": 0.5, "variant": "auto"}
A2A_TAGS = ("input_dist", "output_dist", "output_dist_bwd")
DEFAULT_CODECS = ("fp16", "bf16", "fp8_e4m3", "int8")
LOSS_RTOL = 1e-5
SHARDINGS = ("table_wise", "row_wise", "table_row_wise")  # the plans hot-row replication supports


@dataclass(frozen=True)
class Variant:
    name: str
    hot_rows: str = "off"  # dist.hot_rows
    codec: str = "fp32"  # dist.forward_comm_dtype and backward_comm_dtype
    sharding: str | None = None  # another plan than the job's (the rounding control)

    @property
    def replicates(self) -> bool:
        return self.hot_rows != "off"


@dataclass(frozen=True)
class Job:
    """What every rank of one (W, alpha) set of processes runs."""

    cfg: Config
    sharding: str
    variants: tuple[Variant, ...]
    warmup: int
    steps: int
    chunk: int


# ---- the model ------------------------------------------------------------------------------------
def make_config(rows: int, dim: int, tables: int, pooling: float, batch: int, alpha: float, window: int,
                backend: str, seed: int = 0, dense_optimizer: str = "adam", dense_lr: float = 1e-3,
                sparse_optimizer: str = "sgd", sparse_lr: float = 0.05) -> Config:  # fmt: skip
    """``tables`` tables of ``rows`` x ``dim``: the first half one-hot (pooling factor 1), the rest
    multi-hot (``pooling``); see the module docstring."""
    one_hot = tables // 2
    ts = tuple(TableConfig(f"t{i}", rows, dim, pooling="sum", pooling_factor=1.0 if i < one_hot else float(pooling))
               for i in range(tables))  # fmt: skip
    model = ModelConfig(ts, num_dense_features=13, bottom_mlp=(128, dim), top_mlp=(128, 64), interaction="dot")
    if backend == "auto":
        backend = "fbgemm" if "fbgemm" in available_backends() else "reference"
    train = TrainConfig(batch_size=batch, steps=10_000, kernel_backend=backend, seed=seed, log_every=10_000,
                        dense_optimizer=dense_optimizer, dense_lr=dense_lr, sparse_optimizer=sparse_optimizer,
                        sparse_lr=sparse_lr)  # fmt: skip
    return Config(model, train, DataConfig(zipf_alpha=alpha), DistConfig(hot_rows_window=window), name="hot_rows")


def variant_config(cfg: Config, v: Variant) -> Config:
    return cfg.replace(dist=cfg.dist.replace(hot_rows=v.hot_rows, forward_comm_dtype=v.codec,
                                             backward_comm_dtype=v.codec))  # fmt: skip


# ---- one rank -------------------------------------------------------------------------------------
@dataclass
class _Run:
    variant: Variant
    trainer: Any
    pipe: Any
    step: int = 0
    losses: list = dataclasses.field(default_factory=list)  # local loss tensors, every step
    step_s: list = dataclasses.field(default_factory=list)  # measured steps' wall seconds
    bytes0: dict = dataclasses.field(default_factory=dict)
    hot_stats: dict = dataclasses.field(default_factory=dict)  # table -> see _hot_counts
    switches: int = 0


def _hot_counts(run: _Run, batch: Any, hot: dict[str, torch.Tensor]) -> None:
    """Add batch's per-table (ids, hot ids, non-empty bags, all-hot non-empty bags, bags, bags with
    no cold id: all hot or empty, the ones a table-wise plan's pooled exchange skips) under hot
    sets ``hot``."""
    parts = batch.sparse.by_feature()
    cfg = run.trainer.cfg.model
    for t, ids_hot in hot.items():
        acc = run.hot_stats.setdefault(t, [0, 0, 0, 0, 0, 0])
        for f in cfg.table(t).feature_names:
            values, lengths, _ = parts[f]
            is_hot = torch.isin(values.to(torch.int64), ids_hot)
            b = lengths.numel()
            bag = torch.repeat_interleave(torch.arange(b), lengths.to(torch.int64), output_size=values.numel())
            hot_len = torch.zeros(b, dtype=torch.int64).index_add_(0, bag, is_hot.to(torch.int64))
            nonempty = lengths > 0
            acc[0] += int(values.numel())
            acc[1] += int(is_hot.sum())
            acc[2] += int(nonempty.sum())
            no_cold = hot_len == lengths.to(torch.int64)
            acc[3] += int((nonempty & no_cold).sum())
            acc[4] += b
            acc[5] += int(no_cold.sum())


def _one_step(run: _Run, batches: list, measured: bool) -> None:
    tr = run.trainer
    t0 = time.perf_counter()
    loss = run.pipe.step(run.step)
    t1 = time.perf_counter()
    # (untimed) the hot sets the next batch's input dist, started inside step(), was split by
    hot = tr.model.embeddings.hot_rows if (measured and tr.hot is not None) else None
    t2 = time.perf_counter()
    if tr.hot is not None:
        run.switches += int(tr.hot.after_step(run.step + 1, tr.comm))
    dt = (t1 - t0) + (time.perf_counter() - t2)
    run.losses.append(loss)
    if measured:
        run.step_s.append(dt)
    run.step += 1
    if hot is not None and measured and run.step < len(batches):
        _hot_counts(run, batches[run.step], hot)


def rank_job(comm, job: Job) -> dict[str, Any]:
    """Every variant on this rank: build, warm up, measured steps round robin; rank 0 returns."""
    from neo_train.data.synthetic import SyntheticData
    from neo_train.planning.hot_rows import choose_hot_rows
    from neo_train.topology.networks import job_cluster
    from neo_train.train.pipeline import TrainPipeline
    from neo_train.train.trainer import Trainer

    cfg, W = job.cfg, comm.world_size
    plans = {sh: ShardingPlan.uniform(cfg.model, sh, W) for sh in {job.sharding, *(v.sharding or job.sharding for v in job.variants)}}
    for pl in plans.values():
        pl.validate(cfg.model, W)
    plan = plans[job.sharding]
    b = cfg.train.batch_size
    total = job.warmup + job.steps
    data = SyntheticData(cfg.model, cfg.data, b, seed=cfg.train.seed, rank=comm.rank, world_size=W)
    batches = [data.batch(s) for s in range(total + 2)]  # the pipeline reads up to two ahead
    t_build = time.perf_counter()
    runs: list[_Run] = []
    for v in job.variants:
        vcfg = variant_config(cfg, v)
        tr = Trainer(vcfg, comm=comm, plan=plans[v.sharding or job.sharding], progress=False, train_data=batches)
        runs.append(_Run(v, tr, TrainPipeline(tr, iter(batches))))
    build_s = time.perf_counter() - t_build
    for run in runs:  # warm-up: the first profiling window ends, the hot sets switch
        for _ in range(job.warmup):
            _one_step(run, batches, measured=False)
    comm.barrier()
    for run in runs:
        run.bytes0 = dict(run.trainer.comm.bytes_by_tag)
        run.trainer.timer.reset()  # the step breakdown covers the measured steps only
    done = 0
    while done < job.steps:
        n = min(job.chunk, job.steps - done)
        for run in runs:
            for _ in range(n):
                _one_step(run, batches, measured=True)
        done += n
    out_runs, breakdowns = [], []
    for run in runs:
        tr = run.trainer
        counted = tr.comm.bytes_by_tag
        mine = {tag: (counted.get(tag, 0) - run.bytes0.get(tag, 0)) / job.steps for tag in sorted(set(counted))}
        run.pipe.close()
        # ms per measured step by phase (Trainer.step_breakdown) and per collective tag (comm:<tag>,
        # the wall time of its call or of its wait), on this rank
        timing = {"phases_ms": tr.step_breakdown(job.steps),
                  "comm_ms": {k[5:]: 1e3 * v / job.steps for k, v in tr.timer.totals().items() if k.startswith("comm:")}}
        breakdowns.append(timing)
        tags = sorted(mine)
        # every rank's counters (tags alike on every rank: same collectives), per-step times, losses
        # go through the raw communicator, so the trainers' counters do not see them
        all_bytes = comm.all_gather_v(torch.tensor([mine[t] for t in tags], dtype=torch.float64),
                                      [len(tags)] * W, tag="bench").view(W, len(tags))  # fmt: skip
        step_max = comm.all_reduce(torch.tensor(run.step_s, dtype=torch.float64), op="max", tag="bench")
        losses = comm.all_reduce(torch.stack(run.losses).double(), op="avg", tag="bench")
        stats = {t: torch.tensor(v, dtype=torch.float64) for t, v in sorted(run.hot_stats.items())}
        if stats:
            flat = comm.all_reduce(torch.cat(list(stats.values())), tag="bench").view(-1, 6)
            stats = {t: flat[i].tolist() for i, t in enumerate(stats)}
        k = dict(getattr(tr.hot, "k", {}) or {})
        vplan = plans[run.variant.sharding or job.sharding]
        cluster = job_cluster(tr.cfg.dist.topology, W, W, "cpu")  # what the trainer priced auto's k on
        choice = {t: asdict(c) for t, c in choose_hot_rows(tr.cfg, vplan, W, run.variant.hot_rows, cluster).items()}
        out_runs.append({
            "variant": asdict(run.variant),
            "k": k,
            "cost_model": choice,
            "switches": run.switches,
            "bytes_per_step_ranks": {t: all_bytes[:, i].tolist() for i, t in enumerate(tags)},
            "step_s": step_max.tolist(),
            "losses": losses.tolist(),
            "hot_stats": stats,
            "backend": tr.backend,
        })
        del tr
        run.trainer = run.pipe = None
        gc.collect()
    if comm.rank != 0:
        return {"timing": breakdowns}
    return {"timing": breakdowns, "runs": out_runs, "plan": plan.to_dict(), "build_s": build_s,
            "ids_per_step": [sum(bt.sparse.feature_value_counts()) for bt in batches[job.warmup:total]]}  # fmt: skip


# ---- summarising one (W, alpha) -------------------------------------------------------------------
def _mean_dicts(ds: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for d in ds for k in d})
    return {k: sum(d.get(k, 0.0) for d in ds) / len(ds) for k in keys}


def _summarise(res: dict[str, Any], timing: list[list[dict[str, Any]]], cfg: Config, W: int, alpha: float
               ) -> list[dict[str, Any]]:  # fmt: skip
    b = cfg.train.batch_size
    one_hot = {t.name for t in cfg.model.tables if t.pooling_factor <= 1.0}
    rows = []
    for ri, r in enumerate(res["runs"]):
        per_rank = r["bytes_per_step_ranks"]
        mean = {t: sum(v) / len(v) for t, v in per_rank.items()}
        rank0 = {t: v[0] for t, v in per_rank.items()}
        a2a = sum(mean.get(t, 0.0) for t in A2A_TAGS)
        extra = sum(v for t, v in mean.items() if t.startswith(("dp_grad_", "hot_rows")))
        med = statistics.median(r["step_s"])
        st = r["hot_stats"]

        def share(tables: set[str], i: int, j: int) -> float | None:
            num = sum(st[t][i] for t in st if t in tables)
            den = sum(st[t][j] for t in st if t in tables)
            return num / den if den else None

        names = {t.name for t in cfg.model.tables}
        rows.append({
            "world_size": W, "zipf": alpha, "variant": r["variant"]["name"], "hot_rows": r["variant"]["hot_rows"],
            "codec": r["variant"]["codec"], "control": r["variant"]["sharding"], "k": r["k"], "cost_model": r["cost_model"], "switches": r["switches"],
            "bytes_per_step": mean, "bytes_per_step_rank0": rank0, "bytes_per_step_ranks": per_rank,
            "a2a_bytes": a2a, "emb_bytes": a2a + extra,
            "step_ms": 1e3 * med, "step_ms_mean": 1e3 * sum(r["step_s"]) / len(r["step_s"]),
            "samples_per_s": W * b / med, "samples_per_s_mean": W * b * len(r["step_s"]) / sum(r["step_s"]),
            "step_s": r["step_s"], "losses": r["losses"], "final_loss": r["losses"][-1],
            "hot_share_one_hot": share(one_hot, 1, 0), "hot_share_multi_hot": share(names - one_hot, 1, 0),
            "all_hot_bags_one_hot": share(one_hot, 3, 2), "all_hot_bags_multi_hot": share(names - one_hot, 3, 2),
            "no_cold_bags_one_hot": share(one_hot, 5, 4), "no_cold_bags_multi_hot": share(names - one_hot, 5, 4),
            "no_cold_bags": share(names, 5, 4),
            "hot_stats": st, "backend": r["backend"],
            "phases_ms": _mean_dicts([t[ri]["phases_ms"] for t in timing]),
            "comm_ms": _mean_dicts([t[ri]["comm_ms"] for t in timing]),
        })  # fmt: skip
    off = next(x for x in rows if x["variant"] == "off")
    out_bytes = off["bytes_per_step"].get("output_dist", 0.0) + off["bytes_per_step"].get("output_dist_bwd", 0.0)
    off_mean = sum(off["losses"][-len(off["step_s"]):]) / len(off["step_s"])
    for x in rows:
        x["a2a_ratio"] = x["a2a_bytes"] / off["a2a_bytes"]
        x["emb_ratio"] = x["emb_bytes"] / off["emb_bytes"]
        x["step_ratio"] = x["step_ms"] / off["step_ms"]
        rel = [abs(a - c) / max(abs(c), 1e-12) for a, c in zip(x["losses"], off["losses"])]
        x["loss_max_rel_diff_vs_off"] = max(rel) if rel else 0.0
        x["loss_matches_off"] = x["loss_max_rel_diff_vs_off"] <= LOSS_RTOL
        x["loss_first_step_over_1e-6"] = next((i for i, v in enumerate(rel) if v > 1e-6), None)
        n = len(x["step_s"])  # the measured steps are the last n
        x["mean_loss_measured"] = sum(x["losses"][-n:]) / n
        x["mean_loss_rel_diff_vs_off"] = (x["mean_loss_measured"] - off_mean) / off_mean
        xo = x["bytes_per_step"].get("output_dist", 0.0) + x["bytes_per_step"].get("output_dist_bwd", 0.0)
        x["input_ratio"] = x["bytes_per_step"].get("input_dist", 0.0) / max(off["bytes_per_step"].get("input_dist", 0.0), 1e-12)
        x["pooled_ratio"] = xo / out_bytes if out_bytes else None  # output_dist + output_dist_bwd vs off's
    ctrl = next((x for x in rows if x["control"]), None)
    for x in rows:  # the rounding control's drift, next to every replication variant's
        if ctrl is not None and x["hot_rows"] != "off":
            x["control_max_rel_diff_vs_off"] = ctrl["loss_max_rel_diff_vs_off"]
            x["control_first_step_over_1e-6"] = ctrl["loss_first_step_over_1e-6"]
    return rows


# ---- 2. the simulation at Model-A scale ---------------------------------------------------------------
def codec_bytes_per_element(codec: str, dim: int) -> float:
    """Pooled bytes per element on the wire (a 4- or 8-byte row header over one D-wide row for
    the row-scaled codecs): ``Codec.row_bytes`` over D."""
    return make_codec(codec).row_bytes(dim) / dim


def simulate_model_a(nodes: int, tables: int, alphas: Sequence[float], codecs: Sequence[str],
                     global_batch: int = 524_288) -> dict[str, Any]:  # fmt: skip
    """Off / auto per alpha / each codec on fat-tree + ring and Opera + DPS (see the docstring)."""
    from neo_train.planning.hot_rows import choose_hot_rows
    from neo_train.topology.collectives import all_reduce, all_to_all
    from neo_train.topology.simulator import Comm, simulate
    from neo_train.topology.study import cluster_for, make_network, model_for
    from neo_train.topology.workload import IterationSpec, _embedding_matrices, build_iteration

    t_start = time.perf_counter()
    model = model_for("opera_model_a", tables)
    cluster = cluster_for("opera_study", nodes)
    N, G = cluster.nodes, cluster.devices_per_node
    W = N * G
    b = global_batch // W
    dims = {t.dim for t in model.tables}
    D = max(dims)
    variants: list[dict[str, Any]] = [{"name": "off", "alpha": None, "codec": "fp32"}]
    variants += [{"name": f"auto@{a:g}", "alpha": a, "codec": "fp32"} for a in alphas]
    variants += [{"name": c, "alpha": None, "codec": c} for c in codecs]
    out: dict[str, Any] = {"nodes": N, "gpus_per_node": G, "world_size": W, "tables": len(model.tables),
                           "rows": model.tables[0].num_rows, "dim": D, "bag": model.tables[0].pooling_factor,
                           "global_batch": global_batch, "local_batch": b, "rows_by_network": []}  # fmt: skip
    choices: dict[float, dict[str, Any]] = {}
    for net, ar in (("fattree", "ring"), ("opera", "dps")):
        spec = IterationSpec(model, cluster, global_batch, ar, "direct", input_dist=True)
        it = build_iteration(spec)
        plan = it.plan
        network = make_network(net, cluster, routing="spray")
        base: dict[str, float] | None = None
        for v in variants:
            scale = {t.name: 1.0 for t in model.tables}
            hot_bytes, ks, cov = 0.0, {}, {}
            if v["alpha"] is not None:
                if v["alpha"] not in choices:
                    cfg = Config(model, TrainConfig(batch_size=b), DataConfig(zipf_alpha=v["alpha"]))
                    choices[v["alpha"]] = choose_hot_rows(cfg, plan, W, "auto", cluster)
                for t, c in choices[v["alpha"]].items():
                    scale[t] = 1.0 - c.coverage
                    hot_bytes += 4.0 * c.k * (model.table(t).dim + 1)
                    ks[t], cov[t] = c.k, c.coverage
            e = codec_bytes_per_element(v["codec"], D)
            pooled, _ = _embedding_matrices(dataclasses.replace(spec, wire_bytes=e), plan, b)  # type: ignore[arg-type]
            ids_model = model.replace(tables=tuple(t.replace(pooling_factor=t.pooling_factor * scale[t.name])
                                                   for t in model.tables))  # fmt: skip
            _, idm = _embedding_matrices(dataclasses.replace(spec, model=ids_model), plan, b)
            phases = []
            for p in it.phases:
                if isinstance(p, Comm) and p.name == "input_a2a":
                    p = all_to_all(idm, name=p.name, after=p.after, algorithm=p.algorithm)
                elif isinstance(p, Comm) and p.name == "fwd_a2a":
                    p = all_to_all(pooled, name=p.name, after=p.after, algorithm=p.algorithm)
                elif isinstance(p, Comm) and p.name == "bwd_a2a":
                    p = all_to_all(pooled.T, name=p.name, after=p.after, algorithm=p.algorithm)
                elif isinstance(p, Comm) and p.name == "ar_top" and hot_bytes > 0:
                    p = all_reduce(ar, N, p.payload + hot_bytes, name=p.name, after=p.after, devices_per_host=G)
                phases.append(p)
            t0 = time.perf_counter()
            res = simulate(phases, network)
            by_phase = {p.name: {"ms": 1e3 * p.duration, "bound_ms": 1e3 * p.lower_bound, "gb": p.network_bytes / 1e9}
                        for p in res.phases if p.kind != "compute"}  # fmt: skip
            a2a_gb = sum(by_phase[n]["gb"] for n in ("input_a2a", "fwd_a2a", "bwd_a2a"))
            row = {
                "network": net, "allreduce": ar, "variant": v["name"], "alpha": v["alpha"], "codec": v["codec"],
                "bytes_per_element": e, "hot_rows_k": sorted(set(ks.values())), "coverage": sorted(set(cov.values())),
                "replica_allreduce_gb": hot_bytes / 1e9, "phases": by_phase, "a2a_gb": a2a_gb,
                "comm_ms": 1e3 * res.comm_busy_time(), "a2a_ms": 1e3 * res.busy_time("all_to_all"),
                "iteration_ms": 1e3 * res.total, "sim_wall_s": time.perf_counter() - t0,
            }  # fmt: skip
            if base is None:
                base = row
            row["a2a_ratio"] = a2a_gb / base["a2a_gb"]
            row["comm_ratio"] = row["comm_ms"] / base["comm_ms"]
            row["a2a_time_ratio"] = row["a2a_ms"] / base["a2a_ms"]
            row["iteration_ratio"] = row["iteration_ms"] / base["iteration_ms"]
            out["rows_by_network"].append(row)
            print(f"  sim {net:<8} {v['name']:<10} a2a {a2a_gb:7.1f} GB ({row['a2a_ratio']:.2f}x)  comm "
                  f"{row['comm_ms']:7.1f} ms  iteration {row['iteration_ms']:7.1f} ms  ({row['sim_wall_s']:.1f} s)",
                  flush=True)  # fmt: skip
    out["auto_choices"] = {str(a): {t: asdict(c) for t, c in list(ch.items())[:3]} | {"tables_chosen": len(ch)}
                           for a, ch in choices.items()}  # fmt: skip
    out["wall_s"] = time.perf_counter() - t_start
    return out


# ---- printing ---------------------------------------------------------------------------------------
def _k_text(row: dict[str, Any], cfg: Config) -> str:
    if not row["k"]:
        return "-"
    one = {t.name for t in cfg.model.tables if t.pooling_factor <= 1.0}
    ko = sorted({k for t, k in row["k"].items() if t in one})
    km = sorted({k for t, k in row["k"].items() if t not in one})
    fmt = lambda ks: "/".join(str(k) for k in ks) or "0"  # noqa: E731
    return f"{fmt(ko)}|{fmt(km)}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _pct(x: float | None) -> str:
    return f"{100 * x:5.1f}" if x is not None else "    -"


def print_measured(rows: list[dict[str, Any]], cfg: Config) -> None:
    KB = 1e3
    head = (f"{'W':>2} {'zipf':>4} {'variant':<9} {'k 1h|mh':>10} {'in_dist':>8} {'out':>8} {'out_bwd':>8} "
            f"{'a2a KB':>8} {'a2a/off':>7} {'dp_sync':>7} {'hot_*':>6} {'emb/off':>7} {'hot% 1h':>7} {'mh':>5} "
            f"{'allhot1h':>8} {'skip%':>5} {'pool/off':>8} {'ms/step':>8} {'/off':>5} {'samples/s':>9} {'final loss':>10} "
            f"{'loss vs off':>13}")  # fmt: skip
    print(head)
    print("-" * len(head))
    last = None
    for r in rows:
        if last is not None and (r["world_size"], r["zipf"]) != last:
            print()
        last = (r["world_size"], r["zipf"])
        bt = r["bytes_per_step"]
        hot = sum(v for t, v in bt.items() if t.startswith("hot_rows"))
        sync = sum(v for t, v in bt.items() if t.startswith("dp_grad_"))
        if r["variant"] == "off":
            lv = "baseline"
        elif r["control"]:
            lv = f"{r['loss_max_rel_diff_vs_off']:.0e} ctrl"
        elif r["hot_rows"] != "off":
            first = r["loss_first_step_over_1e-6"]
            lv = f"{r['loss_max_rel_diff_vs_off']:.0e} " + ("ok" if r["loss_matches_off"] else f"DIFF@{first}")
        else:
            lv = f"{r['mean_loss_rel_diff_vs_off']:+.1e} mean"
        pool = f"{r['pooled_ratio']:8.3f}" if r["pooled_ratio"] is not None else f"{'-':>8}"
        print(f"{r['world_size']:>2} {r['zipf']:>4g} {r['variant']:<9} {_k_text(r, cfg):>10} "
              f"{bt.get('input_dist', 0) / KB:>8.1f} {bt.get('output_dist', 0) / KB:>8.1f} "
              f"{bt.get('output_dist_bwd', 0) / KB:>8.1f} {r['a2a_bytes'] / KB:>8.1f} {r['a2a_ratio']:>7.3f} "
              f"{sync / KB:>7.1f} {hot / KB:>6.1f} {r['emb_ratio']:>7.3f} "
              f"{_pct(r['hot_share_one_hot']):>7} {_pct(r['hot_share_multi_hot']):>5} {_pct(r['all_hot_bags_one_hot']):>8} "
              f"{_pct(r['no_cold_bags']):>5} {pool} {r['step_ms']:>8.1f} {r['step_ratio']:>5.2f} {r['samples_per_s']:>9,.0f} "
              f"{r['final_loss']:>10.6f} {lv:>13}")  # fmt: skip


BREAKDOWN = (("input_dist", ("input_dist", "pipeline_wait")), ("lookup", ("lookup",)), ("output_dist", ("output_dist",)),
             ("dense_fwd", ("dense_forward",)), ("emb_comm_bwd", ("embedding_comm_backward",)),
             ("bwd_other", ("backward_other",)), ("optimizer", ("optimizer",)), ("check", ("check_inputs",)))


def print_breakdown(rows: list[dict[str, Any]]) -> None:
    """Where a step's time goes (Trainer.step_breakdown, mean over ranks), at the goal's Zipf."""
    zipf = GOAL["zipf"] if any(math.isclose(r["zipf"], GOAL["zipf"]) for r in rows) else rows[0]["zipf"]
    sel = [r for r in rows if math.isclose(r["zipf"], zipf)]
    head = (f"{'W':>2} {'variant':<9} {'ms/step':>8} " + " ".join(f"{name:>12}" for name, _ in BREAKDOWN)
            + f" {'dp_grad_*':>10} {'hot_rows_*':>10}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in sel:
        ph, cm = r["phases_ms"], r["comm_ms"]
        cols = " ".join(f"{sum(ph.get(k, 0.0) for k in keys):>12.2f}" for _, keys in BREAKDOWN)
        hot = sum(v for k, v in cm.items() if k.startswith("hot_rows"))
        sync = sum(v for k, v in cm.items() if k.startswith("dp_grad_"))
        print(f"{r['world_size']:>2} {r['variant']:<9} {r['step_ms']:>8.1f} {cols} {sync:>10.2f} "
              f"{hot:>10.2f}")  # fmt: skip


def print_simulated(sim: dict[str, Any]) -> None:
    head = (f"{'network':<8} {'variant':<10} {'B/elem':>6} {'k':>6} {'cover':>5} {'input GB':>8} {'fwd GB':>7} "
            f"{'bwd GB':>7} {'a2a GB':>7} {'a2a/off':>7} {'rep AR GB':>9} {'input ms':>8} {'fwd ms':>7} "
            f"{'bwd ms':>7} {'ar_top ms':>9} {'comm ms':>8} {'/off':>5} {'iter ms':>8} {'/off':>5}")  # fmt: skip
    print(head)
    print("-" * len(head))
    last = None
    for r in sim["rows_by_network"]:
        if last is not None and r["network"] != last:
            print()
        last = r["network"]
        ph = r["phases"]
        k = "/".join(str(x) for x in r["hot_rows_k"]) or "-"
        cov = "/".join(f"{x:.2f}" for x in r["coverage"]) or "-"
        print(f"{r['network']:<8} {r['variant']:<10} {r['bytes_per_element']:>6.3f} {k:>6} {cov:>5} "
              f"{ph['input_a2a']['gb']:>8.1f} {ph['fwd_a2a']['gb']:>7.1f} {ph['bwd_a2a']['gb']:>7.1f} "
              f"{r['a2a_gb']:>7.1f} {r['a2a_ratio']:>7.3f} {r['replica_allreduce_gb']:>9.3f} "
              f"{ph['input_a2a']['ms']:>8.1f} {ph['fwd_a2a']['ms']:>7.1f} {ph['bwd_a2a']['ms']:>7.1f} "
              f"{ph['ar_top']['ms']:>9.1f} {r['comm_ms']:>8.1f} {r['comm_ratio']:>5.2f} {r['iteration_ms']:>8.1f} "
              f"{r['iteration_ratio']:>5.2f}")  # fmt: skip


def goal_verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for W in sorted({r["world_size"] for r in rows}):
        sel = [r for r in rows if r["world_size"] == W and math.isclose(r["zipf"], GOAL["zipf"])]
        auto = next((r for r in sel if r["variant"] == GOAL["variant"]), None)
        off = next((r for r in sel if r["variant"] == "off"), None)
        if auto is None or off is None:
            continue
        bytes_ok = auto["a2a_ratio"] <= GOAL["max_a2a_ratio"]
        time_ok = auto["step_ms"] < off["step_ms"]
        bt = off["bytes_per_step"]
        input_share = bt.get("input_dist", 0.0) / off["a2a_bytes"]
        out.append({
            "world_size": W, "a2a_ratio": auto["a2a_ratio"], "a2a_reduction": 1 / auto["a2a_ratio"],
            "step_ms": auto["step_ms"], "off_step_ms": off["step_ms"], "bytes_met": bytes_ok, "time_met": time_ok,
            "met": bytes_ok and time_ok, "input_share_off": input_share,
            "input_ratio": auto["input_ratio"], "pooled_ratio": auto["pooled_ratio"],
            "no_cold_bags_one_hot": auto["no_cold_bags_one_hot"], "no_cold_bags_multi_hot": auto["no_cold_bags_multi_hot"],
            "loss_matches_off": auto["loss_matches_off"],
            "codecs_meeting_bytes": [r["variant"] for r in sel if r["hot_rows"] == "off" and r["codec"] != "fp32"
                                     and r["a2a_ratio"] <= GOAL["max_a2a_ratio"]],
        })  # fmt: skip
    return out


def print_goal(goals: list[dict[str, Any]], rows: list[dict[str, Any]], quick: bool) -> None:
    print(f"\n## goal (issue 13): Zipf {GOAL['zipf']}, dist.hot_rows = auto: all-to-all bytes <= "
          f"{GOAL['max_a2a_ratio']} x off (>= 2x fewer) AND a lower measured step time")  # fmt: skip
    if not goals:
        print("not measured (Zipf 1.05 is not in this run)")
    for g in goals:
        print(f"  W={g['world_size']}: a2a {g['a2a_ratio']:.3f} x off ({g['a2a_reduction']:.2f}x fewer) "
              f"{'met' if g['bytes_met'] else 'NOT met'}; step {g['step_ms']:.1f} ms vs off {g['off_step_ms']:.1f} ms "
              f"{'met' if g['time_met'] else 'NOT met'}; losses {'match' if g['loss_matches_off'] else 'DIFFER'}"
              f" -> {'PASS' if g['met'] else 'FAIL'}")  # fmt: skip
        pr = "-" if g["pooled_ratio"] is None else f"{g['pooled_ratio']:.3f}"
        print(f"        where: input_dist is {100 * g['input_share_off']:.1f}% of off's all-to-all bytes and shrinks to "
              f"{g['input_ratio']:.3f}x; the pooled exchange (forward + backward, the rest) to {pr}x: table-wise bags "
              f"with no cold id skip it (one-hot tables' bags: {_share(g['no_cold_bags_one_hot'])}, multi-hot: "
              f"{_share(g['no_cold_bags_multi_hot'])}, of the tables auto replicates; row-wise and table-row-wise "
              f"exchanges stay dense)")  # fmt: skip
        if g["codecs_meeting_bytes"]:
            print(f"        (the byte target is met by the codecs {', '.join(g['codecs_meeting_bytes'])}, which narrow "
                  f"that pooled exchange instead)")  # fmt: skip
    rep = [r for r in rows if r["hot_rows"] != "off"]
    bad = [r for r in rep if not r["loss_matches_off"]]
    ctrl = [r for r in rows if r["control"]]
    print(f"  replication variants' losses vs off (every step, rel. tol {LOSS_RTOL:g}): {len(rep) - len(bad)} of "
          f"{len(rep)} match" + (":" if bad else ""))  # fmt: skip
    for r in bad:
        c = r.get("control_max_rel_diff_vs_off")
        cs = r.get("control_first_step_over_1e-6")
        print(f"    W={r['world_size']} zipf {r['zipf']:g} {r['variant']}: {r['loss_max_rel_diff_vs_off']:.1e} from step "
              f"{r['loss_first_step_over_1e-6']}; the rounding control (off on the other plan) there: "
              + ("-" if c is None else f"{c:.1e}" + (f" from step {cs}" if cs is not None else "")))  # fmt: skip
    if ctrl:
        drifted = [r for r in ctrl if not r["loss_matches_off"]]
        print(f"  rounding control (no replication, the other plan: float32 sums in another order): {len(drifted)} of "
              f"{len(ctrl)} drift past {LOSS_RTOL:g}" + (": " + ", ".join(
                  f"W={r['world_size']} zipf {r['zipf']:g} {r['loss_max_rel_diff_vs_off']:.1e} from step "
                  f"{r['loss_first_step_over_1e-6']}" for r in drifted) if drifted else ""))  # fmt: skip
    if quick:
        print("  (smoke run: toy sizes, the verdict means nothing)")


# ---- chart ------------------------------------------------------------------------------------------
def write_png(path: str, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = report["measured"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(20, 5.8), gridspec_kw={"width_ratios": [3.2, 2, 2.6]})
    zipf = GOAL["zipf"] if any(math.isclose(r["zipf"], GOAL["zipf"]) for r in rows) else rows[0]["zipf"]
    sel = [r for r in rows if math.isclose(r["zipf"], zipf) and not r["control"]]  # the control: another plan
    tags = ["input_dist", "output_dist", "output_dist_bwd", "dp_grad_allreduce", "dp_grad_sparse", "hot_rows_*"]
    x = np.arange(len(sel))
    bottom = np.zeros(len(sel))
    for ti, tag in enumerate(tags):
        if tag == "hot_rows_*":
            vals = np.array([sum(v for t, v in r["bytes_per_step"].items() if t.startswith("hot_rows")) for r in sel])
        else:
            vals = np.array([r["bytes_per_step"].get(tag, 0.0) for r in sel])
        ax1.bar(x, vals / 1e3, bottom=bottom, color=f"C{ti}", label=tag)
        bottom += vals / 1e3
    ax1.set_xticks(x, [f"W={r['world_size']}\n{r['variant']}" for r in sel], fontsize=7, rotation=60)
    ax1.set_ylabel("KB sent per step per rank (mean over ranks)")
    ax1.set_title(f"measured bytes per step by tag, Zipf {zipf:g}\n(the dense all-reduce, metrics and the rounding "
                  f"control left out)",
                  fontsize=10)  # fmt: skip
    ax1.legend(fontsize=8)
    fixed = next((r["variant"] for r in rows if r["variant"].startswith("K=")), "K")
    for wi, W in enumerate(sorted({r["world_size"] for r in rows})):
        ls = ("-", "--", ":", "-.")[wi % 4]
        for variant, color in (("auto", "C0"), (fixed, "C3")):
            pts = sorted((r["zipf"], r["a2a_ratio"], r["step_ratio"]) for r in rows
                         if r["world_size"] == W and r["variant"] == variant)  # fmt: skip
            if not pts:
                continue
            z = [p[0] for p in pts]
            ax2.plot(z, [p[1] for p in pts], ls=ls, marker="o", color=color, label=f"W={W} {variant}: a2a bytes")
            ax2.plot(z, [p[2] for p in pts], ls=ls, marker="x", ms=8, color=color, alpha=0.45,
                     label=f"W={W} {variant}: step time")  # fmt: skip
    ax2.axhline(GOAL["max_a2a_ratio"], color="k", ls=":", lw=1, label="goal: a2a bytes 0.5x")
    ax2.axhline(1.0, color="grey", lw=0.5)
    ax2.set_xlabel("Zipf exponent")
    ax2.set_ylabel("ratio to off")
    ax2.set_ylim(0, max(1.6, ax2.get_ylim()[1]))
    ax2.set_title("replication vs off (measured)", fontsize=10)
    ax2.legend(fontsize=6)
    sim = report.get("simulated")
    if sim:
        srows = sim["rows_by_network"]
        names = list(dict.fromkeys(r["variant"] for r in srows))
        xs = np.arange(len(names))
        for ni, net in enumerate(("fattree", "opera")):
            comm = [next(r["comm_ms"] for r in srows if r["network"] == net and r["variant"] == n) for n in names]
            it = [next(r["iteration_ms"] for r in srows if r["network"] == net and r["variant"] == n) for n in names]
            ax3.bar(xs + (ni - 0.5) * 0.4, comm, width=0.4, color=f"C{ni}", label=f"{net}: comm in flight")
            ax3.plot(xs + (ni - 0.5) * 0.4, it, "k_" if ni == 0 else "r_", ms=14, label=f"{net}: iteration")
        ax3.set_xticks(xs, names, fontsize=8, rotation=30)
        ax3.set_ylabel("ms per iteration (simulated)")
        ax3.set_title(f"Model-A, {sim['nodes']} nodes x {sim['gpus_per_node']} GPUs, ids exchanged\n"
                      f"fat-tree + ring vs Opera + DPS", fontsize=10)  # fmt: skip
        ax3.legend(fontsize=7)
    else:
        ax3.set_axis_off()
    m = report["machine"]
    fig.suptitle(("SMOKE RUN (--quick, toy sizes) - not a measurement - " if report["quick"] else "")
                 + f"hot-row replication and codecs: {m['cpu']}, {m['cpu_count']} CPUs, load {m['loadavg_1m_at_start']:.2f}"
                 f" at start, {m['loadavg_1m_at_end']:.2f} at end")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- main -------------------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    from neo_train.testing import cpu_model

    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "backends": available_backends(), "threads_per_rank": 1,
            "loadavg_1m_at_start": os.getloadavg()[0]}  # fmt: skip


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    from neo_train.comm import CODECS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="W=2, one Zipf, toy sizes, few steps: a smoke test")
    p.add_argument("--world-sizes", type=_ints, default=None, help="gloo ranks (default 2,4; --quick 2)")
    p.add_argument("--zipf", type=_floats, default=None, help="Zipf exponents (default 0.8,1.05,1.2; --quick 1.05)")
    p.add_argument("--rows", type=int, default=None, help="rows per table (default 100,000; --quick 20,000)")
    p.add_argument("--dim", type=int, default=None, help="D (default 64; --quick 16)")
    p.add_argument("--tables", type=int, default=8, help="tables: the first half one-hot, the rest multi-hot")
    p.add_argument("--pooling", type=float, default=20.0,
                   help="multi-hot tables' pooling factor (1: every table one-hot, a Criteo-like DLRM)")
    p.add_argument("--batch-size", type=int, default=None, help="per-rank batch (default 512; --quick 64)")
    p.add_argument("--sharding", default="table_wise", choices=SHARDINGS)
    p.add_argument("--fixed-k", type=_ints, default=None,
                   help="the fixed-K variants' K, comma list (default 1024; --quick 64; 0: no such variant)")
    p.add_argument("--codecs", default=",".join(DEFAULT_CODECS), help="codec variants (comma list; '' for none)")
    p.add_argument("--window", type=int, default=None, help="hot_rows_window in steps (default 10; --quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="unmeasured steps per variant (default window + 2)")
    p.add_argument("--steps", type=int, default=None, help="measured steps per variant (default 40; --quick 4)")
    p.add_argument("--chunk", type=int, default=None, help="steps per variant's turn (default 5; --quick 2)")
    p.add_argument("--backend", default="auto", help="kernel backend (auto: fbgemm when it imports)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dense-optimizer", default="adam", choices=DENSE_OPTIMIZERS, help="the MLPs' optimizer")
    p.add_argument("--dense-lr", type=float, default=1e-3, help="the MLPs' learning rate")
    p.add_argument("--sparse-optimizer", default="sgd", choices=SPARSE_OPTIMIZERS, help="the tables' fused optimizer")
    p.add_argument("--sparse-lr", type=float, default=0.05, help="the tables' learning rate")
    p.add_argument("--sim-nodes", type=int, default=None, help="simulated nodes (default 128; --quick 16)")
    p.add_argument("--sim-tables", type=int, default=1000, help="Model-A tables in the simulation")
    p.add_argument("--no-control", action="store_true",
                   help="leave out the losses' rounding control (off on the other plan): at large batches it takes most of the run")
    p.add_argument("--no-sim", action="store_true", help="skip part 2")
    p.add_argument("--json", default=None, help="write every number here")
    p.add_argument("--png", default=None, help="write the chart here")
    args = p.parse_args(argv)
    q = args.quick

    def pick(value: Any, full: Any, quick: Any) -> Any:
        return value if value is not None else (quick if q else full)

    args.world_sizes = pick(args.world_sizes, [2, 4], [2])
    args.zipf = pick(args.zipf, [0.8, 1.05, 1.2], [1.05])
    args.rows = pick(args.rows, 100_000, 20_000)
    args.dim = pick(args.dim, 64, 16)
    args.batch_size = pick(args.batch_size, 512, 64)
    args.fixed_k = [k for k in pick(args.fixed_k, [1024], [64]) if k]
    args.window = pick(args.window, 10, 3)
    args.warmup = args.warmup if args.warmup is not None else args.window + 2
    args.steps = pick(args.steps, 40, 4)
    args.chunk = pick(args.chunk, 5, 2)
    args.sim_nodes = pick(args.sim_nodes, 128, 16)
    wanted = [c for c in args.codecs.split(",") if c]
    codecs = [c for c in wanted if c in CODECS and c != "fp32"]
    skipped = [c for c in wanted if c not in codecs]
    for k in args.fixed_k:
        if not 0 < k < args.rows:
            raise SystemExit(f"--fixed-k {k} must be in [0, --rows {args.rows}) (0: no fixed-K variant)")
    if args.warmup < args.window:
        raise SystemExit(f"--warmup {args.warmup} must be >= --window {args.window} (the first hot-set switch)")
    if min(args.world_sizes) < 2:
        raise SystemExit("--world-sizes: hot-row replication needs W >= 2")

    control = "row_wise" if args.sharding != "row_wise" else "table_wise"
    variants = [Variant("off"), Variant("auto", "auto")]
    variants += [Variant(f"K={k}", str(k)) for k in args.fixed_k]
    variants += [Variant(c, "off", c) for c in codecs]
    if not args.no_control:
        variants.append(Variant(f"off@{'RW' if control == 'row_wise' else 'TW'}", sharding=control))
    info = machine_info()
    base = make_config(args.rows, args.dim, args.tables, args.pooling, args.batch_size, args.zipf[0], args.window,
                       args.backend, args.seed, args.dense_optimizer, args.dense_lr, args.sparse_optimizer,
                       args.sparse_lr)  # fmt: skip
    print(f"# {info['cpu']}, {info['cpu_count']} CPUs, torch {info['torch']}, load average "
          f"{info['loadavg_1m_at_start']:.2f}; kernels {base.train.kernel_backend}"
          + ("; SMOKE RUN (--quick): numbers measure nothing" if q else ""), flush=True)  # fmt: skip
    one_hot = [t.name for t in base.model.tables if t.pooling_factor <= 1.0]
    print(f"# model: {args.tables} tables x {args.rows:,} rows, D={args.dim}, one-hot (L=1) {','.join(one_hot)}, "
          f"multi-hot (L={args.pooling:g}) the rest; b={args.batch_size} per rank, {args.sharding}; "
          f"{args.warmup} warm-up + {args.steps} measured steps per variant (turns of {args.chunk}), hot-set window "
          f"{args.window}; variants {', '.join(v.name for v in variants)}"
          + (f"; codecs not in neo_train.comm.CODECS, skipped: {skipped}" if skipped else ""), flush=True)  # fmt: skip

    t_all = time.perf_counter()
    measured: list[dict[str, Any]] = []
    runs_meta: list[dict[str, Any]] = []
    for W in args.world_sizes:
        for alpha in args.zipf:
            cfg = base.replace(data=base.data.replace(zipf_alpha=alpha))
            job = Job(cfg, args.sharding, tuple(variants), args.warmup, args.steps, args.chunk)
            t0 = time.perf_counter()
            work = len(variants) * (args.warmup + args.steps) * W * args.batch_size
            timeout = 120.0 + 2e-4 * work * max(1.0, args.rows / 20_000 * args.dim / 64)
            ranks = run_ranks(rank_job, W, job, threads=1, timeout_s=timeout, collective_timeout_s=300.0)
            res = ranks[0]
            rows = _summarise(res, [rk["timing"] for rk in ranks], cfg, W, alpha)
            measured += rows
            runs_meta.append({"world_size": W, "zipf": alpha, "plan": res["plan"], "build_s": res["build_s"],
                              "seconds": time.perf_counter() - t0, "ids_per_step": res["ids_per_step"]})  # fmt: skip
            auto = next(r for r in rows if r["variant"] == "auto")
            print(f"# W={W} zipf {alpha:g}: {time.perf_counter() - t0:.0f} s; auto a2a {auto['a2a_ratio']:.3f}x off, "
                  f"step {auto['step_ratio']:.2f}x off; load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    measured_s = time.perf_counter() - t_all
    sim = None
    if not args.no_sim:
        print(f"# simulating Model-A at {args.sim_nodes} nodes", flush=True)
        sim = simulate_model_a(args.sim_nodes, args.sim_tables, args.zipf, codecs)
    info["loadavg_1m_at_end"] = os.getloadavg()[0]

    print(f"\n## 1. measured ({measured_s:.0f} s): KB sent per step per rank (mean over ranks), by tag; a2a = "
          f"input_dist + output_dist + output_dist_bwd; dp_sync = the replicas' gradient sync (dp_grad_*: counts + "
          f"sparse all-gather or dense all-reduce), hot_* = hot-set switches; emb/off = (a2a + dp_sync + hot_*) / "
          f"off's; k 1h|mh = rows replicated per one-hot | multi-hot table; hot% = ids served by the replicas; "
          f"allhot1h = one-hot bags all hot; skip% = bags of the replicated tables with no cold id (all hot or empty: on a table-wise plan they skip the pooled exchange); "
          f"pool/off = output_dist + output_dist_bwd vs off's; ms/step = median of the slowest rank's step; loss vs "
          f"off = max relative difference over every step (replication: must be <= {LOSS_RTOL:g}), codecs: relative "
          f"difference of the mean loss over the measured steps")  # fmt: skip
    print_measured(measured, base)
    print(f"\n## where the step goes at Zipf {GOAL['zipf']:g}: ms per measured step, mean over ranks "
          f"(Trainer.step_breakdown; input_dist = starting the next batch's + waiting for this one's; emb_comm_bwd "
          f"includes the replicas' gradient sync (every dp_grad_* collective); dp_grad_* = the "
          f"three collectives' wall time; hot_rows_* = the switches' collectives; ms/step is the "
          f"median of the slowest rank, the phases are means)")  # fmt: skip
    print_breakdown(measured)
    goals = goal_verdicts(measured)
    print_goal(goals, measured, q)
    if sim:
        print(f"\n## 2. simulated: Model-A ({sim['tables']} tables of {sim['rows']:,} x {sim['dim']}, bags of "
              f"{sim['bag']:g}), {sim['nodes']} nodes x {sim['gpus_per_node']} GPUs, b={sim['local_batch']} per GPU, "
              f"ids exchanged; GB on the network per iteration, ms simulated; comm ms = time some communication is "
              f"in flight; ar_top includes the replicas' all-reduce ({sim['wall_s']:.0f} s)")  # fmt: skip
        print_simulated(sim)
        for net in ("fattree", "opera"):
            r = next((x for x in sim["rows_by_network"] if x["network"] == net and x["variant"] == f"auto@{GOAL['zipf']:g}"), None)
            if r is not None:
                print(f"  {net}: auto at Zipf {GOAL['zipf']}: a2a bytes {r['a2a_ratio']:.3f}x off "
                      f"({1 / r['a2a_ratio']:.2f}x fewer: goal {'met' if r['a2a_ratio'] <= GOAL['max_a2a_ratio'] else 'NOT met'}), "
                      f"communication time {r['comm_ratio']:.3f}x, iteration {r['iteration_ratio']:.3f}x")  # fmt: skip
    print(f"# load average {info['loadavg_1m_at_start']:.2f} at start, {info['loadavg_1m_at_end']:.2f} at end; "
          f"total {time.perf_counter() - t_all:.0f} s")  # fmt: skip

    report = {"benchmark": "hot_rows", "quick": q, "machine": info, "argv": sys.argv, "args": vars(args),
              "model": dataclasses.asdict(base.model),
              "one_hot_tables": one_hot, "variants": [asdict(v) for v in variants], "codecs_skipped": skipped,
              "goal": GOAL | {"verdicts": goals}, "measured": measured, "runs": runs_meta, "simulated": sim}  # fmt: skip
    write_outputs(report, args.json, args.png, write_png, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
