"""One GPU command for the GPU goals: copy bandwidth, the Triton TBE against two torch baselines,
and single-GPU DLRM training against plain PyTorch; a JSON report, a PNG and a pass/fail table.

    python benchmarks/gpu_suite.py --json gpu_suite.json --png gpu_suite.png    # a CUDA machine
    python benchmarks/gpu_suite.py --quick                                      # small sizes
    python benchmarks/gpu_suite.py --device cpu --quick --json s.json --png s.png
        # SMOKE RUN (CI): the CPU, the reference backend in triton's place, toy sizes; it checks
        # that the script runs end to end, its numbers measure nothing

Without CUDA (and without --device cpu) it says that it needs CUDA and exits 0. Reuses
benchmarks/embedding_gpu.py (workload, batches, bytes, the triton and per-table impls, its
CUDA-event timers and the copy-bandwidth probe) rather than copying it.

1. Copy bandwidth: ``embedding_gpu.copy_bandwidth_gbs``, a device-to-device copy of 2 GiB (1 GiB
   with --quick), bytes read + written per second, best of 10: the practical ceiling. (CPU smoke:
   a 64 MiB tensor copy timed with perf_counter.)

2. Table-batched embeddings (TBE) on Model-A-shaped per-GPU work: embedding_gpu's modelA-tw128,
   one GPU's share of Model-A sharded table-wise over 128 GPUs: T = 8 tables, dims 192, 16, 192,
   64, 192, 8, 8, 96, 1M rows each, looked up for the global batch B = 65,536, L = 15 ids per
   bag, sum pooling (--quick: 20k rows, B = 4096; CPU smoke: 5k rows, B = 256). Two id
   distributions (--alpha): uniform (alpha 0), where the goals are read, and power law alpha 1.1.
   The forward's byte count below charges one row read per id (FBGEMM's benchmarks count the
   same way); with uniform ids over 1M rows that is the traffic, with power-law ids the hot rows
   come from L2 and the "fraction of copy bandwidth" can pass 100 % (an effective rate, not a
   bandwidth). Row-wise AdaGrad (lr 0.01, eps 1e-8) fused into the backward:
     triton         neo_train's TritonEmbeddingBag (``embedding_gpu.triton_impl``; CPU smoke: the
                    reference backend)
     per-table      nn.EmbeddingBag(sparse=True) per table + torch.optim.Adagrad on the sparse
                    gradients (torch has no row-wise AdaGrad, so its state is element-wise)
                    (``embedding_gpu.baseline_impl``)
     batched torch  hand-written, all tables in one go (``BatchedTorchTBE``): one flat buffer,
                    one index_select + one index_add_ forward; backward one gather of the
                    output-gradient chunks, torch.unique of the rows, index_add_ of the row
                    gradients, row-wise AdaGrad in torch ops
   Bytes per call, compulsory traffic (each byte once, caches ignored; ``embedding_gpu.bytes_moved``;
   N_t = B*L ids of table t, N = sum_t N_t, U_t its distinct rows in the batch):
     forward  = sum_t N_t*D_t*4          one float32 weight row read per id
              + N*8 + (T*B+1)*8           ids and offsets (int64)
              + B*sum_t D_t*4             pooled output written
     backward = B*sum_t D_t*4            output gradient read
              + N*8 + (T*B+1)*8           ids and offsets read again
              + sum_t U_t*(D_t*4 + s_t)*2 touched rows and their state read + written;
                                          s_t = 4 (row-wise momentum), D_t*4 for the per-table
                                          baseline's element-wise Adagrad (its own traffic)
   Scratch (sorts, segment lists, the baselines' gathered copies) is overhead, not counted.
   % copy = bytes / time / copy bandwidth. Times: median of --repeats CUDA-event-timed calls after
   --warmup untimed ones; "backward" is the backward + optimizer with its forward outside the
   timed region. Before timing, the forward of every impl and the forward after one training step
   of triton and batched torch (the same row-wise AdaGrad) are checked to agree.

3. Training: samples/s of single-GPU DLRM training, the criteo_kaggle preset (26 tables of the
   Kaggle cardinalities, D = 16, MLPs 512-256-64-16 / 512-256, dot interaction, B = 2048,
   row-wise AdaGrad on the tables, Adagrad on the MLPs; --quick: rows x 0.01; CPU smoke: rows
   x 0.001, B = 256):
     neo_train   Trainer(cfg, device="cuda"), kernel_backend triton, pipeline on, driven step by
                 step (``neo_steps``)
     plain       the same DLRM module (neo_train.modules.DLRM: same MLPs, interaction and dense
                 init) over per-table nn.EmbeddingBag(sparse=True) + torch.optim.Adagrad
                 (SparseAdam for adam, SGD for sgd), the config's dense optimizer; a plain loop:
                 copy the batch in, forward, BCE, backward, two optimizer steps, no host sync
   Both read the same pre-generated synthetic host batches (generation is not timed; the plain
   loop gets them already split per table, as a DataLoader would). Timing: CUDA events around
   --train-steps steps after --train-warmup, median of --repeats. The first step's losses of the
   two are compared (same model, same batch: they must agree).

Goals (issues 6 and 10): triton forward >= 80 % and backward + row-wise AdaGrad >= 40 % of the
measured copy bandwidth; neo_train training >= 3x the plain DLRM's samples/s.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # embedding_gpu, when imported as a module
import embedding_gpu as eg  # noqa: E402
from report_io import write_outputs  # noqa: E402  (benchmarks/ is on the path: run as a script)

__all__ = ["BatchedTorchTBE", "PlainEmbeddings", "main"]

GOALS = {"fwd_frac": eg.GOALS["fwd_frac"], "bwd_frac": eg.GOALS["bwd_frac"], "train_speedup": 3.0}
KIND = "rowwise_adagrad"
LR, EPS = 0.01, 1e-8  # embedding_gpu's triton impl: SparseOptimizerSpec(kind, lr=0.01), default eps


# ---- timing ----------------------------------------------------------------------------------
def timed_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of ``fn()``: CUDA events on a GPU (device time, host gaps included), else
    perf_counter."""
    if device.type == "cuda":
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_forward(impl: eg.Impl, batches: list[eg.Batch], warmup: int, repeats: int, device: torch.device) -> float:
    if device.type == "cuda":
        return eg.time_forward(impl, batches, warmup, repeats)
    for i in range(warmup):
        impl.forward(batches[i % len(batches)])
    times = [timed_ms(lambda b=batches[i % len(batches)]: impl.forward(b), device) for i in range(repeats)]
    return statistics.median(times)


