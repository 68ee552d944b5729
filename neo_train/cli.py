"""The ``neo-train`` command.

    neo-train train                         # the `small` preset on synthetic data, 2 local ranks
    neo-train train --preset tiny --steps 50 --metrics-out out/metrics.json
    neo-train train --config my.toml --backend reference
    neo-train train --nproc 2                   # 2 local ranks (gloo on CPU, NCCL on GPUs)
    neo-train train --nproc 4 --sharding table_row_wise --local-world-size 2   # 2 faked nodes
    torchrun --nproc-per-node 8 -m neo_train train --plan plan.json
    neo-train config --preset criteo_kaggle --out criteo.toml
    neo-train plan --preset model_a --nodes 16 --gpus-per-node 8 --topology zionex
    neo-train train --nproc 4 --collective-rules "all_to_all_v:opera" --trace-dir traces
    neo-train replay traces --rules "all_to_all_v:pairwise"
    neo-train simulate --nodes 128 --network opera --allreduce dps
    neo-train calibrate --nproc 4 --out calib_w4.json      # this machine's collectives, for:
    neo-train simulate --trace traces --calibration calib_w4.json   # predicted vs measured
    neo-train info                          # versions and kernel backends
"""
from __future__ import annotations

from .config import nonnegative_int, positive_int
import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

__all__ = ["main", "build_parser", "config_from_args"]


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``neo-train train: error: argument --steps: ...``), exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")



def _hot_rows_arg(text: str) -> str:
    if text in ("off", "auto") or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"must be 'off', 'auto' or a row count >= 1, got {text!r}")

