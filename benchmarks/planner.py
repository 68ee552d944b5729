"""The sharding planner: full-scale planning time, and its cost model against real runs.

    python benchmarks/planner.py                         # (a) and (b)
    python benchmarks/planner.py --quick --json out.json --plot out.png
    python benchmarks/planner.py --part b --tables 100 --batch-size 128 --steps 10

(a) Planning at full scale, nothing allocated: Model-A (1000 tables, 793B parameters) on the
    `zionex` topology at 16 x 8 = 128 and 128 x 8 = 1024 GPUs. Prints planning time, the plan's
    estimated step time by phase, imbalance (max/mean embedding time over ranks), memory, fits.

(b) Validation against reality on this CPU: a Model-A-shaped model (the preset's tables scaled by
    --row-scale, the first --tables of them; MLPs shrunk to (64, 32)/(64,) so the dense part
    does not drown the embeddings) trained on 4 gloo ranks (topology `cpu_local` with 4 ranks on
    one node) under three plans:
        neo        this planner
        round-robin  table i whole on rank i % 4
        torchrec   TorchRec's EmbeddingShardingPlanner for the same tables and topology, its
                   plan converted to ours (TW/RW/CW/DP/TWRW/TWCW map one to one; any other type
                   is reported as not convertible)
    Each plan runs --warmup + --steps steps of neo_train's Trainer; per rank we record the step
    wall time and the timer's phases. Reported side by side: estimated vs measured step time
    (the slowest rank), and how well the cost model rank-orders ranks: Spearman's rho between
    estimated and measured per-rank times of
        lookup     the forward kernel (purely local work)
        compute    lookup + backward_other (the fused update, plus the dense backward that every
                   rank shares, so ranks differ by their embedding work)
    Spearman's rho = Pearson correlation of the ranks (ties get their mean rank), by hand with numpy.
    The 2-core machine runs 4 single-thread ranks, so measured times carry scheduling noise.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from neo_train.config import Config, DataConfig, preset
from neo_train.planning.cost_model import CostEstimate, estimate
from neo_train.planning.plan import Shard, ShardingPlan, ShardingType, TablePlan
from neo_train.planning.planner import PlannerOptions, plan_sharding, round_robin_plan
from neo_train.topology import preset_cluster

__all__ = ["main", "spearman", "torchrec_plan", "convert_torchrec_plan"]


# ---- (a) full-scale planning -------------------------------------------------------------------

def part_a(nodes_list: list[int], table_dtype: str) -> list[dict[str, Any]]:
    model = preset("model_a").model
    rows = []
    for nodes in nodes_list:
        cluster = preset_cluster("zionex", nodes=nodes)
        res = plan_sharding(model, cluster, PlannerOptions(batch_size=512, table_dtype=table_dtype), strict=False)
        est = res.estimate
        rows.append({
            "gpus": cluster.world_size, "nodes": nodes, "table_dtype": table_dtype,
            "planning_s": res.seconds, "fits": res.fits, "imbalance": est.imbalance,
            "step_ms": 1e3 * est.critical_path, "samples_per_s": cluster.world_size * 512 / est.critical_path,
            "breakdown_ms": {k: 1e3 * v for k, v in est.breakdown().items()},
            "memory_max_gb": float(est.memory.max()) / 1e9, "memory_cap_gb": est.capacity / 1e9,
            "sharding": res.counts,
        })
        r = rows[-1]
        bd = r["breakdown_ms"]
        print(f"  {r['gpus']:>5} GPUs  planned in {r['planning_s']:6.2f} s  fits={'yes' if r['fits'] else 'NO'}  "
              f"imbalance {r['imbalance']:.3f}  step {r['step_ms']:.1f} ms = a2a {bd['all_to_all']:.1f} + "
              f"all-reduce {bd['all_reduce']:.1f} + lookup/update {bd['lookup']:.1f} + dense {bd['dense_compute']:.1f}  "
              f"mem max {r['memory_max_gb']:.1f}/{r['memory_cap_gb']:.1f} GB  {r['sharding']}", flush=True)
    return rows


# ---- TorchRec's plan --------------------------------------------------------------------------

def torchrec_plan(cfg: Config, world_size: int, local_world_size: int, memory_bytes: int):
    """TorchRec's EmbeddingShardingPlanner for cfg's tables on a CPU topology (nothing allocated)."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    tables = cfg.model.tables
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(num_embeddings=t.num_rows, embedding_dim=t.dim, name=t.name, feature_names=list(t.feature_names),
                           pooling=PoolingType.SUM if t.pooling == "sum" else PoolingType.MEAN)
        for t in tables], device=torch.device("meta"))
    topo = Topology(world_size=world_size, local_world_size=local_world_size, compute_device="cpu",
                    hbm_cap=memory_bytes, ddr_cap=memory_bytes)
    cons = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor] * len(t.feature_names)) for t in tables}
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=cfg.train.batch_size, constraints=cons, debug=False)
    return planner.plan(ebc, [EmbeddingBagCollectionSharder()])


