"""``neo-train plan``: plan a model's sharding for a cluster, print what it costs, write the plan.

    neo-train plan --preset model_a --nodes 16 --gpus-per-node 8 --topology zionex
    neo-train plan --preset model_f --table-dtype fp16 --out plan.json
    neo-train plan --config my.toml --topology cpu_local --gpus-per-node 4 --batch-size 256

The CLI wires ``add_plan_arguments`` into a subparser and calls ``plan_command``; the exit status
is 0 when the plan fits in memory, 1 when it does not (the report says why and what would fit).
"""
from __future__ import annotations

from ..config import positive_int
import argparse
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .plan_report import format_result

if TYPE_CHECKING:
    from .planner import PlanResult

__all__ = ["add_plan_arguments", "plan_command", "result_summary"]


def format_tables(result: "PlanResult", model, max_tables: int = 10) -> str:
    """The ``max_tables`` largest tables (by parameters) and how they were sharded."""
    order = sorted(model.tables, key=lambda t: (-t.num_params, t.name))[:max_tables]
    if not order:
        return ""
    out = [f"largest {len(order)} of {len(model.tables)} tables"]
    for t in order:
        tp = result.plan[t.name]
        ranks = sorted({s.rank for s in tp.shards})
        where = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(tp.shards)} shards on ranks {ranks[0]}..{ranks[-1]}"
        cache = "" if tp.cache_load_factor is None else f"  cached {tp.cache_load_factor:g}"
        out.append(f"  {t.name:<10} {t.num_rows:>14,} x {t.dim:<4} L={t.pooling_factor:<6g} {tp.sharding.value:<18} {where}{cache}")
    return "\n".join(out)


def format_cache(result: "PlanResult", model) -> str:
    """One line on the cached tables (empty when every table is resident): how many, their load
    factors, the expected hit rates and where their full rows live."""
    from .cost_model import cache_hit_rate, shard_memory_bytes

    o = result.options
    cached = [(t, result.plan[t.name].cache_load_factor) for t in model.tables
              if result.plan[t.name].cache_load_factor is not None]
    if not cached:
        return ""
    e = o.context(result.cluster).elem_bytes
    hits = [float(cache_hit_rate(f, t.num_rows, o.zipf_alpha if t.zipf_alpha is None else t.zipf_alpha))
            for t, f in cached]
    store = sum(float(shard_memory_bytes(t.num_rows, t.dim, e, o.optimizer)) for t, _ in cached)
    factors = sorted({f for _, f in cached})
    tier = "SSD" if o.ssd else f"host memory ({result.cluster.nodes} x {result.cluster.host_memory_bytes / 1e12:.2f} TB)"
    return (f"cache       {len(cached)} table(s) cached at load factor {', '.join(f'{f:g}' for f in factors)}: "
            f"expected hit rate {min(hits):.3f}-{max(hits):.3f} (zipf {o.zipf_alpha:g}, LFU); their rows and "
            f"state ({store / 1e12:.2f} TB) in {tier}; misses priced at "
            f"{o.context(result.cluster).miss_bandwidth / 1e9:.3g} GB/s per device in 'lookup'")


def result_summary(result: "PlanResult") -> dict:
    """The summary as plain data (for --summary-json and benchmarks)."""
    est, c, o = result.estimate, result.cluster, result.options
    step = est.critical_path
    return {
        "cluster": c.to_dict(),
        "world_size": c.world_size,
        "batch_size": o.batch_size,
        "table_dtype": o.table_dtype,
        "optimizer": o.optimizer,
        "planning_seconds": result.seconds,
        "fits": result.fits,
        "explanation": result.explanation,
        "sharding_counts": result.counts,
        "cache_load_factors": {tp.table: tp.cache_load_factor for tp in result.plan.tables
                               if tp.cache_load_factor is not None},
        "step_seconds": step,
        "samples_per_second": c.world_size * o.batch_size / step if step > 0 else 0.0,
        "breakdown_seconds": est.breakdown(),
        "imbalance": est.imbalance,
        "memory_imbalance": est.memory_imbalance,
        "memory_max_bytes": float(est.memory.max()),
        "memory_mean_bytes": float(est.memory.mean()),
        "memory_capacity_bytes": est.capacity,
        "estimate": est.to_dict(),
    }