def build_parser() -> argparse.ArgumentParser:
    from .config import CACHE_POLICIES, COMM_DTYPES, PRESETS, SHARDING_TYPES, TABLE_DTYPES

    p = _Parser(prog="neo-train", description="Neo-style DLRM training.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a DLRM and report loss, AUC and throughput")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--preset", default="small", choices=PRESETS, help="named config (default: small)")
    src.add_argument("--config", type=Path, help="TOML config file (see `neo-train config`)")
    t.add_argument("--row-scale", type=float, default=1.0, help="multiply every table's rows (preset only)")
    t.add_argument("--steps", type=int, help="training steps")
    t.add_argument("--batch-size", type=int, help="per-rank batch size")
    t.add_argument("--seed", type=int, help="seed of initialisation and synthetic data")
    t.add_argument("--backend", help="embedding kernel backend: auto, reference, fbgemm, triton")
    t.add_argument("--data", choices=("synthetic", "criteo"), help="data source")
    t.add_argument("--data-path", help="Criteo TSV (train)")
    t.add_argument("--eval-path", help="Criteo TSV (held out)")
    t.add_argument("--epochs", type=int, help="Criteo: passes over --data-path; the run stops at the end of the last (0: as many as --steps needs)")
    t.add_argument("--holdout-every", type=int, help="Criteo without --eval-path: hold every K-th global batch out for evaluation (0: none)")
    t.add_argument("--max-loss", type=float, help="stop when a step's loss exceeds this: diverged (default 50; 0: no bound)")
    t.add_argument("--eval-every", type=int, help="evaluate every N steps (0: only at the end)")
    t.add_argument("--eval-batches", type=int, help="batches per evaluation")
    t.add_argument("--log-dir", default=None, help="TensorBoard directory (default runs/<config>-<time>; 'none' disables)")
    t.add_argument("--metrics-out", type=Path, help="write per-step losses, eval metrics and throughput as JSON")
    t.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--nproc", type=positive_int, help="local ranks to start via torchrun (default: 2 on CPU, one per GPU; 1 = this process)")
    t.add_argument("--sharding", choices=SHARDING_TYPES, help="sharding type of every table (multi-rank)")
    t.add_argument("--plan", type=Path, help="ShardingPlan JSON (multi-rank); overrides --sharding")
    t.add_argument("--local-world-size", type=positive_int, help="ranks per node for the plan (default: LOCAL_WORLD_SIZE); fakes nodes on one host")
    t.add_argument("--comm-dtype-fwd", choices=COMM_DTYPES, help="wire format of pooled embeddings")
    t.add_argument("--comm-dtype-bwd", choices=COMM_DTYPES, help="wire format of their gradients")
    t.add_argument("--hot-rows", type=_hot_rows_arg, metavar="off|auto|K",
                   help="hot-row replication: replicate each eligible table's K (or cost-model-chosen) hottest rows on every rank")  # fmt: skip
    t.add_argument("--hot-rows-window", type=positive_int, help="steps per profiling window of --hot-rows (default 100)")
    t.add_argument("--timeout", type=float, help="collective timeout, seconds")
    t.add_argument("--no-pipeline", action="store_true", help="plain loop: no loader thread, no early input dist")
    t.add_argument("--check-inputs", action=argparse.BooleanOptionalAction, default=None,
                   help="check bag lengths, id ranges and labels of every batch on the host (default: on; cost shown as check_inputs)")
    t.add_argument("--checkpoint-dir", help="checkpoint root (shared by all ranks); resumes from its newest checkpoint")
    t.add_argument("--checkpoint-every", type=int, help="save every S steps (and at the end)")
    t.add_argument("--no-resume", action="store_true", help="ignore existing checkpoints under --checkpoint-dir")
    t.add_argument("--collective-rules", help="schedule algorithms per collective/size, e.g. 'all_to_all_v:opera, all_reduce:ring'")
    t.add_argument("--hosts-per-rack", type=int, help="ranks per rack for the opera algorithm")
    t.add_argument("--trace-dir", help="record every collective (param comms-trace JSON) here")
    t.add_argument("--cache-load-factor", type=float, help="fraction of each table shard's rows kept in the device cache, the rest in the backing store (default 1: all resident)")
    t.add_argument("--cache-policy", choices=CACHE_POLICIES, help="which cached row a miss evicts (default lru)")
    t.add_argument("--storage-dir", help="backing store of cached tables on disk (the SSD tier; default: host memory)")
    t.add_argument("--table-dtype", choices=TABLE_DTYPES, help="embedding weight precision (optimizer state stays fp32)")
    t.add_argument("--stochastic-rounding", action="store_true", default=None, help="round fp16/bf16 weight updates stochastically (triton)")
    t.add_argument("--verbose", action="store_true", help="full tracebacks (default: one line per failing rank)")
    t.add_argument("--max-restarts", type=nonnegative_int, default=0, help="elastic restarts after a rank fails (with --nproc; resumes from the newest checkpoint)")

    c = sub.add_parser("config", help="print or write a preset as TOML")
    c.add_argument("--preset", default="small", choices=PRESETS)
    c.add_argument("--row-scale", type=float, default=1.0)
    c.add_argument("--out", type=Path, help="write here instead of printing")

    from .planning.plan_cli import add_plan_arguments

    add_plan_arguments(sub.add_parser("plan", help="plan a model's sharding for a cluster (cost model + placement)"))
    from .topology.study import add_simulate_arguments

    add_simulate_arguments(sub.add_parser(
        "simulate", help="simulate a training iteration (or a recorded trace) on fat-tree / Opera / flat networks"))
    _add_replay_arguments(sub.add_parser("replay", help="replay recorded collective traces on real ranks, any algorithm"))
    from .topology.calibrate import add_calibrate_arguments

    add_calibrate_arguments(sub.add_parser(
        "calibrate", help="measure this machine's collectives (latency, bandwidth) for neo-train simulate --calibration"))
    sub.add_parser("info", help="versions and available kernel backends")
    return p