def convert_torchrec_plan(tr_plan, cfg: Config, world_size: int, local_world_size: int) -> tuple[ShardingPlan, list[str]]:
    """TorchRec's plan as ours; notes list what could not be converted (those tables fall back to TW)."""
    mapping = {st.value: st for st in ShardingType}
    params = next(iter(tr_plan.plan.values()))
    notes, tps = [], []
    for i, t in enumerate(cfg.model.tables):
        ps = params[t.name]
        st = mapping.get(ps.sharding_type)
        if st is None:
            notes.append(f"table '{t.name}': TorchRec chose {ps.sharding_type}, which neo_train has no type for; placed TW")
            tps.append(ShardingPlan.table_plan("table_wise", t.name, t.num_rows, t.dim, world_size, local_world_size, i))
            continue
        if st == ShardingType.DATA_PARALLEL or ps.sharding_spec is None:
            shards = [Shard(r, 0, t.num_rows, 0, t.dim) for r in range(world_size)]
        else:
            shards = []
            for s in ps.sharding_spec.shards:
                (r0, c0), (nr, nc) = s.shard_offsets, s.shard_sizes
                if nr > 0 and nc > 0:  # TorchRec's row blocks can leave a rank an empty shard
                    shards.append(Shard(s.placement.rank(), r0, r0 + nr, c0, c0 + nc))
        tps.append(TablePlan(t.name, st, tuple(shards)))
    plan = ShardingPlan(world_size, local_world_size, tuple(tps))
    plan.validate(cfg.model, world_size, local_world_size)
    return plan, notes


# ---- (b) measured runs --------------------------------------------------------------------------

