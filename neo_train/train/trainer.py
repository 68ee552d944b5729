"""The single-process trainer: BCE loss, dense optimizer + fused sparse optimizer, evaluation.

    result = Trainer(preset("small"), log_dir="runs/x").run()
    print(result.eval["auc"], result.samples_per_s)

One step: logits = model(dense, sparse); loss = BCE-with-logits(logits, labels) averaged over
the batch; loss.backward() updates the embedding rows inside the backward (fused optimizer);
then the dense optimizer steps. A non-finite loss stops the run with an error naming the step.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from ..comm import Communicator
from ..comm.timing import TimingCommunicator
from ..config import Config, TrainConfig
from ..data.batch import Batch
from ..data.synthetic import SyntheticData
from ..kernels import SparseOptimizerSpec
from ..modules import DLRM, EmbeddingBagCollection
from ..planning.plan import ShardingPlan
from .cpu_malloc import tune_cpu_malloc
from .hot_rows import HotRowSchedule, hot_row_counts
from .metrics import binary_metrics
from .pipeline import EndOfData, TrainPipeline
from .timing import PhaseTimer

__all__ = ["Trainer", "TrainResult", "build_model", "make_dense_optimizer", "make_data", "sparse_optimizer_spec"]


@dataclass
class TrainResult:
    """What a run produced; ``to_json`` is the ``--metrics-out`` file."""

    config: str
    backend: str
    world_size: int
    batch_size: int
    steps: int
    losses: list[float] = field(default_factory=list)
    eval: dict[str, float] = field(default_factory=dict)
    eval_history: list[dict[str, Any]] = field(default_factory=list)
    train_seconds: float = 0.0
    samples_per_s: float = 0.0
    step_ms: dict[str, float] = field(default_factory=dict)
    cache: dict[str, float] = field(default_factory=dict)  # cached tables: per-step means over the run, all ranks
    cache_history: list[dict[str, float]] = field(default_factory=list)  # per logging interval, rank 0
    # bytes this rank (rank 0 writes the file) sent per training step, by collective tag; the
    # evaluations' collectives are left out
    comm_bytes_per_step: dict[str, float] = field(default_factory=dict)
    error: str = ""  # set when the run failed: what it trained is still recorded above
    notes: list[str] = field(default_factory=list)  # e.g. the data ended before train.steps

    def to_json(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=1))

    def summary(self) -> str:
        e = self.eval
        return (
            f"[{self.config}] steps={self.steps} global_batch={self.batch_size * self.world_size} "
            f"backend={self.backend} final_loss={self.losses[-1] if self.losses else float('nan'):.4f} "
            f"eval_auc={e.get('auc', float('nan')):.4f} eval_ne={e.get('ne', float('nan')):.4f} "
            f"eval_logloss={e.get('log_loss', float('nan')):.4f} samples/s={self.samples_per_s:,.0f}"
        ) + (
            f" cache_hit_rate={self.cache['hit_rate']:.3f} ({self.cache['tier']})" if self.cache else ""
        ) + (f" FAILED after {len(self.losses)} step(s): {self.error}" if self.error else "") + "".join(
            f" ({n})" for n in self.notes if n.startswith("the training data ended"))


def sparse_optimizer_spec(t: TrainConfig) -> SparseOptimizerSpec:
    return SparseOptimizerSpec(kind=t.sparse_optimizer, lr=t.sparse_lr, eps=t.eps, weight_decay=t.weight_decay)


def build_model(cfg: Config, device: torch.device | str = "cpu", backend: str | None = None) -> DLRM:
    """The unsharded DLRM; dense parameters drawn from ``cfg.train.seed``, tables from init_table."""
    torch.manual_seed(cfg.train.seed)
    ebc = EmbeddingBagCollection(
        cfg.model.tables,
        sparse_optimizer_spec(cfg.train),
        backend=backend or cfg.train.kernel_backend,
        device=device,
        seed=cfg.train.seed,
        id_mode=cfg.data.id_mode,
        storage=cfg.storage,
    )
    return DLRM(cfg.model, ebc, ebc.feature_dims).to(device)


def make_dense_optimizer(t: TrainConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The MLPs' optimizer. On CPU torch's fused kernels (one C++ loop over every parameter; the
    same update rule): the default per-tensor Python loop cost 167 us a step on the ``small``
    preset's MLPs, the fused one 56 us (2-vCPU Intel VM)."""
    params = list(params)
    fused = {"fused": True} if params and all(p.device.type == "cpu" and p.is_floating_point() for p in params) else {}
    if t.dense_optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.dense_lr, weight_decay=t.weight_decay, **fused)
    if t.dense_optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=t.dense_lr, eps=t.eps, weight_decay=t.weight_decay, **fused)
    return torch.optim.Adam(params, lr=t.dense_lr, eps=t.eps, weight_decay=t.weight_decay, **fused)