def _add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``neo-train replay`` (``comm.replay.replay_command``), here so that building
    the parser imports no torch (``neo_train.comm`` does)."""
    from .config import positive_float

    parser.add_argument("traces", nargs="+", help="per-rank trace files in rank order, or one directory of trace_rank{r}.json")
    parser.add_argument("--rules", default="", help="collective rules, e.g. 'all_to_all_v<=64KB:bruck,all_to_all_v:pairwise,all_reduce:ring' (default: native)")
    parser.add_argument("--local-world-size", type=positive_int, default=None, help="ranks per node for 'hierarchical' (default: LOCAL_WORLD_SIZE)")
    parser.add_argument("--hosts-per-rack", type=positive_int, default=None, help="ranks per rack for 'opera' (default: the node size)")
    parser.add_argument("--bulk-threshold", default="15MB", help="opera: blocks at least this large wait for their direct circuit (0: all)")
    parser.add_argument("--iters", type=positive_int, default=3, help="passes over the trace; each entry reports its median")
    parser.add_argument("--per-op", action="store_true", help="print every collective, not only the per-phase totals")
    parser.add_argument("--json", default="", help="write every rank's report here")
    parser.add_argument("--timeout-s", type=positive_float, default=120.0, help="timeout of every collective")


def config_from_args(args: argparse.Namespace):
    """The run's Config: the preset or file, then command-line overrides (validated again)."""
    from .config import Config, preset

    cfg = Config.load(args.config) if args.config else preset(args.preset, row_scale=args.row_scale)
    def given(**fields):  # the flags the user gave (argparse leaves the others None)
        return {k: v for k, v in fields.items() if v is not None}

    train = given(
        steps=args.steps, batch_size=args.batch_size, seed=args.seed, kernel_backend=args.backend,
        eval_every=args.eval_every, max_loss=args.max_loss, eval_batches=args.eval_batches,
        pipeline=False if args.no_pipeline else None, check_inputs=args.check_inputs,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        resume=False if args.no_resume else None,
    )
    data = given(source=args.data, path=args.data_path, eval_path=args.eval_path, epochs=args.epochs,
                 holdout_every=args.holdout_every)
    dist = given(
        sharding=args.sharding, plan_path=str(args.plan) if args.plan else None,
        forward_comm_dtype=args.comm_dtype_fwd, backward_comm_dtype=args.comm_dtype_bwd, timeout_s=args.timeout,
        collective_rules=args.collective_rules, hosts_per_rack=args.hosts_per_rack, trace_dir=args.trace_dir,
        hot_rows=args.hot_rows, hot_rows_window=args.hot_rows_window,
    )
    storage = given(
        cache_load_factor=args.cache_load_factor, cache_policy=args.cache_policy, storage_dir=args.storage_dir,
        table_dtype=args.table_dtype, stochastic_rounding=args.stochastic_rounding,
    )
    return cfg.replace(
        train=cfg.train.replace(**train), data=cfg.data.replace(**data), dist=cfg.dist.replace(**dist),
        storage=cfg.storage.replace(**storage),
    )


