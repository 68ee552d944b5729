"""GPU benchmark of the triton fused embedding backend: time, bytes moved, fraction of the measured
copy bandwidth, and speed-up over per-table ``nn.EmbeddingBag(sparse=True)`` + a sparse optimizer.

    python benchmarks/embedding_gpu.py                          # every config, --json optional
    python benchmarks/embedding_gpu.py --configs modelA-tw128 --rows 2000000 --json gpu.json
    python benchmarks/embedding_gpu.py --optimizer adam --weight-dtype fp16 --no-baseline

Needs CUDA (on a CPU-only machine it says so and exits 0). Issue 6's goals, checked in the JSON:
forward >= 80 % of copy bandwidth, backward+optimizer >= 40 %, >= 15x the per-table baseline at
>= 100 tables.

Configs (ids power-law, P(rank k) ~ k^-alpha scrambled over the rows, alpha = --alpha, default 1.1
like DataConfig; every bag holds exactly L ids):
    modelA-tw128  Model-A sharded table-wise over 128 GPUs, one GPU's share: 8 tables (GPU g of a
                  round-robin assignment of the model_a preset's 1000 tables, g chosen so the mean
                  dim is nearest the model's, ~96), each looked up for the GLOBAL batch
                  B = 65,536 (table-wise: every sample's ids of a table go to its GPU), L = 15,
                  rows 1M per table
    uniform64     T = 64, D = 128, L = 20, B = 2048, rows 100k per table
    modelA-128t   T = 128 tables with Model-A dims (preset tables 0, 7, 14, ...), L = 15, B = 4096,
                  rows 100k per table: the ">= 100 tables" case for the baseline speed-up

Bytes moved per call (compulsory traffic: each byte once, caches ignored; w = bytes per weight,
i = 8 bytes per id, N_t = B*L ids of table t, U_t its distinct rows in the batch):
    forward   = sum_t N_t*D_t*w                 one weight row read per id
              + N*i + (F*B+1)*8                 ids and offsets
              + B*sum_t D_t*4                   pooled float32 output written
    backward  = B*sum_t D_t*4                   output gradient read
              + N*i + (F*B+1)*8                 ids and offsets read again
              + sum_t U_t*D_t*w*2               touched rows read + written
              + state_t*2                       their state read + written: rowwise_adagrad U_t*4,
                                                adagrad U_t*D_t*4, adam U_t*D_t*8, sgd 0
The backward's sort / segment scratch is not counted: it is overhead, not required traffic.
FLOPs are irrelevant: ~2 per weight element read (a multiply-add), ~0.25 FLOP/byte, two orders of
magnitude under any GPU's ridge point, so memory bandwidth is the roofline.

% copy = (bytes / time) / copy bandwidth, the latter measured in the same run as a 2 GiB
device-to-device copy (bytes read + written per second, best of 10). Times: median over
--repeats CUDA-event-timed calls after --warmup untimed ones; "backward" times ``out.backward``
(sort, segments, the fused update) with its forward outside the timed region.

The baseline: torch has no row-wise AdaGrad, so for rowwise_adagrad / adagrad it runs
torch.optim.Adagrad on the sparse gradients (element-wise state: D times the state traffic of
the rowwise kernel; its bytes are counted with its own state), for adam torch.optim.SparseAdam,
for sgd torch.optim.SGD. "backward" for it is ``out.backward`` + ``optimizer.step``.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import warnings
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["Workload", "main"]

GOALS = {"fwd_frac": 0.80, "bwd_frac": 0.40, "speedup_at_100_tables": 15.0}
_DEV = torch.device("cuda")  # a module global only so that a CPU smoke test (interpreter) can swap it


@dataclass(frozen=True)
class Workload:
    name: str
    dims: tuple[int, ...]  # (T,)
    rows: int  # per table
    batch: int  # B
    pooling: int  # L


def model_a_dims() -> np.ndarray:
    from neo_train.config import preset

    return np.array([t.dim for t in preset("model_a").model.tables])


def make_workloads(names: Sequence[str], rows: int | None) -> list[Workload]:
    d = model_a_dims()
    gpu = min(range(128), key=lambda g: abs(d[g::128].mean() - d.mean()))  # a representative GPU
    table = {
        "modelA-tw128": Workload("modelA-tw128", tuple(int(x) for x in d[gpu::128]), rows or 1_000_000, 65_536, 15),
        "uniform64": Workload("uniform64", (128,) * 64, rows or 100_000, 2048, 20),
        "modelA-128t": Workload("modelA-128t", tuple(int(x) for x in d[::7][:128]), rows or 100_000, 4096, 15),
    }
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown config(s) {unknown}; choose from {sorted(table)}")
    return [table[n] for n in names]


# ---- inputs and bytes ----------------------------------------------------------------------
@dataclass
class Batch:
    values: torch.Tensor  # (N,) int64 feature-major
    offsets: torch.Tensor  # (T*B+1,) int64
    grad_out: torch.Tensor  # (B, sum D) float32
    unique_rows: list[int]  # (T,)


def make_batch(w: Workload, seed: int, alpha: float, device: torch.device) -> Batch:
    from neo_train.data.synthetic import power_law_ids

    rng = np.random.default_rng(seed)
    n = w.batch * w.pooling
    per_table = [torch.from_numpy(power_law_ids(rng, n, w.rows, alpha, salt=t * 7919 + 13)) for t in range(len(w.dims))]
    values = torch.cat(per_table).to(device)
    offsets = torch.arange(0, len(w.dims) * n + 1, w.pooling, dtype=torch.int64, device=device)
    grad_out = torch.randn(w.batch, sum(w.dims), device=device, generator=torch.Generator(device).manual_seed(seed))
    return Batch(values, offsets, grad_out, [int(torch.unique(v).numel()) for v in per_table])


def bytes_moved(w: Workload, b: Batch, weight_bytes: int, state: str) -> tuple[int, int]:
    """(forward, backward) bytes; see the module docstring."""
    n = w.batch * w.pooling
    io = b.values.numel() * 8 + b.offsets.numel() * 8
    out = w.batch * sum(w.dims) * 4
    fwd = sum(n * d * weight_bytes for d in w.dims) + io + out
    state_row = {"rowwise": lambda d: 4, "elementwise": lambda d: d * 4, "adam": lambda d: d * 8, "none": lambda d: 0}
    rows = sum(u * (d * weight_bytes + state_row[state](d)) * 2 for u, d in zip(b.unique_rows, w.dims))
    return fwd, out + io + rows


# ---- implementations -----------------------------------------------------------------------
@dataclass
class Impl:
    name: str
    state: str  # state traffic per touched row: "rowwise" | "elementwise" | "adam" | "none"
    weight_bytes: int
    forward: Callable[[Batch], torch.Tensor]  # under no_grad
    train_forward: Callable[[Batch], torch.Tensor]  # builds the graph
    backward: Callable[[torch.Tensor, Batch], None]  # backward + optimizer


def triton_impl(w: Workload, kind: str, weight_dtype: torch.dtype) -> Impl:
    from neo_train.kernels import SparseOptimizerSpec, TableSpec
    from neo_train.kernels.triton_backend import TritonEmbeddingBag

    m = TritonEmbeddingBag([TableSpec(w.rows, d) for d in w.dims], SparseOptimizerSpec(kind, lr=0.01),
                           device=_DEV, weight_dtype=weight_dtype, seed=0)  # fmt: skip
    m.check_ids = False  # id validation is a host sync + a pass over the ids: not the kernel's cost

    def forward(b: Batch) -> torch.Tensor:
        with torch.no_grad():
            return m(b.values, b.offsets)

    state = {"rowwise_adagrad": "rowwise", "adagrad": "elementwise", "adam": "adam", "sgd": "none"}[kind]
    return Impl(f"triton ({kind}, {str(weight_dtype)[6:]})", state, weight_dtype.itemsize, forward,
                lambda b: m(b.values, b.offsets), lambda out, b: out.backward(b.grad_out))  # fmt: skip


def baseline_impl(w: Workload, kind: str) -> Impl:
    from neo_train.kernels.init import init_table

    bags = nn.ModuleList(
        nn.EmbeddingBag(w.rows, d, mode="sum", sparse=True, _weight=init_table(0, t, w.rows, d)).to(_DEV)
        for t, d in enumerate(w.dims)
    )
    if kind == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(bags.parameters(), lr=0.01)
        name, state = "torch EmbeddingBag + SGD (sparse)", "none"
    elif kind == "adam":
        opt = torch.optim.SparseAdam(list(bags.parameters()), lr=0.01)
        name, state = "torch EmbeddingBag + SparseAdam", "adam"
    else:
        opt = torch.optim.Adagrad(bags.parameters(), lr=0.01)
        name, state = "torch EmbeddingBag + Adagrad (sparse, element-wise)", "elementwise"
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    n = w.batch * w.pooling

    def pooled(b: Batch) -> torch.Tensor:
        return torch.cat(
            [bag(b.values[t * n : (t + 1) * n], b.offsets[t * w.batch : (t + 1) * w.batch] - t * n)
             for t, bag in enumerate(bags)], dim=1,
        )  # fmt: skip

    def forward(b: Batch) -> torch.Tensor:
        with torch.no_grad():
            return pooled(b)

    def backward(out: torch.Tensor, b: Batch) -> None:
        opt.zero_grad(set_to_none=True)
        out.backward(b.grad_out)
        opt.step()

    return Impl(name, state, 4, forward, pooled, backward)


# ---- measurement ---------------------------------------------------------------------------
def _median_ms(run: Callable[[int], tuple[torch.cuda.Event, torch.cuda.Event]], warmup: int, repeats: int) -> float:
    for i in range(warmup):
        run(i)
    events = [run(i) for i in range(repeats)]
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def time_forward(impl: Impl, batches: list[Batch], warmup: int, repeats: int) -> float:
    def run(i: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        b = batches[i % len(batches)]
        s.record()
        impl.forward(b)
        e.record()
        return s, e

    return _median_ms(run, warmup, repeats)


def time_backward(impl: Impl, batches: list[Batch], warmup: int, repeats: int) -> float:
    def run(i: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        b = batches[i % len(batches)]
        out = impl.train_forward(b)
        s.record()
        impl.backward(out, b)
        e.record()
        return s, e

    return _median_ms(run, warmup, repeats)


def copy_bandwidth_gbs(gib: float = 2.0, repeats: int = 10) -> float:
    """Bytes read + written per second by a large device-to-device copy (the practical ceiling)."""
    src = torch.empty(int(gib * 2**30) // 4, device=_DEV)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e))
    del src, dst
    return 2 * int(gib * 2**30) / (best * 1e-3) / 1e9


def machine_info() -> dict[str, object]:
    import triton

    p = torch.cuda.get_device_properties(0)
    return {"gpu": p.name, "gpu_memory_gib": round(p.total_memory / 2**30, 1), "sm_count": p.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "python": platform.python_version()}  # fmt: skip


def run_workload(w: Workload, args: argparse.Namespace, copy_gbs: float) -> list[dict]:
    batches = [make_batch(w, seed, args.alpha, _DEV) for seed in range(2)]
    weight_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.weight_dtype]
    makers = [("triton", lambda: triton_impl(w, args.optimizer, weight_dtype))]
    if not args.no_baseline:
        makers.append(("baseline", lambda: baseline_impl(w, args.optimizer)))
    rows, forwards = [], {}
    for which, make in makers:
        impl = make()
        forwards[which] = impl.forward(batches[0]).float()  # before any update: same init, same output
        fwd_ms = time_forward(impl, batches, args.warmup, args.repeats)
        bwd_ms = time_backward(impl, batches, args.warmup, args.repeats)
        fwd_b, bwd_b = bytes_moved(w, batches[0], impl.weight_bytes, impl.state)
        rows.append({
            "config": w.name, "impl": impl.name, "tables": len(w.dims), "batch": w.batch, "pooling": w.pooling,
            "rows": w.rows, "mean_dim": sum(w.dims) / len(w.dims), "unique_rows": batches[0].unique_rows,
            "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "fwd_bytes": fwd_b, "bwd_bytes": bwd_b,
            "fwd_gbs": fwd_b / fwd_ms / 1e6, "bwd_gbs": bwd_b / bwd_ms / 1e6,
            "fwd_frac": fwd_b / fwd_ms / 1e6 / copy_gbs, "bwd_frac": bwd_b / bwd_ms / 1e6 / copy_gbs,
        })  # fmt: skip
        del impl
        gc.collect()
        if _DEV.type == "cuda":
            torch.cuda.empty_cache()
    if "baseline" in forwards and weight_dtype == torch.float32:
        err = (forwards["triton"] - forwards["baseline"]).abs().max().item()
        assert err < 1e-4, f"{w.name}: triton forward differs from nn.EmbeddingBag by {err}"
        rows[0]["fwd_max_abs_diff_vs_baseline"] = err
    base = next((r for r in rows if r["impl"].startswith("torch")), None)
    for r in rows:
        r["fwd_speedup"] = base["fwd_ms"] / r["fwd_ms"] if base else None
        r["bwd_speedup"] = base["bwd_ms"] / r["bwd_ms"] if base else None
        r["step_speedup"] = (base["fwd_ms"] + base["bwd_ms"]) / (r["fwd_ms"] + r["bwd_ms"]) if base else None
    return rows


def print_table(rows: list[dict], copy_gbs: float) -> None:
    head = (f"{'config':<13} {'impl':<52} {'T':>4} {'fwd ms':>8} {'bwd ms':>8} {'fwd GB':>7} {'bwd GB':>7} "
            f"{'fwd GB/s':>9} {'bwd GB/s':>9} {'fwd %cp':>7} {'bwd %cp':>7} "
            f"{'fwd x':>6} {'bwd x':>6} {'step x':>6}")  # fmt: skip
    print(head)
    print("-" * len(head))
    fmt = lambda x: f"{x:.1f}" if x else "-"  # noqa: E731
    for r in rows:
        print(f"{r['config']:<13} {r['impl']:<52} {r['tables']:>4} {r['fwd_ms']:>8.3f} {r['bwd_ms']:>8.3f} "
              f"{r['fwd_bytes'] / 1e9:>7.3f} {r['bwd_bytes'] / 1e9:>7.3f} {r['fwd_gbs']:>9.0f} {r['bwd_gbs']:>9.0f} "
              f"{100 * r['fwd_frac']:>6.1f}% {100 * r['bwd_frac']:>6.1f}% {fmt(r['fwd_speedup']):>6} "
              f"{fmt(r['bwd_speedup']):>6} {fmt(r['step_speedup']):>6}")  # fmt: skip
    print(f"(copy bandwidth {copy_gbs:.0f} GB/s; goals: forward >= {GOALS['fwd_frac']:.0%}, backward >= "
          f"{GOALS['bwd_frac']:.0%} of it, >= {GOALS['speedup_at_100_tables']:.0f}x the baseline at >= 100 tables)")


def goals(rows: list[dict]) -> dict[str, object]:
    tri = [r for r in rows if r["impl"].startswith("triton")]
    many = [r for r in tri if r["tables"] >= 100 and r["step_speedup"]]
    return {
        "fwd_frac_min": min(r["fwd_frac"] for r in tri), "bwd_frac_min": min(r["bwd_frac"] for r in tri),
        "fwd_ok": all(r["fwd_frac"] >= GOALS["fwd_frac"] for r in tri),
        "bwd_ok": all(r["bwd_frac"] >= GOALS["bwd_frac"] for r in tri),
        "speedup_at_100_tables": [r["step_speedup"] for r in many],
        "speedup_ok": all(r["step_speedup"] >= GOALS["speedup_at_100_tables"] for r in many) if many else None,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="modelA-tw128,uniform64,modelA-128t")
    p.add_argument("--rows", type=int, default=None, help="rows per table for every config (default: per config)")
    p.add_argument("--optimizer", default="rowwise_adagrad", choices=["sgd", "adagrad", "rowwise_adagrad", "adam"])
    p.add_argument("--weight-dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--alpha", type=float, default=1.1, help="power-law exponent of the ids (0: uniform)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (the first compiles the kernels)")
    p.add_argument("--no-baseline", action="store_true", help="skip the per-table nn.EmbeddingBag baseline")
    p.add_argument("--json", default=None, help="write every number and the machine info here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("embedding_gpu.py needs a CUDA GPU (the triton kernels run on CPU only under the slow "
              "interpreter); nothing measured. Run benchmarks/embedding.py for the CPU backends.")  # fmt: skip
        return 0
    info = machine_info()
    copy_gbs = copy_bandwidth_gbs()
    info["copy_gbs"] = copy_gbs
    print(f"# {info['gpu']}, torch {info['torch']} (CUDA {info['cuda']}), triton {info['triton']}, "
          f"copy bandwidth {copy_gbs:.0f} GB/s (read + write)", flush=True)  # fmt: skip
    rows: list[dict] = []
    workloads = make_workloads(args.configs.split(","), args.rows)
    for w in workloads:
        print(f"# {w.name}: T={len(w.dims)} B={w.batch} L={w.pooling} rows={w.rows} "
              f"mean D={sum(w.dims) / len(w.dims):.1f} dims={list(w.dims)[:16]}{'...' if len(w.dims) > 16 else ''}",
              flush=True)  # fmt: skip
        rows += run_workload(w, args, copy_gbs)
    print_table(rows, copy_gbs)
    result = goals(rows)
    print(f"# goals: {result}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "args": vars(args), "argv": sys.argv, "goals": GOALS, "goal_check": result,
                       "workloads": [asdict(w) for w in workloads], "rows": rows}, f, indent=2)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