def memory_fraction(text: str) -> float:
    """argparse type: a finite number in (0, 1] (a share of device memory)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None
    if not (math.isfinite(v) and 0 < v <= 1):
        raise argparse.ArgumentTypeError(f"must be a finite number in (0, 1], got {text}")
    return v


def _check_out_file(flag: str, path: Path) -> None:
    """A file path ``flag`` can write: not a directory, in an existing, writable directory
    (checked before planning, which may take minutes)."""
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory; give a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {path} is not writable")
    parent = path.parent
    if not parent.exists():
        raise ValueError(f"{flag} {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is not a directory")
    if not path.exists() and not os.access(parent, os.W_OK):
        raise ValueError(f"{flag} {path}: directory {parent} is not writable")


def add_plan_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``plan`` subcommand's arguments."""
    from ..config import PRESETS
    from ..topology.spec import CLUSTER_PRESETS

    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", default="model_a", choices=PRESETS, help="named model (default: model_a)")
    src.add_argument("--config", type=Path, help="TOML config file (its model and train.batch_size)")
    p.add_argument("--row-scale", type=float, default=1.0, help="multiply every table's rows (preset only)")
    p.add_argument("--topology", default="zionex", help=f"cluster preset ({', '.join(CLUSTER_PRESETS)}) or a TOML file")
    p.add_argument("--nodes", type=positive_int, help="number of nodes (default: the topology's)")
    p.add_argument("--gpus-per-node", type=positive_int, help="devices per node (default: the topology's)")
    p.add_argument("--table-dtype", choices=("fp32", "fp16"), default="fp32", help="embedding weight precision")
    p.add_argument("--batch-size", type=positive_int, help="per-rank batch size (default: the config's)")
    p.add_argument("--optimizer", help="sparse optimizer (default: the config's)")
    p.add_argument("--memory-fraction", type=memory_fraction, default=0.95,
                   help="usable share of device memory, in (0, 1] (default 0.95)")
    p.add_argument("--no-cache", action="store_true",
                   help="never cache tables (default: when they do not fit resident, cache the large ones)")
    p.add_argument("--ssd", action="store_true", help="cached tables live on the SSD tier (host memory does not bound them)")
    p.add_argument("--hot-rows", metavar="off|auto|K", help="show what hot-row replication would replicate and save "
                   "under the plan (default: the config's dist.hot_rows)")  # fmt: skip
    p.add_argument("--out", type=Path, help="write the plan JSON here (only when it fits)")
    p.add_argument("--summary-json", type=Path, help="write the summary and per-rank estimate as JSON")
    p.add_argument("--max-tables-shown", type=int, default=10, help="largest tables listed with their sharding")
    p.add_argument("--max-ranks-shown", type=int, default=10, help="ranks listed (the slowest) when there are more")
    return p