def _launch_local(nproc: int, argv: Sequence[str], max_restarts: int = 0) -> int:
    """Re-run this command under torchrun with ``nproc`` local ranks (standalone rendezvous)."""
    from torch.distributed.run import main as torchrun

    rest, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        rest.append(a)
    print(f"neo-train: starting {nproc} local ranks with torchrun", flush=True)
    # each rank sets its intra-op threads itself (intra_op_threads); this only keeps torchrun
    # from warning that it chose 1 for them
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from .comm.spawn import rank_environment

    rank_environment()  # THP_MEM_ALLOC_ENABLE for the ranks' host tensors (comm/spawn.py)
    verbose = "--verbose" in argv
    if not verbose:  # the ranks say what went wrong, one line each; torchrun's dump is noise
        import logging

        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        torchrun(["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts), "-m", "neo_train", *rest])
    except Exception as e:  # torchrun raises ChildFailedError naming the failed ranks
        failures = getattr(e, "failures", None)
        if failures and not verbose:
            codes = ", ".join(f"rank {r}: exit code {f.exitcode}" for r, f in sorted(failures.items()))
            print(f"neo-train: error: the job failed ({codes}); the ranks' errors are above (--verbose for tracebacks)",
                  file=sys.stderr)
        else:
            print(f"neo-train: error: {e}", file=sys.stderr)
        return 1
    return 0


def _plan_for(cfg, comm, local_world_size: int, device: str):
    """The job's plan: the plan file, one type for every table, or (auto) the planner's, made on
    rank 0 and broadcast so every rank runs the identical plan."""
    from .sharding import ShardingPlan

    W = comm.world_size
    if cfg.dist.plan_path:
        plan = ShardingPlan.from_json(cfg.dist.plan_path)
    elif cfg.dist.sharding != "auto":
        plan = ShardingPlan.uniform(cfg.model, cfg.dist.sharding, W, local_world_size)
    else:
        text = ""
        if comm.rank == 0:
            try:
                text = _auto_plan(cfg, W, local_world_size, device).to_json()
            except ValueError as e:  # no plan fits: every rank says so, not only rank 0
                text = _PLAN_ERROR + str(e)
        text = _broadcast_text(comm, text)
        if text.startswith(_PLAN_ERROR):
            raise ValueError(text[len(_PLAN_ERROR):])
        plan = ShardingPlan.from_json(text)
    plan.validate(cfg.model, W, local_world_size)
    return plan


_PLAN_ERROR = "error: "


def _auto_plan(cfg, world_size: int, local_world_size: int, device: str, quiet: bool = False):
    from .planning.planner import PlannerOptions, plan_sharding
    from .topology.networks import job_cluster

    cluster = job_cluster(cfg.dist.topology, world_size, local_world_size, device)
    opts = PlannerOptions(
        batch_size=cfg.train.batch_size, optimizer=cfg.train.sparse_optimizer, dense_optimizer=cfg.train.dense_optimizer,
        fwd_comm_dtype=cfg.dist.forward_comm_dtype, bwd_comm_dtype=cfg.dist.backward_comm_dtype,
        # the fbgemm kernels need column shards in multiples of 4
        min_col_width=4,
        zipf_alpha=cfg.data.zipf_alpha, ssd=bool(cfg.storage.storage_dir),
    )
    result = plan_sharding(cfg.model, cluster, opts)
    if quiet:
        return result.plan
    print(f"neo-train: planned with the cost model for {cluster.describe()}: {result.counts}, "
          f"estimated imbalance {result.estimate.imbalance:.3f}", flush=True)
    return result.plan


def _broadcast_text(comm, text: str) -> str:
    """Rank 0's string on every rank (through the comm layer)."""
    import torch

    dev = getattr(comm, "device", "cpu")
    data = torch.tensor(list(text.encode()), dtype=torch.uint8, device=dev)
    n = torch.tensor([data.numel()], device=dev)
    sizes = [int(v) for v in comm.all_gather_v(n, [1] * comm.world_size, tag="plan_broadcast")]
    everything = comm.all_gather_v(data, sizes, tag="plan_broadcast").cpu()
    return bytes(everything[: sizes[0]].tolist()).decode()


def _train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import os

    import torch

    from .kernels import backend_report
    from .modules.storage import cached_tables, table_dtype
    from .train import Trainer

    cfg = config_from_args(args)  # validate before starting any rank
    in_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    nproc = args.nproc if args.nproc is not None else (torch.cuda.device_count() or 2)
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    if not in_torchrun:  # errors found before launch: once, here, not once per rank
        preflight(cfg, args, nproc)
    if nproc > 1 and not in_torchrun:
        return _launch_local(nproc, argv, args.max_restarts)
    threads, why = intra_op_threads(int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if in_torchrun else 1)
    torch.set_num_threads(threads)
    comm = plan = None
    rank, world = 0, 1
    if in_torchrun and int(os.environ["WORLD_SIZE"]) > 1:
        from .comm import init_distributed

        if torch.cuda.is_available() and (args.device or "cuda").startswith("cuda"):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        comm = wrap_communicator(init_distributed(timeout_s=cfg.dist.timeout_s), cfg,
                                 args.local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or None)
        rank, world = comm.rank, comm.world_size
    device = args.device or (f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
    if comm is not None:
        L = args.local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", world))
        plan = _plan_for(cfg, comm, L, "cpu" if device == "cpu" else "cuda")
    log_dir = args.log_dir
    if log_dir is None:
        log_dir = f"runs/{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    elif log_dir.lower() == "none":
        log_dir = None
    trainer = Trainer(cfg, device=device, log_dir=log_dir, progress=not args.no_progress and sys.stderr.isatty(),
                      comm=comm, plan=plan)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"neo-train: {cfg.name} | {len(cfg.model.tables)} tables, "
        f"{cfg.model.num_embedding_params / 1e6:.2f}M embedding params | {world} rank(s), device {device} | "
        f"kernel backend {trainer.backend} ({backend_report(device, table_dtype(cfg.storage))})", flush=True)
    say(f"neo-train: {threads} intra-op thread(s) per rank ({why}; NEO_TRAIN_THREADS overrides)", flush=True)
    if plan is not None:
        say(plan.describe() if len(plan.tables) <= 40 else f"plan: {len(plan.tables)} tables over {world} ranks")
        hot = trainer.hot.k if trainer.hot is not None else {}
        if hot:
            say(f"neo-train: hot-row replication ({cfg.dist.hot_rows}): "
                + ", ".join(f"{t} k={k}" for t, k in list(hot.items())[:12]) + (", ..." if len(hot) > 12 else "")
                + f"; re-profiled every {cfg.dist.hot_rows_window} steps", flush=True)
        elif cfg.dist.hot_rows != "off":
            say(f"neo-train: note: --hot-rows {cfg.dist.hot_rows} replicates no table here (eligible: table-wise, "
                "row-wise or table-row-wise, sum pooling, resident, more rows than k; auto: only where the "
                "expected all-to-all saving exceeds the replicas' sync; `neo-train plan --hot-rows` shows why)",
                flush=True)
        uncached = _data_parallel_uncached(cfg, plan)
        if uncached:
            say(f"neo-train: note: {len(uncached)} table(s) with a cache load factor below 1 are data-parallel "
                f"and so not cached (replicas are never cached): {', '.join(uncached[:8])}"
                f"{', ...' if len(uncached) > 8 else ''}", flush=True)
    cache_only = [f for f, given in (("--cache-policy", args.cache_policy is not None),
                                     ("--storage-dir", bool(cfg.storage.storage_dir))) if given]  # fmt: skip
    if cache_only and not cached_tables(cfg.model, cfg.storage, plan):
        say(f"neo-train: note: {' / '.join(cache_only)} {'have' if len(cache_only) > 1 else 'has'} no effect: no "
            "table is cached (every row resident); --cache-load-factor F < 1 caches a fraction F of each "
            "table's rows", flush=True)
    try:
        result = trainer.run()
    except Exception:
        # no run loses what it did: the summary and metrics of the steps trained so far
        say(trainer.result.summary())
        if args.metrics_out and rank == 0:
            trainer.result.to_json(args.metrics_out)
            say(f"metrics (of the failed run) written to {args.metrics_out}")
        raise
    say(result.summary())
    if result.step_ms and world > 1:
        say("step time (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in result.step_ms.items()))
    if args.metrics_out and rank == 0:
        result.to_json(args.metrics_out)
        say(f"metrics written to {args.metrics_out}")
    if log_dir:
        say(f"TensorBoard logs in {log_dir} (tensorboard --logdir {log_dir})")
    if comm is not None:
        import torch.distributed as dist

        if cfg.dist.trace_dir:
            path = comm.dump(cfg.dist.trace_dir)  # every rank writes its own trace_rank<r>.json
            say(f"collective traces written to {path.parent} (replay: neo-train replay {cfg.dist.trace_dir})")
        dist.destroy_process_group()
    return 0


def _check_caches_fit(cfg, plan, nproc: int, local_world_size: int | None = None) -> None:
    """A cached table shard whose cache cannot hold the unique rows the job's first global batch
    sends it: said here, once (each rank would fail at step 0). Synthetic data only (a Criteo
    file's first batch is not read here), and not with hot-row replication (the hot ids never
    reach the shards); a later batch that does not fit still fails at run time, naming the
    table the same way."""
    import torch

    from .config import cache_factor
    from .kernels.cache import too_small_message
    from .modules.storage import cache_rows, cached_tables
    from .train.trainer import make_data

    if cfg.data.source != "synthetic" or cfg.dist.hot_rows != "off" or not cached_tables(cfg.model, cfg.storage, plan):
        return
    if plan is None and nproc > 1:  # one sharding type for every table, as rank 0 will make it
        from .sharding import ShardingPlan

        plan = ShardingPlan.uniform(cfg.model, cfg.dist.sharding, nproc, local_world_size or nproc)
    cached = cached_tables(cfg.model, cfg.storage, plan)
    ids: dict[str, list] = {}
    for r in range(nproc):  # every rank's batch of step 0: the global batch the shards serve
        parts = next(make_data(cfg, "train", r, nproc)).sparse.by_feature()
        for t in cfg.model.tables:
            if t.name in cached:
                ids.setdefault(t.name, []).extend(parts[f][0] for f in t.feature_names)
    for t in cfg.model.tables:
        if t.name not in cached:
            continue
        tp = plan[t.name] if plan is not None else None
        factor = cache_factor(t, cfg.storage, tp.cache_load_factor if tp is not None else None)
        got = torch.cat(ids[t.name]).to(torch.int64)
        shards = tp.shards if tp is not None else [None]
        for s in shards:
            lo, hi = (0, t.num_rows) if s is None else (s.row_start, s.row_end)
            needed = int(torch.unique(got[(got >= lo) & (got < hi)]).numel())
            slots = cache_rows(hi - lo, factor)
            if needed > slots:
                where = "" if s is None else f" (rank {s.rank}'s shard, rows [{lo}, {hi}))"
                raise ValueError(too_small_message(f"table '{t.name}'{where}", needed, hi - lo, slots,
                                                   "the first global batch"))


def _data_parallel_uncached(cfg, plan) -> list[str]:
    """Tables whose cache load factor asks for a cache that their data-parallel plan rules out
    (``storage.cached_tables`` leaves them out)."""
    from .config import cache_factor

    return [t.name for t in cfg.model.tables if plan[t.name].sharding == "data_parallel"
            and cache_factor(t, cfg.storage, plan[t.name].cache_load_factor) < 1]


def intra_op_threads(local_ranks: int) -> tuple[int, str]:
    """Intra-op threads for each of ``local_ranks`` processes on this host, and why: the CPUs
    this process may use, shared by the local ranks, less what other work already keeps busy
    (the 1-minute load average): OpenMP threads that outnumber free cores spin and thrash
    (a single process on a loaded 2-core machine ran 14-40x slower with 2 threads)."""
    if os.environ.get("NEO_TRAIN_THREADS"):
        n = int(os.environ["NEO_TRAIN_THREADS"])
        if n < 1:
            raise ValueError(f"NEO_TRAIN_THREADS must be >= 1, got {n}")
        return n, "NEO_TRAIN_THREADS"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    free = max(1, round(cpus - load))
    n = max(1, min(cpus, free) // max(1, local_ranks))
    return n, f"{cpus} CPUs, {local_ranks} local rank(s), load {load:.1f}"


def preflight(cfg, args: argparse.Namespace, nproc: int) -> None:
    """What can be checked before any rank starts, raising ValueError (one line, exit code 2):
    the plan file (exists, fits the model and this world size), the kernel backend (known and
    available on this host),
    --local-world-size against --nproc, data files, and the output paths."""
    from pathlib import Path

    from .kernels.registry import available_backends, backend_unavailable_reason, dtype_refusal, registered_backends

    if cfg.train.kernel_backend not in ("auto", *registered_backends()):
        raise ValueError(f"train.kernel_backend: unknown backend {cfg.train.kernel_backend!r} "
                         f"(known: auto, {', '.join(registered_backends())})")
    backend = cfg.train.kernel_backend
    if backend != "auto":
        from .modules.storage import table_dtype

        unavailable = backend_unavailable_reason(backend)
        if unavailable:
            raise ValueError(f"embedding backend {backend!r} is not available here: {unavailable} (available: "
                             f"{', '.join(available_backends())})")
        dtype = table_dtype(cfg.storage)
        refusal = dtype_refusal(backend, dtype)
        if refusal:
            can = [n for n in available_backends() if not dtype_refusal(n, dtype)]
            raise ValueError(f"--table-dtype {cfg.storage.table_dtype}: kernel backend '{backend}' {refusal} "
                             f"(backends here that store it: {', '.join(can) or 'none'}; --backend auto picks one)")
    L = args.local_world_size or nproc
    if nproc % L:
        raise ValueError(f"--local-world-size {L} does not divide --nproc {nproc}")
    if args.device is not None:
        import torch

        try:
            dev = torch.device(args.device)
        except RuntimeError:
            raise ValueError(f"--device {args.device!r} is not a device (cpu, cuda, cuda:N)") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
                raise ValueError(f"--device {args.device}: no CUDA device here ({why}); use --device cpu")
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise ValueError(f"--device {args.device}: this host has {torch.cuda.device_count()} CUDA device(s)")
    plan = None  # the job's plan, as rank 0 will make it (None: one rank, unsharded)
    if cfg.dist.plan_path and nproc > 1:
        from .sharding import ShardingPlan

        if not Path(cfg.dist.plan_path).is_file():
            raise ValueError(f"plan file {cfg.dist.plan_path} does not exist")
        try:
            plan = ShardingPlan.from_json(cfg.dist.plan_path)
            plan.validate(cfg.model, nproc, L)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"plan file {cfg.dist.plan_path}: {str(e).splitlines()[0] if str(e) else repr(e)}") from None
    if nproc > 1 and not cfg.dist.plan_path and cfg.dist.sharding == "auto":
        import torch

        # the planner runs again on rank 0; here it says, once, when no plan fits
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            plan = _auto_plan(cfg, nproc, L, torch.device(device).type, quiet=True)
        except ValueError as e:
            raise ValueError("--sharding auto: " + "; ".join(str(e).splitlines())) from None
    _check_caches_fit(cfg, plan, nproc, L)
    if cfg.data.source != "criteo" and (cfg.data.path or cfg.data.eval_path):
        raise ValueError(f"--data-path / --eval-path apply to --data criteo; this run's data is {cfg.data.source}")
    given_criteo_only = [f for f, v in (("--epochs", args.epochs), ("--holdout-every", args.holdout_every)) if v is not None]
    if cfg.data.source != "criteo" and given_criteo_only:
        verb = "apply" if len(given_criteo_only) > 1 else "applies"
        raise ValueError(f"{' / '.join(given_criteo_only)} {verb} to --data criteo (passes over and hold-out of "
                         f"--data-path); this run's data is {cfg.data.source}: --steps sets its length")
    if cfg.data.source == "criteo":
        from .data.criteo import check_criteo_model, count_global_batches

        for what, path in (("--data-path", cfg.data.path), ("--eval-path", cfg.data.eval_path)):
            if path and Path(path).is_dir():
                raise ValueError(f"{what} {path} is a directory, not a Criteo TSV file")
            if path and not Path(path).is_file():
                raise ValueError(f"{what} {path}: no such file")
        check_criteo_model(cfg.model)
        gb = cfg.train.batch_size * nproc
        k = 0 if cfg.data.eval_path else cfg.data.holdout_every
        if count_global_batches(cfg.data.path, gb, k) < 1:
            held = f", every {k}th of them held out for evaluation" if k else ""
            raise ValueError(f"--data-path {cfg.data.path} holds less than one global batch of {gb} lines "
                             f"({nproc} rank(s) x batch size {cfg.train.batch_size}{held})")

    def writable_dir(what: str, path: str) -> None:
        d = Path(path)
        if d.exists() and not d.is_dir():
            raise ValueError(f"{what} {path} is a file, not a directory")
        probe = d
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            raise ValueError(f"{what} {path} lies under {probe}, which is a file, not a directory")
        if not os.access(probe, os.W_OK):
            raise ValueError(f"{what} {path} is not writable")

    if args.log_dir is not None and args.log_dir.lower() != "none":
        writable_dir("--log-dir", args.log_dir)
    if cfg.train.checkpoint_dir:
        writable_dir("--checkpoint-dir", cfg.train.checkpoint_dir)
        if cfg.train.resume:  # a damaged or foreign checkpoint: said here, once, not by every rank
            from .train.checkpoint import check_resumable

            check_resumable(cfg.train.checkpoint_dir, cfg)
    if cfg.dist.trace_dir:
        writable_dir("--trace-dir", cfg.dist.trace_dir)
    if cfg.storage.storage_dir:
        writable_dir("--storage-dir", cfg.storage.storage_dir)
    if cfg.storage.stochastic_rounding and cfg.train.kernel_backend not in ("auto", "triton"):
        raise ValueError(f"--stochastic-rounding: kernel backend '{cfg.train.kernel_backend}' rounds to nearest only "
                         "(triton rounds stochastically)")
    if args.metrics_out:
        if Path(args.metrics_out).is_dir():
            raise ValueError(f"--metrics-out {args.metrics_out} is a directory; give a file path")
        writable_dir("--metrics-out's directory", str(Path(args.metrics_out).parent))


def wrap_communicator(comm, cfg, local_world_size: int | None):
    """The job's communicator: native, behind schedule rules (if any), behind a tracer (if any)."""
    if cfg.dist.collective_rules:
        from .comm import ScheduleCommunicator
        from .comm.schedules.registry import TopologyHint

        hint = TopologyHint(
            local_world_size=local_world_size,
            hosts_per_rack=cfg.dist.hosts_per_rack or local_world_size,
            bulk_threshold_bytes=cfg.dist.opera_bulk_threshold_bytes,
        )
        comm = ScheduleCommunicator(comm, cfg.dist.collective_rules, hint=hint)
    if cfg.dist.trace_dir:
        from .comm import TracingCommunicator

        comm = TracingCommunicator(comm)
    return comm


def _calibrate_rank(comm, sizes: list[int], iters: int, busy_s: float, overlap_s: float | dict[str, float] | None,
                    tiled: bool | None = None):
    from .topology.calibrate import measure_collectives

    return measure_collectives(comm, sizes=sizes, iters=iters, busy_s=busy_s, overlap_s=overlap_s, tiled=tiled)


def _calibrate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``neo-train calibrate``: --nproc local ranks started with torchrun as ``train`` does (gloo on
    CPUs, NCCL on GPUs: the transport the run will use), or the ranks of an enclosing torchrun;
    rank 0 fits the model and writes --out."""
    import torch

    from .topology.calibrate import DEFAULT_SIZES, fit_calibration, parse_overlaps, parse_sizes

    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory; give a file path")
    if not out.parent.exists():
        raise ValueError(f"--out {out}: directory {out.parent} does not exist")
    sizes = parse_sizes(args.sizes) if args.sizes else list(DEFAULT_SIZES)
    if args.overlap_ms is not None and not args.busy_ms:
        raise ValueError("--overlap-ms applies to a busy calibration: give --busy-ms too")
    overlap_s = None if args.overlap_ms is None else parse_overlaps(args.overlap_ms)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        nproc = args.nproc if args.nproc is not None else (torch.cuda.device_count() or 2)
        if nproc < 2:
            raise ValueError("--nproc: calibrate needs 2 or more ranks")
        return _launch_local(nproc, argv)
    import torch.distributed as dist

    from .comm import init_distributed

    torch.set_num_threads(intra_op_threads(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))[0])
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    load, t0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"), time.perf_counter()
    comm = init_distributed(timeout_s=args.timeout)
    if comm is None or comm.world_size < 2:
        raise ValueError("neo-train calibrate needs 2 or more ranks")
    tiled = {"auto": None, "first": False, "tiled": True}[args.groups]
    samples = _calibrate_rank(comm, sizes, args.iters, args.busy_ms / 1e3, overlap_s, tiled)
    if comm.rank == 0:
        from .comm.probe import cpu_model

        meta = {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_before": load, "seconds": time.perf_counter() - t0,
                "iters": args.iters, "busy_s": args.busy_ms / 1e3, "overlap_s": overlap_s, "groups": args.groups,
                "compute_share": samples[0].get("compute_share"),
                "date": time.strftime("%Y-%m-%d %H:%M:%S")}
        cal = fit_calibration(samples, world_size=comm.world_size, transport=comm.backend, device=comm.device.type,
                              meta=meta)
        cal.save(out)
        print(cal.table())
        print(f"calibration written to {out} (neo-train simulate --trace DIR --calibration {out})")
    dist.destroy_process_group()
    return 0


def _config(args: argparse.Namespace) -> int:
    from .config import preset

    text = preset(args.preset, row_scale=args.row_scale).dumps()
    if args.out:
        if args.out.is_dir():
            raise ValueError(f"--out {args.out} is a directory; give a file path")
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def _info(args: argparse.Namespace) -> int:
    import torch

    from . import __version__
    from .kernels import backend_report

    print(f"neo_train {__version__}, torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")
    print(backend_report())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # usage errors (code 2) and --help (0) return like every other error
        return int(e.code or 0)

    def replay(a: argparse.Namespace) -> int:
        from .comm.replay import replay_command

        return replay_command(a)

    def plan(a: argparse.Namespace) -> int:
        from .planning.plan_cli import plan_command

        return plan_command(a)

    def simulate(a: argparse.Namespace) -> int:
        from .topology.study import simulate_command

        return simulate_command(a)

    # each command imports what it runs: config, plan and simulate never import torch
    handlers = {"train": lambda a: _train(a, argv), "config": _config, "info": _info, "plan": plan,
                "replay": replay, "simulate": simulate, "calibrate": lambda a: _calibrate(a, argv)}
    try:
        return handlers[args.command](args)
    except Exception as e:  # noqa: BLE001 - what is ours is said in one line, the rest raised
        checkpoint_error = _loaded("neo_train.train.checkpoint.files", "CheckpointError")
        said = (ValueError, OSError, FloatingPointError) + checkpoint_error
        collective_error = _loaded("neo_train.comm.interface", "CollectiveError")
        if getattr(args, "verbose", False) or not isinstance(e, said + collective_error):
            raise
        if not isinstance(e, said):  # a peer died or hung: one line naming this rank and the collective
            print(f"neo-train: error: {str(e).splitlines()[0]}", file=sys.stderr)
            return 1
        if isinstance(e, ValueError):  # ours: written to be read whole (a planner's report may take lines)
            text = str(e)
        else:
            text = str(e) if isinstance(e, (FileNotFoundError,) + checkpoint_error) else f"{type(e).__name__}: {e}"
            text = (text.splitlines() or [""])[0]
        print(f"neo-train: error: {text}", file=sys.stderr)
        return 2


def _loaded(module: str, name: str) -> tuple[type, ...]:
    """(the class ``name`` of ``module``,) where the command imported that module, else (): an
    error of a module that was never imported cannot have been raised, so the check imports
    nothing (``neo_train.comm`` and ``neo_train.train`` import torch)."""
    mod = sys.modules.get(module)
    return (getattr(mod, name),) if mod is not None else ()


if __name__ == "__main__":
    sys.exit(main())