def make_data(
    cfg: Config, stream: str, rank: int = 0, world_size: int = 1, start_step: int = 0
) -> Iterator[Batch] | None:
    """Rank ``rank``'s batches of the train or eval stream, starting at global step ``start_step``;
    None for a Criteo eval stream when there is no held-out data (no ``eval_path``, no hold-out)."""
    b = cfg.train.batch_size
    if cfg.data.source == "synthetic":
        seed = cfg.train.seed
        return SyntheticData(cfg.model, cfg.data, b, seed=seed, rank=rank, world_size=world_size, stream=stream).iterate(start_step)
    from ..data.criteo import CriteoReader

    d = cfg.data
    if stream == "train":
        return iter(CriteoReader(d.path, cfg.model, b, rank, world_size, start_batch=start_step,
                                 epochs=d.epochs, holdout_every=0 if d.eval_path else d.holdout_every))
    if d.eval_path:
        return iter(CriteoReader(d.eval_path, cfg.model, b, rank, world_size, start_batch=start_step))
    if d.holdout_every:
        return iter(CriteoReader(d.path, cfg.model, b, rank, world_size, start_batch=start_step,
                                 holdout_every=d.holdout_every, split="eval"))
    return None


class Trainer:
    """Trains ``cfg`` in this process; ``train_data``/``eval_data`` override the config's source."""

    def __init__(
        self,
        cfg: Config,
        *,
        device: torch.device | str = "cpu",
        log_dir: str | Path | None = None,
        progress: bool = True,
        train_data: Iterable[Batch] | None = None,
        eval_data: Iterable[Batch] | None = None,
        comm: "Communicator | None" = None,
        plan: "ShardingPlan | None" = None,
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        if self.device.type == "cpu":  # a step's large host tensors reuse their pages (cpu_malloc.py)
            tune_cpu_malloc()
        self.timer = PhaseTimer(cuda=self.device.type == "cuda")
        if comm is not None:
            comm = TimingCommunicator(comm, self.timer)
        self.comm = comm
        self.hot: HotRowSchedule | None = None  # hot-row replication's profile-and-switch (dist.hot_rows)
        self.rank = comm.rank if comm is not None else 0
        self.world_size = comm.world_size if comm is not None else 1
        if comm is not None:
            from ..parallel import DistributedModelParallel

            if plan is None:
                raise ValueError("a multi-rank Trainer needs a sharding plan")
            hot = hot_row_counts(cfg, plan, self.device.type)
            self.model: torch.nn.Module = DistributedModelParallel(cfg, plan, comm, device=self.device, timer=self.timer,
                                                                   hot_rows=hot)  # fmt: skip
            self.hot = HotRowSchedule(self.model.embeddings, cfg.dist.hot_rows_window) if hot else None
        else:
            self.model = build_model(cfg, self.device)
        # inputs are checked on the host, before the device copy (check_batch), not in the forward
        self.model.embeddings.validate_in_forward = False
        self.optimizer = make_dense_optimizer(cfg.train, self.model.dense_parameters())
        self._own_train_data = train_data is None
        self.train_data = (
            iter(train_data) if train_data is not None else make_data(cfg, "train", self.rank, self.world_size)
        )
        self._eval_data = eval_data
        self.progress = progress and self.rank == 0
        self.writer = None
        self._eval_bytes: dict[str, int] = {}  # bytes sent by evaluations, by tag
        self._start_step = 0  # the step this run started (resumed) at
        self._log_dir = log_dir if self.rank == 0 else None

    @property
    def backend(self) -> str:
        return self.model.embeddings.backend_name

    def global_means(self, values: "list[float] | torch.Tensor") -> list[float]:
        """Per-step means over ranks of per-rank scalars (the global-batch losses), in one
        all-reduce for the whole list: the loss exchange is batched, not one sync per step."""
        t = torch.as_tensor(values, dtype=torch.float64)
        if self.comm is None or t.numel() == 0:
            return t.tolist()
        t = t.to(getattr(self.comm, "device", "cpu"))
        return self.comm.all_reduce(t, op="avg", tag="metrics").tolist()

    def gather_state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """{"dense": {name: tensor}, "tables": {table: {"weight": (R, D), <optimizer state>}}}."""
        if self.comm is not None:
            return self.model.gather_state_dict()
        ebc = self.model.embeddings
        return {
            "dense": {n: p.detach().clone() for n, p in self.model.named_parameters() if not n.startswith("embeddings.")},
            "tables": {t.name: {"weight": ebc.table(t.name), **ebc.table_state(t.name)} for t in ebc.tables},
        }

    def check_batch(self, batch: Batch, step: int | None = None) -> Batch:
        """The host-side input checks (feature names always; with ``train.check_inputs`` also an
        empty batch, non-finite dense values / labels / weights, labels outside [0, 1], bag
        lengths and id ranges; the modulo id mapping), before the batch goes to the device, so
        on a GPU they cost no device sync. Raises ValueError naming the field, rank and step.
        Sharded training (several ranks) also needs every batch to hold ``train.batch_size``
        samples: the embeddings' exchanges size every rank's share from one batch size, and a
        rank with another would break the collective (gloo aborts the process)."""
        check = self.cfg.train.check_inputs
        at = "" if step is None else f" (the batch of step {step})"
        b = self.cfg.train.batch_size
        if self.world_size > 1 and batch.batch_size != b:
            raise ValueError(
                f"the batch{self._where()}{at} has {batch.batch_size} samples, train.batch_size is {b}: sharded "
                f"training needs every rank's batches to hold train.batch_size samples (drop a short last batch: "
                f"CriteoDataset(drop_last=True), the default)"
            )
        try:
            sparse = self.model.embeddings.validate(batch.sparse, check=check)  # its errors name the rank
        except ValueError as e:
            raise ValueError(f"{e}{at}") from None
        if check:
            try:
                _check_values(batch)
            except ValueError as e:
                raise ValueError(f"{e}{self._where()}{at}") from None
        if self.hot is not None:  # hot-row profiling: this rank's training batches, by step
            self.hot.observe(sparse, step)
        return batch if sparse is batch.sparse else Batch(batch.dense, sparse, batch.labels)

    def prepare(self, batch: Batch, step: int | None = None) -> Batch:
        """A host batch checked (timed as ``check_inputs``) and on the training device."""
        with self.timer("check_inputs"):
            batch = self.check_batch(batch, step)
        return batch.to(self.device)

    def forward_loss(self, batch: Batch, sparse_in: Any = None) -> torch.Tensor:
        """The forward on a device batch; ``sparse_in``: its sparse input already through the
        input dist (the pipeline starts it a step ahead), else ``batch.sparse``."""
        with self.timer("forward"):
            logits = self.model(batch.dense, batch.sparse if sparse_in is None else sparse_in)
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)

    def backward_step(self, loss: torch.Tensor) -> None:
        """Backward (embedding rows updated inside, by the fused sparse optimizer) and the dense
        optimizer step."""
        self.optimizer.zero_grad(set_to_none=True)
        watch = getattr(self.comm, "watch_backward", None)  # a tracer: DDP's waits in the backward
        if watch is not None:
            watch(loss)
        with self.timer("backward"):
            loss.backward()
        with self.timer("optimizer"):
            self.optimizer.step()

    def train_step(self, batch: Batch, step: int) -> float:
        """One step on this rank's host batch; returns the rank-local loss as a float (a host
        sync: the training loop keeps losses on the device instead). A non-finite loss raises
        before the backward, so nothing is updated with it."""
        batch = self.prepare(batch, step)
        loss = self.forward_loss(batch)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value} at step {step}{self._where()}; stopping (check learning rates and inputs)")
        self.backward_step(loss)
        return value

    def _where(self) -> str:
        return f" on rank {self.rank}" if self.comm is not None else ""

    def comm_bytes_per_step(self, steps: int) -> dict[str, float]:
        """Bytes this rank sent per training step by collective tag (``input_dist``,
        ``output_dist``, ``output_dist_bwd``, ``dense_allreduce``, ...), over ``steps`` steps;
        collectives of evaluations are excluded (``_eval_bytes``). Empty without a communicator."""
        counted = getattr(self.comm, "bytes_by_tag", None)
        if not counted or steps <= 0:
            return {}
        out = {tag: (n - self._eval_bytes.get(tag, 0)) / steps for tag, n in sorted(counted.items())}
        return {tag: v for tag, v in out.items() if v > 0}

    def step_breakdown(self, steps: int) -> dict[str, float]:
        """Mean milliseconds per step by phase, from the timer's totals over ``steps`` steps.

        input_dist: the input dist's work on the training thread (plain loop: inside the
        forward; pipelined: starting the next batch's, between forward and backward);
        pipeline_wait: what the pipelined step still waited for its ids; lookup / output_dist:
        the embedding stages of the forward; dense_forward: the rest of the forward;
        embedding_comm_backward: what the backward waited in its embedding collectives (mirror
        exchanges, the data-parallel gradient exchange; launches and waits, not the work they
        overlap); backward_other: the rest of the backward (fused sparse update,
        dense gradients, DDP's all-reduce as far as it is not overlapped); optimizer: the dense
        optimizer step; cache_wait (cached tables): what a step waited for its rows' prefetch;
        check_inputs: the host-side input checks; data: producing batches
        (synthetic generation or file reading; pipelined, on the loader thread) and data_wait
        what the step waited for it. samples/s excludes data and data_wait.
        """
        t = self.timer.totals()
        pipelined = "pipeline_wait" in t
        # plain loop: the input dist runs inside the forward; pipelined: outside it
        emb_fwd = t.get("lookup", 0.0) + t.get("output_dist", 0.0) + (0.0 if pipelined else t.get("input_dist", 0.0))
        # the backward's embedding exchanges as far as the backward waited in them (an
        # asynchronous one's launch and wait, not the work it overlapped: TimingCommunicator)
        comm_bwd = sum(v for k, v in t.items()
                       if k.startswith("blocked:") and (k.endswith("_bwd") or k.startswith("blocked:dp_grad_")))
        out = {
            "input_dist": t.get("input_dist", 0.0),
            "pipeline_wait": t.get("pipeline_wait", 0.0),
            "lookup": t.get("lookup", 0.0),
            "output_dist": t.get("output_dist", 0.0),
            "dense_forward": t.get("forward", 0.0) - emb_fwd,
            "embedding_comm_backward": comm_bwd,
            "backward_other": t.get("backward", 0.0) - comm_bwd,
            "optimizer": t.get("optimizer", 0.0),
            "check_inputs": t.get("check_inputs", 0.0),
            "data": t.get("data", 0.0),
            "data_wait": t.get("data_wait", 0.0),
        }
        if "cache_wait" in t:  # cached tables, pipelined: what a step still waited for its rows
            out["cache_wait"] = t["cache_wait"]
        # communication the step waited for: the input dist (pipelined: its start and the wait
        # for its ids), the output dist and the embedding exchanges of the backward
        out["exposed_comm"] = out["input_dist"] + out["pipeline_wait"] + out["output_dist"] + comm_bwd
        return {k: 1e3 * v / max(1, steps) for k, v in out.items()}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Metrics over the held-out batches (every rank's); none of its time is booked in the
        step breakdown."""
        with self.timer.paused():
            return self._evaluate()

    def _evaluate(self) -> dict[str, float]:
        self.model.eval()
        data = self._eval_data if self._eval_data is not None else make_data(self.cfg, "eval", self.rank, self.world_size)
        logits, labels = [torch.zeros(0)], [torch.zeros(0)]
        for batch in itertools.islice(data if data is not None else (), self.cfg.train.eval_batches):
            batch = self.prepare(batch)
            logits.append(self.model(batch.dense, batch.sparse).float().cpu())
            labels.append(batch.labels.float().cpu())
        self.model.train()
        lg, lb = torch.cat(logits), torch.cat(labels)
        if self.comm is not None:  # metrics over every rank's held-out samples
            dev = getattr(self.comm, "device", "cpu")
            n = torch.tensor([lg.numel()], device=dev)
            sizes = [int(v) for v in self.comm.all_gather_v(n, [1] * self.world_size, tag="metrics")]
            lg = self.comm.all_gather_v(lg.to(dev), sizes, tag="metrics").cpu()
            lb = self.comm.all_gather_v(lb.to(dev), sizes, tag="metrics").cpu()
        if lg.numel() == 0:  # no held-out data: no metrics, not a failure of the run
            return {}
        return binary_metrics(lg, lb)

    def run(self) -> TrainResult:
        """Train ``train.steps`` steps (resuming from a checkpoint when there is one), evaluate,
        return the result. On failure ``self.result`` still holds what was done (the losses read
        so far, evaluations) and the error, for the summary and ``--metrics-out``."""
        t = self.cfg.train
        self.result = TrainResult(self.cfg.name, self.backend, self.world_size, t.batch_size, t.steps)
        try:
            return self._run(self.result)
        except BaseException as e:
            self.result.error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            self.result.comm_bytes_per_step = self.comm_bytes_per_step(len(self.result.losses) - self._start_step)
            if self.writer is not None:
                self.writer.close()
            raise

    def _run(self, result: TrainResult) -> TrainResult:
        t = self.cfg.train
        start = self._start_step = self._resume(result)
        if self._log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self._log_dir), purge_step=start or None)
        bar = _progress(t.steps, self.progress, initial=start)
        train_time = 0.0  # host seconds of training work: data loading and evaluation excluded
        pending: list[torch.Tensor] = []  # local losses (device scalars) not yet read or averaged

        def flush(step: int) -> None:
            """Read the pending losses (one host sync per logging interval), average them over
            ranks in one all-reduce, and stop on the first non-finite one."""
            if not pending:
                return
            losses = self.global_means(torch.stack(pending))
            pending.clear()
            first = step - len(losses)
            cap = t.max_loss or math.inf
            bad = next((i for i, v in enumerate(losses) if not math.isfinite(v) or v > cap), None)
            if bad is not None:
                result.losses.extend(losses[:bad])  # the steps before it stay recorded
                why = "" if not math.isfinite(losses[bad]) else f" > train.max_loss = {t.max_loss:g}: the model diverged"
                raise FloatingPointError(
                    f"loss is {losses[bad]:.6g} at step {first + bad}{why}; stopping (check learning rates and inputs)"
                )
            if self.writer is not None:
                for i, v in enumerate(losses):
                    if (first + i) % t.log_every == 0:
                        self.writer.add_scalar("train/loss", v, first + i)
            result.losses.extend(losses)
            bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)

        pipe = TrainPipeline(self, first_step=start) if t.pipeline else None
        end = t.steps  # the step training stops at: earlier when the data ends
        mark_step = getattr(self.comm, "trace_step", None)  # a tracer: step boundaries in the trace
        try:
            for step in range(start, t.steps):
                if mark_step is not None:
                    mark_step(step)
                t0 = time.perf_counter()
                _fault_injection(step, self.rank)
                if pipe is not None:
                    stalled = pipe.data_stall_s
                    try:
                        loss = pipe.step(step)
                    except EndOfData:
                        end = step
                        break
                    t0 += pipe.data_stall_s - stalled  # waiting for the loader is not training work
                else:
                    try:
                        batch = next(self.train_data)
                    except StopIteration:
                        end = step
                        break
                    data_s = time.perf_counter() - t0
                    self.timer.add("data", data_s)
                    t0 += data_s
                    loss = self.forward_loss(self.prepare(batch, step))
                    self.backward_step(loss)
                    loss = loss.detach()
                pending.append(loss)
                if self.hot is not None:
                    self.hot.after_step(step + 1, self.comm)
                if (step + 1) % t.log_every == 0:
                    flush(step + 1)
                dt = time.perf_counter() - t0
                train_time += dt
                bar.update(1)
                if (step + 1) % t.log_every == 0 and self.writer is not None:
                    self.writer.add_scalar("train/samples_per_s", t.batch_size * self.world_size / max(dt, 1e-9), step)
                    self._log_breakdown(step + 1)
                if (step + 1) % t.log_every == 0 and self.cached_kernels:
                    self._log_cache(result, step + 1)
                if t.eval_every and (step + 1) % t.eval_every == 0 and step + 1 < t.steps:
                    self._record_eval(result, step + 1)  # its input dist queues behind the in-flight one
                if t.checkpoint_dir and t.checkpoint_every and (step + 1) % t.checkpoint_every == 0 and step + 1 < t.steps:
                    flush(step + 1)
                    self._save(step + 1, result)
            t0 = time.perf_counter()
            flush(end)
            train_time += time.perf_counter() - t0
        except BaseException:
            if self.comm is None and pending:  # one process: its losses are the global ones
                result.losses.extend(torch.stack(pending).double().tolist())
            raise
        finally:
            if mark_step is not None:
                mark_step(None)
            if pipe is not None:
                pipe.close()
        if end < t.steps:
            self._data_ended(result, start, end)
        if t.checkpoint_dir and end > start:
            self._save(end, result)
        bar.close()
        result.train_seconds = train_time
        # global throughput: every rank trains b samples a step; the slowest rank sets the pace
        train_time = self.global_max(train_time)
        result.train_seconds = train_time
        done = end - start
        result.samples_per_s = done * t.batch_size * self.world_size / train_time if train_time > 0 else 0.0
        result.step_ms = self.step_breakdown(done)
        result.comm_bytes_per_step = self.comm_bytes_per_step(done)
        result.cache = self._cache_summary(done)
        result.eval = self._record_eval(result, end)
        if self.writer is not None:
            self.writer.add_scalar("train/samples_per_s_avg", result.samples_per_s, end)
            self.writer.close()
        return result

    def _data_ended(self, result: TrainResult, start: int, end: int) -> None:
        """The training data ended at step ``end`` (before ``train.steps``): the run stops there,
        keeps what it trained, and says so. Every rank reads the same stream, so all end together."""
        result.steps = end
        d, t = self.cfg.data, self.cfg.train
        where = f"{d.epochs} epoch(s) of {d.path}" if d.source == "criteo" else "the given data"
        note = f"the training data ended at step {end} of {t.steps} ({where})"
        result.notes.append(note)
        if self.rank == 0:
            print(f"neo-train: {note}; stopping there", flush=True)
        if end == start:
            raise ValueError(f"{note}: nothing to train (no whole global batch of "
                             f"{t.batch_size * self.world_size} samples left)")

    def _resume(self, result: TrainResult) -> int:
        """Resume from the newest checkpoint (collective); returns the step to start at."""
        t = self.cfg.train
        if not (t.checkpoint_dir and t.resume):
            return 0
        from .checkpoint import find_latest, load_history, resume_from_latest

        start, batch = resume_from_latest(self, t.checkpoint_dir)
        if start > t.steps:
            raise ValueError(
                f"the newest checkpoint under {t.checkpoint_dir} is at step {start}, beyond train.steps = {t.steps}: "
                f"nothing to train (raise --steps, or use another --checkpoint-dir / --no-resume)"
            )
        if start:
            if self._own_train_data:  # the data stream continues where the checkpoint left it
                self.train_data = make_data(self.cfg, "train", self.rank, self.world_size, batch)
            history = load_history(find_latest(t.checkpoint_dir)) or {}
            losses = history.get("losses", [])[:start]
            if len(losses) < start and self.rank == 0:
                print(f"neo-train: the checkpoint holds the losses of {len(losses)} of its {start} steps", flush=True)
            result.losses.extend(losses)
            result.eval_history.extend(e for e in history.get("eval_history", []) if e.get("step", 0) <= start)
            if self.rank == 0:
                print(f"neo-train: resumed from step {start} ({t.checkpoint_dir})", flush=True)
        return start

    def _save(self, step: int, result: TrainResult) -> None:
        from .checkpoint import checkpoint_dir, save_checkpoint

        # the per-step global losses so far travel inside the checkpoint (one atomic unit)
        history = {"step": step, "losses": result.losses[:step], "eval_history": result.eval_history}
        save_checkpoint(self, checkpoint_dir(self.cfg.train.checkpoint_dir, step), step, history=history)

    # ---- cached tables (storage.cache_load_factor < 1) ----------------------------------------
    @property
    def cached_kernels(self) -> list[Any]:
        """This rank's fused kernels that cache their rows over a backing store."""
        if not hasattr(self, "_cached_kernels"):
            from ..kernels import FusedEmbeddingBag

            self._cached_kernels = [
                m for m in self.model.modules() if isinstance(m, FusedEmbeddingBag) and m.backend_name == "cached"
            ]
        return self._cached_kernels

    def cache_stats(self) -> dict[str, float]:
        """This rank's cumulative cache counters, summed over its cached kernels."""
        total: dict[str, float] = {}
        for k in self.cached_kernels:
            for name, v in k.stats().items():
                total[name] = total.get(name, 0) + v
        return total

    @staticmethod
    def _cache_rates(now: dict[str, float], before: dict[str, float], steps: int) -> dict[str, float]:
        d = {k: now.get(k, 0) - before.get(k, 0) for k in now}
        n = max(1, steps)
        return {
            "hit_rate": d["hits"] / d["unique_rows"] if d.get("unique_rows") else float("nan"),
            "rows_fetched_per_step": d["misses"] / n,
            "rows_prefetched_per_step": d["prefetched_rows"] / n,
            "rows_evicted_per_step": d["evictions"] / n,
            "rows_written_back_per_step": d["writebacks"] / n,
            "bytes_read_per_step": d["bytes_read"] / n,
            "bytes_written_per_step": d["bytes_written"] / n,
            "fetch_ms_per_step": 1e3 * d["fetch_s"] / n,
        }

    def _log_cache(self, result: TrainResult, step: int) -> None:
        """Per logging interval (rank-local: no collective): hit rate, rows fetched / evicted,
        bytes between the cache and its backing tier, fetch time; TensorBoard and history."""
        now = self.cache_stats()
        before, since = getattr(self, "_cache_mark", ({}, 0))
        self._cache_mark = (now, step)
        rates = self._cache_rates(now, before, step - since)
        tier = "ssd" if self.cfg.storage.storage_dir else "host"
        result.cache_history.append({"step": step, **rates})
        if self.writer is not None:
            for k, v in rates.items():
                self.writer.add_scalar(f"cache/{k.replace('bytes', f'bytes_{tier}')}", v, step)

    def _cache_summary(self, steps: int) -> dict[str, float]:
        """Per-step means over the run, summed over ranks (one all-reduce, on every rank alike:
        whether any table is cached is the same decision everywhere)."""
        if not self._any_cached_table():
            return {}
        keys = ("lookups", "unique_rows", "hits", "misses", "evictions", "writebacks", "bytes_read",
                "bytes_written", "prefetched_rows", "prefetch_deferred", "fetch_s")
        mine = self.cache_stats()
        v = torch.tensor([float(mine.get(k, 0)) for k in keys], dtype=torch.float64)
        if self.comm is not None:
            v = self.comm.all_reduce(v.to(getattr(self.comm, "device", "cpu")), op="sum", tag="metrics").cpu()
        total = dict(zip(keys, v.tolist()))
        out = self._cache_rates(total, {}, steps)
        out["fetch_ms_per_step"] /= max(1, self.world_size)  # per rank: the ranks fetch in parallel
        out["tier"] = "ssd" if self.cfg.storage.storage_dir else "host"  # type: ignore[assignment]
        out["prefetch_deferred"] = total["prefetch_deferred"]
        return out

    def _any_cached_table(self) -> bool:
        """Whether any table is cached: the same answer on every rank (config and plan only)."""
        from ..modules.storage import cached_tables

        plan = getattr(getattr(self.model, "embeddings", None), "plan", None)
        return bool(cached_tables(self.cfg.model, self.cfg.storage, plan))

    def _log_breakdown(self, step: int) -> None:
        """TensorBoard: per-phase ms/step and bytes per collective tag per step, so far."""
        for k, v in self.step_breakdown(step).items():
            self.writer.add_scalar(f"step_ms/{k}", v, step)
        if self.comm is not None:
            for tag, n in self.comm_bytes_per_step(step - self._start_step).items():
                self.writer.add_scalar(f"comm_bytes_per_step/{tag}", n, step)

    def global_max(self, value: float) -> float:
        if self.comm is None:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=getattr(self.comm, "device", "cpu"))
        return float(self.comm.all_reduce(t, op="max", tag="metrics")[0])

    def _record_eval(self, result: TrainResult, step: int) -> dict[str, float]:
        counted = getattr(self.comm, "bytes_by_tag", None)
        before = dict(counted or {})
        m = self.evaluate()
        for tag, n in (counted or {}).items():  # an evaluation's bytes are not a training step's
            self._eval_bytes[tag] = self._eval_bytes.get(tag, 0) + n - before.get(tag, 0)
        if not m:
            note = "no evaluation: no held-out data (give data.eval_path, or data.holdout_every >= 2 with enough data)"
            if note not in result.notes:
                result.notes.append(note)
                if self.rank == 0:
                    print(f"neo-train: {note}", flush=True)
            return m
        result.eval_history.append({"step": step, **m})
        if self.writer is not None:
            for k in ("auc", "ne", "log_loss"):
                self.writer.add_scalar(f"eval/{k}", m[k], step)
        return m