def _measure(comm, cfg: Config, plan_json: str, warmup: int, steps: int) -> dict[str, Any]:
    """On each rank: train warmup + steps steps; per-step wall times and the timer's phases."""
    import torch

    from neo_train.train import Trainer
    from neo_train.train.trainer import make_data

    plan = ShardingPlan.from_json(plan_json)
    trainer = Trainer(cfg, comm=comm, plan=plan, progress=False)
    data = make_data(cfg, "train", comm.rank, comm.world_size)
    for s in range(warmup):
        trainer.train_step(next(data), s)
    trainer.timer.reset()
    walls = []
    for s in range(steps):
        batch = next(data)
        comm.barrier()  # every rank starts the step together
        t = time.perf_counter()
        trainer.train_step(batch, warmup + s)
        walls.append(time.perf_counter() - t)
    return {"walls": walls, "phases_ms": trainer.step_breakdown(steps), "backend": trainer.backend,
            "threads": torch.get_num_threads()}


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson correlation of the ranks (ties share their mean rank)."""
    def ranks(a: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.float64)
        order = np.argsort(a, kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=np.float64)
        for v in np.unique(a):  # mean rank for ties
            m = a == v
            r[m] = r[m].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(np.sqrt((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / den) if den > 0 else float("nan")


@dataclass
class PlanRun:
    name: str
    sharding: dict[str, int]
    est_step_ms: float
    est_imbalance: float
    est_rank_ms: dict[str, list[float]]
    measured_step_ms: float = float("nan")
    measured_rank_ms: dict[str, list[float]] = field(default_factory=dict)
    rho_lookup: float = float("nan")
    rho_compute: float = float("nan")
    notes: list[str] = field(default_factory=list)


def _bench_config(args) -> Config:
    cfg = preset("model_a", row_scale=args.row_scale)
    tables = cfg.model.tables[: args.tables]
    model = cfg.model.replace(tables=tables, bottom_mlp=(64, 32), top_mlp=(64,))
    train = cfg.train.replace(batch_size=args.batch_size, kernel_backend=args.backend, eval_batches=1)
    return cfg.replace(model=model, train=train, data=DataConfig(id_mode="strict"), name="model_a_cpu")


def part_b(args) -> tuple[list[PlanRun], dict[str, Any]]:
    from neo_train.testing import run_ranks

    W = 4
    cfg = _bench_config(args)
    cluster = preset_cluster("cpu_local", devices_per_node=W)
    b = cfg.train.batch_size
    m = cfg.model
    print(f"  model: {len(m.tables)} Model-A tables x row_scale {args.row_scale:g} = {m.num_embedding_params / 1e6:.1f}M "
          f"parameters, b={b} per rank, {W} gloo ranks, cluster {cluster.describe()}", flush=True)
    opts = PlannerOptions(batch_size=b, optimizer=cfg.train.sparse_optimizer, dense_optimizer=cfg.train.dense_optimizer)
    plans: dict[str, tuple[ShardingPlan, list[str]]] = {}
    t = time.perf_counter()
    plans["neo"] = (plan_sharding(m, cluster, opts).plan, [])
    t_neo = time.perf_counter() - t
    plans["round-robin"] = (round_robin_plan(m, W, W), [])
    t = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import logging

            logging.getLogger("torchrec").setLevel(logging.ERROR)
            logging.getLogger().setLevel(logging.ERROR)
            tr = torchrec_plan(cfg, W, W, int(cluster.device_memory_bytes))
        plans["torchrec"] = convert_torchrec_plan(tr, cfg, W, W)
    except Exception as e:  # noqa: BLE001 - the baseline is optional; say why it is missing
        print(f"  torchrec planner failed: {e!r}")
    t_tr = time.perf_counter() - t
    print(f"  planning: neo {t_neo:.2f} s, torchrec {t_tr:.2f} s", flush=True)
    runs = []
    for name, (plan, notes) in plans.items():
        est: CostEstimate = estimate(m, plan, cluster, b, optimizer=opts.optimizer, dense_optimizer=opts.dense_optimizer)
        counts: dict[str, int] = {}
        for tp in plan.tables:
            counts[tp.sharding.value] = counts.get(tp.sharding.value, 0) + 1
        run = PlanRun(name, counts, 1e3 * est.critical_path, est.imbalance, {
            "lookup": (1e3 * est.phases["lookup"]).tolist(),
            "compute": (1e3 * (est.phases["lookup"] + est.phases["fused_update"])).tolist(),
            "total": (1e3 * est.total).tolist(),
        }, notes=notes)
        t = time.perf_counter()
        res = run_ranks(_measure, W, cfg, plan.to_json(), args.warmup, args.steps, threads=1, timeout_s=1800)
        walls = np.array([r["walls"] for r in res])  # (W, steps)
        run.measured_step_ms = 1e3 * float(np.median(walls.max(axis=0)))
        ph = [r["phases_ms"] for r in res]
        run.measured_rank_ms = {
            "lookup": [p["lookup"] for p in ph],
            "compute": [p["lookup"] + p["backward_other"] for p in ph],
            "step": (1e3 * np.median(walls, axis=1)).tolist(),
            **{k: [p[k] for p in ph] for k in ph[0]},
        }
        run.rho_lookup = spearman(np.array(run.est_rank_ms["lookup"]), np.array(run.measured_rank_ms["lookup"]))
        run.rho_compute = spearman(np.array(run.est_rank_ms["compute"]), np.array(run.measured_rank_ms["compute"]))
        runs.append(run)
        print(f"  {name:<12} measured in {time.perf_counter() - t:5.1f} s ({res[0]['backend']} kernels)", flush=True)
    est_all = np.concatenate([r.est_rank_ms["compute"] for r in runs])
    meas_all = np.concatenate([r.measured_rank_ms["compute"] for r in runs])
    pooled = {
        "rho_compute_all_ranks_all_plans": spearman(est_all, meas_all),
        "rho_lookup_all_ranks_all_plans": spearman(np.concatenate([r.est_rank_ms["lookup"] for r in runs]),
                                                   np.concatenate([r.measured_rank_ms["lookup"] for r in runs])),
        "rho_step_across_plans": spearman(np.array([r.est_step_ms for r in runs]), np.array([r.measured_step_ms for r in runs])),
        "neo_planning_s": t_neo, "torchrec_planning_s": t_tr,
    }
    return runs, pooled


def print_b(runs: list[PlanRun], pooled: dict[str, Any]) -> None:
    print(f"\n  {'plan':<12} {'types':<34} {'est step ms':>11} {'meas step ms':>12} {'est imb':>7} "
          f"{'meas imb':>8} {'rho lookup':>10} {'rho compute':>11}")
    for r in runs:
        types = ", ".join(f"{n} {k}" for k, n in sorted(r.sharding.items(), key=lambda kv: -kv[1]))
        comp = np.array(r.measured_rank_ms["compute"])
        print(f"  {r.name:<12} {types:<34} {r.est_step_ms:11.1f} {r.measured_step_ms:12.1f} {r.est_imbalance:7.3f} "
              f"{comp.max() / comp.mean():8.3f} {r.rho_lookup:10.2f} {r.rho_compute:11.2f}")
    print("\n  per rank (ms): estimated lookup+update | measured lookup+backward_other | measured lookup")
    for r in runs:
        e, mc, ml = r.est_rank_ms["compute"], r.measured_rank_ms["compute"], r.measured_rank_ms["lookup"]
        cells = "  ".join(f"r{k}: {e[k]:7.1f} | {mc[k]:7.1f} | {ml[k]:6.1f}" for k in range(len(e)))
        print(f"  {r.name:<12} {cells}")
    for r in runs:
        for n in r.notes:
            print(f"  note ({r.name}): {n}")
    print(f"\n  Spearman over all plans' ranks: compute {pooled['rho_compute_all_ranks_all_plans']:.2f}, lookup "
          f"{pooled['rho_lookup_all_ranks_all_plans']:.2f}; step time across plans {pooled['rho_step_across_plans']:.2f}")


def plot(path: str, a_rows: list[dict], runs: list[PlanRun]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (1 if a_rows else 0) + (2 if runs else 0)
    fig, axes = plt.subplots(1, max(panels, 1), figsize=(6 * max(panels, 1), 4.5), squeeze=False)
    axes = list(axes[0])
    if a_rows:
        ax = axes.pop(0)
        keys = ["all_to_all", "all_reduce", "lookup", "dense_compute"]
        x = np.arange(len(a_rows))
        bottom = np.zeros(len(a_rows))
        for k in keys:
            v = np.array([r["breakdown_ms"][k] for r in a_rows])
            ax.bar(x, v, bottom=bottom, label=k)
            bottom += v
        ax.set_xticks(x, [f"{r['gpus']} GPUs\nplanned in {r['planning_s']:.1f} s" for r in a_rows])
        ax.set_ylabel("estimated step (ms)")
        ax.set_title("Model-A on zionex: estimated step by phase")
        ax.legend(fontsize=8)
    if runs:
        ax = axes.pop(0)
        for r in runs:
            ax.scatter(r.est_rank_ms["compute"], r.measured_rank_ms["compute"], label=f"{r.name} (rho {r.rho_compute:.2f})")
        ax.set_xlabel("estimated lookup + update per rank (ms)")
        ax.set_ylabel("measured lookup + backward_other per rank (ms)")
        ax.set_title("per rank: cost model vs 4 gloo ranks (CPU)")
        ax.legend(fontsize=8)
        ax = axes.pop(0)
        x = np.arange(len(runs))
        ax.bar(x - 0.2, [r.est_step_ms for r in runs], 0.4, label="estimated")
        ax.bar(x + 0.2, [r.measured_step_ms for r in runs], 0.4, label="measured")
        ax.set_xticks(x, [r.name for r in runs])
        ax.set_ylabel("step (ms, slowest rank)")
        ax.set_title("step time per plan")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=("a", "b", "both"), default="both")
    p.add_argument("--quick", action="store_true", help="smoke test: 128 GPUs only; 16 tables, b=32, 2 steps")
    p.add_argument("--nodes", type=int, nargs="+", default=[16, 128], help="(a) zionex node counts")
    p.add_argument("--table-dtype", choices=("fp32", "fp16"), default="fp32", help="(a) embedding precision")
    p.add_argument("--tables", type=int, default=100, help="(b) first N Model-A tables")
    p.add_argument("--row-scale", type=float, default=2e-4, help="(b) Model-A rows x this")
    p.add_argument("--batch-size", type=int, default=128, help="(b) per-rank batch")
    p.add_argument("--steps", type=int, default=10, help="(b) timed steps per plan")
    p.add_argument("--warmup", type=int, default=2, help="(b) untimed steps first")
    p.add_argument("--backend", default="auto", help="(b) embedding kernel backend")
    p.add_argument("--json", help="write results here")
    p.add_argument("--plot", help="write a PNG here")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.tables, args.batch_size, args.steps, args.warmup = [16], 16, 32, 2, 1
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    a_rows: list[dict] = []
    runs: list[PlanRun] = []
    pooled: dict[str, Any] = {}
    if args.part in ("a", "both"):
        print(f"(a) planning Model-A at full scale (zionex, {args.table_dtype} tables)")
        a_rows = part_a(args.nodes, args.table_dtype)
    if args.part in ("b", "both"):
        print("(b) cost model vs measured step times on 4 gloo ranks")
        runs, pooled = part_b(args)
        print_b(runs, pooled)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                                   "load": os.getloadavg()[0]},
                       "args": vars(args), "a": a_rows, "b": [asdict(r) for r in runs], "b_pooled": pooled}, f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot(args.plot, a_rows, runs)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