def format_hot_rows(cfg, plan, cluster, setting: str, max_tables: int = 10) -> str:
    """What ``--hot-rows`` would replicate under this plan on ``cluster`` (choose_hot_rows): per
    table k, the lookups the rows take, the bytes per step and device saved / added and what
    they are worth in time there; empty when off."""
    from .hot_rows import choose_hot_rows

    if str(setting) == "off":
        return ""
    got = sorted(choose_hot_rows(cfg, plan, cluster.world_size, setting, cluster).values(), key=lambda c: -c.net_s)
    if not got:
        return (f"hot rows    {setting}: no table gains on {cluster.name} (none eligible, or no k saves more step "
                f"time than its gradient sync, the replicas' work and the hot-set switches cost)")  # fmt: skip
    saved, added = sum(c.saved_bytes for c in got), sum(c.added_bytes for c in got)
    ids, rows = sum(c.saved_input_bytes for c in got), sum(c.saved_output_bytes for c in got)
    mem = sum(c.memory_bytes for c in got)
    n_sparse = sum(c.sync == "sparse" for c in got)
    lines = [f"hot rows    {setting}: {len(got)} table(s); per step and device {saved / 1e6:.3g} MB of ids and pooled "
             f"rows kept local ({ids / 1e6:.3g} MB of ids, {rows / 1e6:.3g} MB of pooled rows of all-hot bags), "
             f"{added / 1e6:.3g} MB of replica gradient sync ({n_sparse} table(s) cheaper by the sparse all-gather of "
             f"touched rows, {len(got) - n_sparse} by the dense all-reduce; net {(saved - added) / 1e6:+.3g} MB); "
             f"replicas {mem / 1e6:.3g} MB per device",
             f"            on {cluster.name}: {sum(c.saved_s for c in got) * 1e3:.3g} ms of all-to-all saved per step, "
             f"{sum(c.sync_s for c in got) * 1e3:.3g} ms of sync, {sum(c.work_s for c in got) * 1e3:.3g} ms of replica "
             f"work, {sum(c.switch_s for c in got) * 1e3:.3g} ms of switches (window {cfg.dist.hot_rows_window}): "
             f"net {sum(c.net_s for c in got) * 1e3:+.3g} ms"]  # fmt: skip
    for c in got[:max_tables]:
        lines.append(f"  {c.table:<24} k {c.k:>8,}  coverage {c.coverage:6.1%}  saved {c.saved_bytes / 1e3:10,.1f} KB"
                     f"  sync {c.added_bytes / 1e3:10,.1f} KB ({c.sync}, {c.touched_rows:,.0f} rows touched)"
                     f"  net {c.net_s * 1e3:+.3f} ms")  # fmt: skip
    if len(got) > max_tables:
        lines.append(f"  ... {len(got) - max_tables} more")
    return "\n".join(lines)


def plan_command(args: argparse.Namespace) -> int:
    """Run the planner from parsed ``add_plan_arguments`` args; 0 if the plan fits, 1 if not."""
    from ..config import Config, preset
    from ..topology.spec import cluster_spec
    from .planner import PlannerOptions, plan_sharding

    for flag, path in (("--out", args.out), ("--summary-json", getattr(args, "summary_json", None))):
        if path:
            _check_out_file(flag, Path(path))
    cfg = Config.load(args.config) if getattr(args, "config", None) else preset(args.preset, row_scale=args.row_scale)
    topo = args.topology
    cluster = cluster_spec(topo)
    over = {k: v for k, v in (("nodes", args.nodes), ("devices_per_node", args.gpus_per_node)) if v is not None}
    if over:
        cluster = cluster.replace(**over)
    opts = PlannerOptions(
        batch_size=args.batch_size or cfg.train.batch_size,
        table_dtype=args.table_dtype,
        optimizer=args.optimizer or cfg.train.sparse_optimizer,
        dense_optimizer=cfg.train.dense_optimizer,
        fwd_comm_dtype=cfg.dist.forward_comm_dtype,
        bwd_comm_dtype=cfg.dist.backward_comm_dtype,
        memory_fraction=args.memory_fraction,
        auto_cache=not args.no_cache,
        zipf_alpha=cfg.data.zipf_alpha,
        ssd=args.ssd or bool(cfg.storage.storage_dir),
    )
    m = cfg.model
    n = m.num_embedding_params
    size = f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.2f}M"
    print(f"planning {cfg.name}: {len(m.tables)} tables, {size} embedding parameters "
          f"for {cluster.world_size} devices ({cluster.nodes} x {cluster.devices_per_node}, {cluster.name})", flush=True)
    result = plan_sharding(m, cluster, opts, strict=False)
    print(format_tables(result, m, args.max_tables_shown))
    print()
    print(format_result(result, args.max_ranks_shown))
    cache = format_cache(result, m)
    if cache:
        print(cache)
    hot_setting = getattr(args, "hot_rows", None) or cfg.dist.hot_rows
    hot = format_hot_rows(cfg.replace(train=cfg.train.replace(batch_size=opts.batch_size)), result.plan,
                          cluster, hot_setting, args.max_tables_shown)  # fmt: skip
    if hot:
        print(hot)
    if args.summary_json:
        args.summary_json.write_text(json.dumps(result_summary(result), indent=1))
        print(f"summary written to {args.summary_json}")
    if args.out:
        if result.fits:
            result.plan.to_json(str(args.out))
            print(f"plan written to {args.out}")
        else:
            print(f"plan not written to {args.out}: it does not fit")
    return 0 if result.fits else 1