def _check_values(batch: Batch) -> None:
    """ValueError naming the field: an empty batch, NaN/Inf in dense values, labels or weights,
    labels outside [0, 1]."""
    if batch.batch_size == 0:
        raise ValueError("the batch is empty (0 samples)")
    fields = {"dense features": batch.dense, "labels": batch.labels, "sparse weights": batch.sparse.weights}
    for name, x in fields.items():
        if x is not None and x.is_floating_point() and not bool(torch.isfinite(x).all()):
            bad = x[~torch.isfinite(x)][0]
            raise ValueError(f"{name} hold non-finite values ({float(bad)})")
    lb = batch.labels
    if bool(((lb < 0) | (lb > 1)).any()):
        raise ValueError(f"labels must lie in [0, 1]; got {float(lb[(lb < 0) | (lb > 1)][0])}")


def _progress(total: int, enabled: bool, initial: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc="train", unit="step", dynamic_ncols=True, leave=False)


def _fault_injection(step: int, rank: int) -> None:
    """Testing aid for elastic restarts: NEO_TRAIN_FAIL_AT="<step>:<rank>" kills that rank at
    that step, on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0)."""
    spec = os.environ.get("NEO_TRAIN_FAIL_AT")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    at, who = (int(x) for x in spec.split(":"))
    if step == at and rank == who:
        print(f"neo-train: NEO_TRAIN_FAIL_AT: rank {rank} dies at step {step}", flush=True)
        os._exit(17)