def time_backward(impl: eg.Impl, batches: list[eg.Batch], warmup: int, repeats: int, device: torch.device) -> float:
    if device.type == "cuda":
        return eg.time_backward(impl, batches, warmup, repeats)
    times = []
    for i in range(warmup + repeats):
        b = batches[i % len(batches)]
        out = impl.train_forward(b)
        ms = timed_ms(lambda: impl.backward(out, b), device)
        if i >= warmup:
            times.append(ms)
    return statistics.median(times)


def cpu_copy_bandwidth_gbs(mib: int = 64, repeats: int = 5) -> float:
    src = torch.empty(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(timed_ms(lambda: dst.copy_(src), torch.device("cpu")) for _ in range(repeats))
    return 2 * mib * 2**20 / (best * 1e-3) / 1e9


# ---- the hand-written batched torch baseline ---------------------------------------------------
class BatchedTorchTBE:
    """Every table in one flat float32 buffer, viewed as (chunks, G) with G = gcd of the dims:
    table t's row r is chunks [c_t + r*K_t, c_t + (r+1)*K_t), K_t = D_t / G (no padding). The
    pooled output (B, sum D) is viewed the same way, (B * sum K_t, G).

    forward   every id expands to its K_t chunks: one index_select of the weight chunks (M, G),
              M = sum_t N_t*K_t, one index_add_ into the output chunks
    backward  one index_select of the output-gradient chunks; torch.unique of the global rows;
              one index_add_ sums each touched row's gradient (duplicates included) into a
              compact (sum_u K_u, G) buffer; per-row mean(g^2) by index_add_; momentum and
              weights updated with index ops (rows unique: no write conflicts)
    Sum pooling, no per-id weights (the modelA-tw128 workload). Row-wise AdaGrad as in base.py:
    m += mean(g^2); w -= lr * g / (sqrt(m) + eps)."""

    def __init__(self, w: eg.Workload, device: torch.device, lr: float = LR, eps: float = EPS) -> None:
        from neo_train.kernels.init import init_table

        self.w, self.lr, self.eps = w, lr, eps
        dims = list(w.dims)
        self.G = G = math.gcd(*dims)
        k = [d // G for d in dims]
        chunk_base = list(itertools.accumulate([w.rows * kt for kt in k], initial=0))[:-1]
        col_chunk = list(itertools.accumulate(k, initial=0))[:-1]
        i64 = dict(dtype=torch.int64, device=device)
        self.k_t = torch.tensor(k, **i64)
        self.chunk_base_t = torch.tensor(chunk_base, **i64)
        self.col_chunk_t = torch.tensor(col_chunk, **i64)
        self.row_base_t = torch.arange(len(dims), **i64) * w.rows
        self.dim_t = torch.tensor(dims, dtype=torch.float32, device=device)
        self.out_chunks = sum(k)  # per sample
        self.weights = torch.cat([init_table(0, t, w.rows, d).reshape(-1, G) for t, d in enumerate(dims)]).to(device)
        self.momentum = torch.zeros(len(dims) * w.rows, device=device)
        self._saved: tuple[torch.Tensor, ...] | None = None

    def _expand(self, values: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per (id, chunk): source weight chunk, destination output chunk; plus the id of each
        chunk (rep), its index within the row (j), and each id's table."""
        B, T, N = self.w.batch, len(self.w.dims), values.numel()
        dev = values.device
        lengths = offsets[1:] - offsets[:-1]
        bag = torch.repeat_interleave(torch.arange(T * B, device=dev), lengths, output_size=N)
        tab = bag // B
        k = self.k_t.index_select(0, tab)  # (N,) chunks per id
        M = B * self.w.pooling * self.out_chunks  # every bag holds exactly L ids: no host read
        rep = torch.repeat_interleave(torch.arange(N, device=dev), k, output_size=M)
        j = torch.arange(M, device=dev) - (torch.cumsum(k, 0) - k).index_select(0, rep)
        src = (self.chunk_base_t.index_select(0, tab) + values * k).index_select(0, rep) + j
        dst = ((bag - tab * B) * self.out_chunks + self.col_chunk_t.index_select(0, tab)).index_select(0, rep) + j
        return src, dst, rep, j, tab

    def _pool(self, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(self.w.batch * self.out_chunks, self.G, device=self.weights.device)
        out.index_add_(0, dst, self.weights.index_select(0, src))
        return out.view(self.w.batch, -1)  # (B, sum D)

    @torch.no_grad()
    def forward(self, b: eg.Batch) -> torch.Tensor:
        src, dst, *_ = self._expand(b.values, b.offsets)
        return self._pool(src, dst)

    @torch.no_grad()
    def train_forward(self, b: eg.Batch) -> torch.Tensor:
        """The forward, keeping what its backward needs (as an autograd.Function would)."""
        src, dst, rep, j, tab = self._expand(b.values, b.offsets)
        self._saved = (dst, rep, j, tab, b.values)
        return self._pool(src, dst)

    @torch.no_grad()
    def backward(self, out: torch.Tensor, b: eg.Batch) -> None:
        assert self._saved is not None, "backward without train_forward"
        dst, rep, j, tab, values = self._saved
        self._saved = None
        G, dev = self.G, self.weights.device
        contrib = b.grad_out.reshape(-1, G).index_select(0, dst)  # (M, G) each id's gradient chunks
        rows, inv = torch.unique(self.row_base_t.index_select(0, tab) + values, return_inverse=True)  # (U,), (N,)
        utab = torch.div(rows, self.w.rows, rounding_mode="floor")  # tables have equal rows here
        uk = self.k_t.index_select(0, utab)
        ufirst = torch.cumsum(uk, 0) - uk
        Mu = int(uk.sum())  # host read: the compact buffer's size
        grad = torch.zeros(Mu, G, device=dev)
        grad.index_add_(0, ufirst.index_select(0, inv).index_select(0, rep) + j, contrib)  # row gradients
        crow = torch.repeat_interleave(torch.arange(rows.numel(), device=dev), uk, output_size=Mu)
        sumsq = torch.zeros(rows.numel(), device=dev).index_add_(0, crow, (grad * grad).sum(1))
        m = self.momentum.index_select(0, rows) + sumsq / self.dim_t.index_select(0, utab)
        self.momentum.index_copy_(0, rows, m)
        scale = (self.lr / (m.sqrt() + self.eps)).index_select(0, crow)  # (Mu,)
        first_chunk = self.chunk_base_t.index_select(0, utab) + (rows - self.row_base_t.index_select(0, utab)) * uk
        wchunk = first_chunk.index_select(0, crow) + torch.arange(Mu, device=dev) - ufirst.index_select(0, crow)
        self.weights.index_add_(0, wchunk, grad * -scale[:, None])

    def impl(self) -> eg.Impl:
        return eg.Impl("batched torch (index_select + index_add_, row-wise AdaGrad)", "rowwise", 4,
                       self.forward, self.train_forward, self.backward)  # fmt: skip


def fused_impl(w: eg.Workload, device: torch.device) -> eg.Impl:
    """triton on a GPU (``embedding_gpu.triton_impl``); the reference backend in a CPU smoke run."""
    if device.type == "cuda":
        return eg.triton_impl(w, KIND, torch.float32)
    from neo_train.kernels import SparseOptimizerSpec, TableSpec, create_embedding_bag

    m = create_embedding_bag("reference", [TableSpec(w.rows, d) for d in w.dims], SparseOptimizerSpec(KIND, lr=LR),
                             device=device, seed=0)  # fmt: skip
    m.check_ids = False

    def forward(b: eg.Batch) -> torch.Tensor:
        with torch.no_grad():
            return m(b.values, b.offsets)

    return eg.Impl(f"reference ({KIND}, float32) [smoke: stands in for triton]", "rowwise", 4, forward,
                   lambda b: m(b.values, b.offsets), lambda out, b: out.backward(b.grad_out))  # fmt: skip


# ---- part 2: TBE -------------------------------------------------------------------------------
def tbe_part(w: eg.Workload, args: argparse.Namespace, device: torch.device, copy_gbs: float,
             alpha: float) -> dict[str, Any]:  # fmt: skip
    batches = [eg.make_batch(w, seed, alpha, device) for seed in range(2)]
    makers = [
        ("fused", lambda: fused_impl(w, device)),
        ("per_table", lambda: eg.baseline_impl(w, KIND)),
        ("batched", lambda: BatchedTorchTBE(w, device).impl()),
    ]
    rows, before, after = [], {}, {}
    for key, make in makers:
        impl = make()
        # checks, on fresh tables: the forward, then the forward after one training step
        before[key] = impl.forward(batches[1]).float().cpu()
        impl.backward(impl.train_forward(batches[0]), batches[0])
        after[key] = impl.forward(batches[1]).float().cpu()
        fwd_ms = time_forward(impl, batches, args.warmup, args.repeats, device)
        bwd_ms = time_backward(impl, batches, args.warmup, args.repeats, device)
        fwd_b, bwd_b = eg.bytes_moved(w, batches[0], impl.weight_bytes, impl.state)
        rows.append({
            "key": key, "impl": impl.name, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "fwd_bytes": fwd_b, "bwd_bytes": bwd_b,
            "fwd_gbs": fwd_b / fwd_ms / 1e6, "bwd_gbs": bwd_b / bwd_ms / 1e6,
            "fwd_frac": fwd_b / fwd_ms / 1e6 / copy_gbs, "bwd_frac": bwd_b / bwd_ms / 1e6 / copy_gbs,
        })  # fmt: skip
        print(f"  {impl.name:<64} fwd {fwd_ms:9.3f} ms {100 * rows[-1]['fwd_frac']:6.1f}% copy | "
              f"bwd+opt {bwd_ms:9.3f} ms {100 * rows[-1]['bwd_frac']:6.1f}% copy", flush=True)  # fmt: skip
        del impl
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    fused = rows[0]
    for r in rows:
        r["fwd_speedup_of_fused"] = r["fwd_ms"] / fused["fwd_ms"]
        r["bwd_speedup_of_fused"] = r["bwd_ms"] / fused["bwd_ms"]
    checks = {
        "fwd_max_abs_diff_per_table": (before["fused"] - before["per_table"]).abs().max().item(),
        "fwd_max_abs_diff_batched": (before["fused"] - before["batched"]).abs().max().item(),
        "after_step_max_abs_diff_batched": (after["fused"] - after["batched"]).abs().max().item(),
    }
    bad = {k: v for k, v in checks.items() if not v < 1e-4}
    assert not bad, f"the TBE implementations disagree (max abs diff): {bad}"
    return {"workload": dataclasses.asdict(w), "alpha": alpha, "unique_rows": batches[0].unique_rows, "rows": rows,
            "checks": checks}  # fmt: skip


# ---- part 3: training --------------------------------------------------------------------------
PerFeature = list[tuple[torch.Tensor, torch.Tensor]]  # (values_f, offsets_f) device tensors per feature


class PlainEmbeddings(nn.Module):
    """Per-table nn.EmbeddingBag(sparse=True), the tables' init (kernels/init.py); forward takes
    per-feature (values, offsets) device tensors, split on the host as a DataLoader would."""

    def __init__(self, cfg: Any, device: torch.device) -> None:
        from neo_train.kernels.init import init_table

        super().__init__()
        seed = cfg.train.seed
        self.bags = nn.ModuleList(
            nn.EmbeddingBag(t.num_rows, t.dim, mode=t.pooling, sparse=True,
                            _weight=init_table(seed, i, t.num_rows, t.dim))  # fmt: skip
            for i, t in enumerate(cfg.model.tables)
        ).to(device)
        self.feature_table = [i for i, t in enumerate(cfg.model.tables) for _ in t.feature_names]

    def forward(self, per_feature: PerFeature) -> torch.Tensor:
        return torch.cat([self.bags[t](v, o) for t, (v, o) in zip(self.feature_table, per_feature)], dim=1)


class PlainDLRM(nn.Module):
    """neo_train's DLRM layers (bottom MLP, interaction, top MLP, logit; the same dense init as
    build_model) over PlainEmbeddings, wired in a plain forward."""

    def __init__(self, cfg: Any, device: torch.device) -> None:
        from neo_train.modules import DLRM

        super().__init__()
        torch.manual_seed(cfg.train.seed)  # as build_model: the tables draw nothing, the MLPs next
        self.embeddings = PlainEmbeddings(cfg, device)
        dims = [t.dim for t in cfg.model.tables for _ in t.feature_names]
        self.dense = DLRM(cfg.model, nn.Identity(), dims).to(device)  # only its dense layers are used

    def forward(self, dense: torch.Tensor, per_feature: PerFeature) -> torch.Tensor:
        d = self.dense
        z = d.interaction(d.bottom(dense), self.embeddings(per_feature))  # (B, D), (B, sum D_f)
        return d.logit(d.top(z)).squeeze(1)  # (B,)


def _split_host_batch(batch: Any, device: torch.device) -> tuple[torch.Tensor, PerFeature, torch.Tensor]:
    """(dense, [(values_f, offsets_f)], labels), pinned on a GPU machine; per-id weights refused."""
    sp = batch.sparse
    if sp.weights is not None:
        raise ValueError("the plain baseline handles unweighted features only")
    pin = (lambda x: x.pin_memory()) if device.type == "cuda" else (lambda x: x)
    per = []
    for values, lengths, _ in sp.by_feature().values():
        offsets = torch.zeros(lengths.numel(), dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths[:-1].to(torch.int64), 0)
        per.append((pin(values.to(torch.int64)), pin(offsets)))
    return pin(batch.dense), per, pin(batch.labels)


class PlainRunner:
    """The plain PyTorch training loop."""

    def __init__(self, cfg: Any, host_batches: list[Any], device: torch.device) -> None:
        from neo_train.train.trainer import make_dense_optimizer

        self.device = device
        self.model = PlainDLRM(cfg, device)
        emb = list(self.model.embeddings.parameters())
        t = cfg.train
        if t.sparse_optimizer == "adam":
            self.sparse_opt: torch.optim.Optimizer = torch.optim.SparseAdam(emb, lr=t.sparse_lr, eps=t.eps)
        elif t.sparse_optimizer == "sgd":
            self.sparse_opt = torch.optim.SGD(emb, lr=t.sparse_lr)
        else:  # adagrad, rowwise_adagrad (torch has no row-wise AdaGrad)
            self.sparse_opt = torch.optim.Adagrad(emb, lr=t.sparse_lr, eps=t.eps)
        self.dense_opt = make_dense_optimizer(t, self.model.dense.dense_parameters())
        self.batches = itertools.cycle([_split_host_batch(b, device) for b in host_batches])

    def step(self) -> torch.Tensor:
        dense, per, labels = next(self.batches)
        nb = self.device.type == "cuda"
        dense, labels = dense.to(self.device, non_blocking=nb), labels.to(self.device, non_blocking=nb)
        per = [(v.to(self.device, non_blocking=nb), o.to(self.device, non_blocking=nb)) for v, o in per]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.model(dense, per), labels)
        self.dense_opt.zero_grad(set_to_none=True)
        self.sparse_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.dense_opt.step()
        self.sparse_opt.step()
        return loss.detach()

    def steps(self, n: int) -> list[Any]:
        return [self.step() for _ in range(n)]

    def close(self) -> None:
        pass


class NeoRunner:
    """neo_train's Trainer, stepped as Trainer.run steps it (pipelined when cfg.train.pipeline)."""

    def __init__(self, cfg: Any, host_batches: list[Any], device: torch.device) -> None:
        from neo_train.train import Trainer

        self.trainer = Trainer(cfg, device=device, progress=False, train_data=itertools.cycle(host_batches))
        self.next_step = 0
        self.pipe: Any = None

    def steps(self, n: int) -> list[Any]:
        out = neo_steps(self, self.next_step, n)
        self.next_step += n
        return out

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()


def neo_steps(runner: NeoRunner, start: int, n: int) -> list[Any]:
    """Steps [start, start + n) of runner.trainer; what each returned (a device tensor is not
    read: that would add a sync)."""
    trainer = runner.trainer
    if trainer.cfg.train.pipeline:
        if runner.pipe is None:
            from neo_train.train import TrainPipeline

            runner.pipe = TrainPipeline(trainer)
        return [runner.pipe.step(i) for i in range(start, start + n)]
    return [trainer.train_step(next(trainer.train_data), i) for i in range(start, start + n)]


def train_config(args: argparse.Namespace, device: torch.device) -> Any:
    from neo_train.config import preset

    cfg = preset(args.train_preset, row_scale=args.train_row_scale)
    batch = args.train_batch or cfg.train.batch_size
    backend = "triton" if device.type == "cuda" else "reference"
    return cfg.replace(train=cfg.train.replace(batch_size=batch, kernel_backend=backend, pipeline=True,
                                               steps=10**9))  # fmt: skip


def training_part(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from neo_train.data.synthetic import SyntheticData

    cfg = train_config(args, device)
    B = cfg.train.batch_size
    data = SyntheticData(cfg.model, cfg.data, B, seed=cfg.train.seed)
    host_batches = [data.batch(i) for i in range(args.train_batches)]
    rows, first = [], {}
    for key, make in (("neo_train", lambda: NeoRunner(cfg, host_batches, device)),
                      ("plain", lambda: PlainRunner(cfg, host_batches, device))):  # fmt: skip
        runner = make()
        try:
            warm = runner.steps(args.train_warmup)
            first[key] = float(warm[0])
            times = [timed_ms(lambda: runner.steps(args.train_steps), device) for _ in range(args.repeats_train)]
        finally:
            runner.close()
        ms = statistics.median(times)
        name = (f"neo_train (Trainer, {cfg.train.kernel_backend}, pipeline)" if key == "neo_train"
                else f"plain PyTorch (nn.EmbeddingBag sparse + {type(runner.sparse_opt).__name__})")  # fmt: skip
        rows.append({"key": key, "impl": name, "ms_per_step": ms / args.train_steps,
                     "samples_per_s": B * args.train_steps / (ms * 1e-3),
                     "ms_per_step_all_repeats": [t / args.train_steps for t in times]})  # fmt: skip
        r = rows[-1]
        print(f"  {name:<64} {r['ms_per_step']:9.3f} ms/step {r['samples_per_s']:14,.0f} samples/s", flush=True)
        del runner
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    diff = abs(first["neo_train"] - first["plain"])
    if not diff < 1e-3:
        print(f"  WARNING: first-step losses differ by {diff:.3g} (neo_train {first['neo_train']:.6f}, plain "
              f"{first['plain']:.6f}): the two models are not the same", flush=True)  # fmt: skip
    return {
        "config": cfg.name, "row_scale": args.train_row_scale, "batch": B, "tables": len(cfg.model.tables),
        "embedding_params": cfg.model.num_embedding_params, "sparse_optimizer": cfg.train.sparse_optimizer,
        "dense_optimizer": cfg.train.dense_optimizer, "first_loss": first, "first_loss_abs_diff": diff,
        "rows": rows, "speedup": rows[1]["ms_per_step"] / rows[0]["ms_per_step"],
    }  # fmt: skip


# ---- report ------------------------------------------------------------------------------------
def goal_rows(tbe: dict[str, Any], training: dict[str, Any], smoke: bool) -> list[dict[str, Any]]:
    fused = tbe["rows"][0]
    out = [
        {"goal": "TBE forward, fraction of copy bandwidth", "unit": "fraction", "target": GOALS["fwd_frac"],
         "value": fused["fwd_frac"]},
        {"goal": "TBE backward + row-wise AdaGrad, fraction of copy bandwidth", "unit": "fraction",
         "target": GOALS["bwd_frac"], "value": fused["bwd_frac"]},
        {"goal": "training samples/s, neo_train / plain PyTorch", "unit": "ratio", "target": GOALS["train_speedup"],
         "value": training["speedup"]},
    ]  # fmt: skip
    for g in out:
        g["pass"] = None if smoke else bool(g["value"] >= g["target"])
    return out


def print_goals(goals: list[dict[str, Any]], smoke: bool) -> None:
    print("\n" + ("SMOKE RUN (CPU, reference backend, toy sizes): goals not evaluated" if smoke else "goals"))
    print(f"{'goal':<62} {'target':>8} {'measured':>9}  result")
    for g in goals:
        fmt = (lambda x: f"{100 * x:.1f}%") if g["unit"] == "fraction" else (lambda x: f"{x:.2f}x")
        res = "n/a" if g["pass"] is None else ("PASS" if g["pass"] else "FAIL")
        print(f"{g['goal']:<62} {'>= ' + fmt(g['target']):>8} {fmt(g['value']):>9}  {res}")


def write_png(path: str, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    smoke = report["smoke"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    rows = report["tbe"]["rows"]
    names = [r["impl"].split(" (")[0] for r in rows]
    x = range(len(rows))
    ax1.bar([i - 0.2 for i in x], [100 * r["fwd_frac"] for r in rows], 0.4, label="forward")
    ax1.bar([i + 0.2 for i in x], [100 * r["bwd_frac"] for r in rows], 0.4, label="backward + row-wise AdaGrad")
    ax1.axhline(100 * GOALS["fwd_frac"], color="C0", ls="--", lw=1, label=f"forward goal {GOALS['fwd_frac']:.0%}")
    ax1.axhline(100 * GOALS["bwd_frac"], color="C1", ls="--", lw=1, label=f"backward goal {GOALS['bwd_frac']:.0%}")
    ax1.set_xticks(list(x), names)
    ax1.set_ylabel(f"% of copy bandwidth ({report['copy_gbs']:.0f} GB/s)")
    w = report["tbe"]["workload"]
    ax1.set_title(f"TBE, {w['name']}: T={len(w['dims'])}, B={w['batch']:,}, L={w['pooling']}, rows={w['rows']:,}")
    ax1.legend(fontsize=8)
    tr = report["training"]
    ax2.bar([r["key"] for r in tr["rows"]], [r["samples_per_s"] for r in tr["rows"]], color=["C2", "C7"])
    ax2.set_ylabel("samples/s")
    ax2.set_title(f"DLRM training, {tr['config']} (B={tr['batch']:,}): {tr['speedup']:.2f}x "
                  f"(goal {GOALS['train_speedup']:.0f}x)")  # fmt: skip
    where = report["machine"].get("gpu") or report["machine"].get("cpu", "?")
    fig.suptitle(("SMOKE RUN (CPU, reference backend, toy sizes) - not a measurement - " if smoke else "") + where)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine(device: torch.device) -> dict[str, Any]:
    from neo_train.testing import cpu_model

    info: dict[str, Any] = eg.machine_info() if device.type == "cuda" else {
        "torch": torch.__version__, "python": platform.python_version()}  # fmt: skip
    info["cpu"] = cpu_model()
    return info


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a smoke run (reference backend, use with --quick), for CI")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute on a GPU)")
    p.add_argument("--json", default=None, help="write every number and the machine info here")
    p.add_argument("--png", default=None, help="write the two charts here")
    p.add_argument("--rows", type=int, default=None, help="TBE rows per table (default 1M; --quick 20k)")
    p.add_argument("--batch", type=int, default=None, help="TBE batch B (default 65,536; --quick 4096)")
    p.add_argument("--alpha", default="0,1.1",
                   help="power-law exponents of the TBE ids, comma-separated; the first is the one the goals "
                        "are read at (0: uniform ids, where one row read per id is the real traffic)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=None, help="timed TBE calls (default 20; --quick 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed TBE calls first (the first compiles)")
    p.add_argument("--train-preset", default="criteo_kaggle")
    p.add_argument("--train-row-scale", type=float, default=None, help="default 1.0; --quick 0.01; CPU 0.001")
    p.add_argument("--train-batch", type=int, default=None, help="default: the preset's (CPU smoke: 256)")
    p.add_argument("--train-steps", type=int, default=None, help="steps per timed repeat (default 50; --quick 10)")
    p.add_argument("--train-warmup", type=int, default=None, help="untimed steps first (default 10; --quick 3)")
    p.add_argument("--repeats-train", type=int, default=None, help="timed repeats (default 5; --quick 3)")
    p.add_argument("--train-batches", type=int, default=8, help="distinct pre-generated batches, cycled")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    smoke = device.type == "cpu"
    if not smoke and not torch.cuda.is_available():
        print("gpu_suite.py needs a CUDA GPU; nothing measured. (`--device cpu --quick` is a smoke run of "
              "the script on the CPU, for CI.)")  # fmt: skip
        return 0
    q = args.quick or smoke

    def pick(value: Any, full: Any, quick: Any, cpu: Any) -> Any:
        return value if value is not None else (cpu if smoke else quick if q else full)

    args.rows = pick(args.rows, 1_000_000, 20_000, 5_000)
    args.batch = pick(args.batch, None, 4096, 256)
    args.repeats = pick(args.repeats, 20, 5, 2)
    args.train_row_scale = pick(args.train_row_scale, 1.0, 0.01, 0.001)
    args.train_batch = pick(args.train_batch, None, None, 256)
    args.train_steps = pick(args.train_steps, 50, 10, 3)
    args.train_warmup = pick(args.train_warmup, 10, 3, 2)
    args.repeats_train = pick(args.repeats_train, 5, 3, 2)
    if smoke:
        args.warmup = min(args.warmup, 1)
        eg._DEV = device  # embedding_gpu's impls allocate on its module device
        torch.set_num_threads(1)  # CI machines are small and shared: oversubscribed OpenMP crawls
    info = machine(device)
    label = "SMOKE RUN on the CPU (reference backend, toy sizes; numbers measure nothing)" if smoke else info.get("gpu")
    print(f"# gpu_suite: {label}; torch {torch.__version__}", flush=True)

    copy_gbs = cpu_copy_bandwidth_gbs() if smoke else eg.copy_bandwidth_gbs(1.0 if q else 2.0)
    print(f"# 1. copy bandwidth {copy_gbs:.1f} GB/s (read + write)", flush=True)

    (w,) = eg.make_workloads(["modelA-tw128"], args.rows)
    if args.batch:
        w = dataclasses.replace(w, batch=args.batch)
    print(f"# 2. TBE {w.name}: T={len(w.dims)} dims={list(w.dims)} B={w.batch} L={w.pooling} rows={w.rows}, {KIND}",
          flush=True)  # fmt: skip
    alphas = [float(a) for a in str(args.alpha).split(",") if a.strip()]
    tbe_runs = []
    for alpha in alphas:
        print(f"  ids: {'uniform' if alpha == 0 else f'power law, alpha {alpha}'}", flush=True)
        tbe_runs.append(tbe_part(w, args, device, copy_gbs, alpha))
    tbe = tbe_runs[0]

    print(f"# 3. training {args.train_preset} x{args.train_row_scale} rows", flush=True)
    training = training_part(args, device)

    goals = goal_rows(tbe, training, smoke)
    print_goals(goals, smoke)
    report = {
        "suite": "gpu_suite", "smoke": smoke, "device": str(device), "machine": info, "argv": sys.argv,
        "args": vars(args), "goals_targets": GOALS, "copy_gbs": copy_gbs, "tbe": tbe, "tbe_runs": tbe_runs,
        "training": training,
        "goals": goals, "all_goals_pass": None if smoke else all(g["pass"] for g in goals),
    }  # fmt: skip
    write_outputs(report, args.json, args.png, write_png, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
