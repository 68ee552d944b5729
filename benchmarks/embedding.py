"""Fused embedding backends vs per-table torch.nn.EmbeddingBag: forward and training-step time.

    python benchmarks/embedding.py                       # both default configs, every backend
    python benchmarks/embedding.py --quick --json out.json --png out.png
    python benchmarks/embedding.py --configs dlrm26 --backends fbgemm --repeats 10

Configs (ids uniform over each table's rows; every table pooled by sum over L ids per bag):
    dlrm26     T=26 tables, rows=100_000, D=64, B=2048, L=20
    modelA100  T=100 tables, rows=100_000 (--rows), dims a fixed list of multiples of 4 in
               4..384 with mean 92.6 (a Model-A-shaped slice), B=512, L=15

Each backend runs the sparse optimizer ``--optimizer`` (default rowwise_adagrad, fbgemm's
EXACT_ROWWISE_ADAGRAD). With rowwise_adagrad the default list adds ``fbgemm:jit``: fbgemm with its
JIT CPU update path, which neo_train's fbgemm backend routes around by default (``generic``; see
neo_train/kernels/fbgemm_backend.py); ``--backends fbgemm,fbgemm:jit`` compares the two alone.
The baseline is per-table ``nn.EmbeddingBag(sparse=True)`` + a torch optimizer on sparse
gradients; torch has no row-wise Adagrad, so for rowwise_adagrad (and adagrad) the baseline runs
``torch.optim.Adagrad`` (element-wise state, D times the state traffic), for sgd
``torch.optim.SGD``. The table's "impl" column says which ran.

Bytes moved (a lower bound: compulsory traffic, every byte counted once; caches ignored):
    forward   = N*8                       ids (int64)
              + (F*B+1)*8                 offsets
              + sum_i D(i)*4              one float32 weight row read per id
              + B*sum_f D_f*4             pooled output written
    step      = forward
              + B*sum_f D_f*4             output gradient read
              + N*8                       ids read again
              + sum_t U_t*D_t*4*2         touched (unique) rows: weights read + written
              + state_t*2                 their optimizer state read + written, per table:
                                          rowwise_adagrad U_t*4, adagrad U_t*D_t*4, sgd 0
GB/s = bytes / median time. "% copy" compares it with a large tensor copy measured in the same
run (bytes read + written per second), the practical memory-bandwidth ceiling of this machine.
Times are medians over --repeats iterations after --warmup iterations, cycling 3 batches.

The chart (``--png``, drawn from the JSON report alone): GB/s of forward and of the training step
per config, a bar per implementation (the torch baseline grey, hatched), each labelled with its
median ms; the right axis gives the % of the copy bandwidth.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from neo_train.kernels import SparseOptimizerSpec, TableSpec, available_backends, create_embedding_bag
from neo_train.kernels.init import init_table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # report_io, when imported as a module
from report_io import write_outputs  # noqa: E402  (benchmarks/ is on the path: run as a script)

__all__ = ["Config", "main", "write_png"]

# Model-A-shaped dims: 100 multiples of 4 in 4..384, mean 92.56 (counts per dim fixed here, order
# shuffled with a fixed seed so neighbouring tables differ).
_MODEL_A_DIM_COUNTS: dict[int, int] = {4: 10, 8: 10, 16: 15, 32: 16, 64: 15, 128: 15, 256: 14, 384: 5}


@dataclass(frozen=True)
class Config:
    name: str
    rows: tuple[int, ...]  # (T,)
    dims: tuple[int, ...]  # (T,)
    batch: int  # B
    pooling: int  # L, ids per bag

    @property
    def tables(self) -> list[TableSpec]:
        return [TableSpec(r, d, "sum", f"t{i}") for i, (r, d) in enumerate(zip(self.rows, self.dims))]


def _model_a_dims() -> tuple[int, ...]:
    dims = [d for d, n in _MODEL_A_DIM_COUNTS.items() for _ in range(n)]
    perm = torch.randperm(len(dims), generator=torch.Generator().manual_seed(0)).tolist()
    return tuple(dims[i] for i in perm)


def make_configs(names: Sequence[str], rows: int, quick: bool) -> list[Config]:
    if quick:
        table = {
            "dlrm26": Config("dlrm26-quick", (1000,) * 4, (16,) * 4, 64, 4),
            "modelA100": Config("modelA100-quick", (500,) * 6, (4, 8, 16, 32, 64, 128), 32, 3),
        }
    else:
        table = {
            "dlrm26": Config("dlrm26", (rows,) * 26, (64,) * 26, 2048, 20),
            "modelA100": Config("modelA100", (rows,) * 100, _model_a_dims(), 512, 15),
        }
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown config(s) {unknown}; choose from {sorted(table)}")
    return [table[n] for n in names]


# ---- inputs and bytes ----------------------------------------------------------------------
@dataclass
class Batch:
    values: torch.Tensor  # (N,) int64, feature-major
    offsets: torch.Tensor  # (F*B+1,) int64
    grad_out: torch.Tensor  # (B, sum D) float32
    unique_rows: list[int]  # (T,) touched rows per table


def make_batch(cfg: Config, gen: torch.Generator) -> Batch:
    T, B, L = len(cfg.rows), cfg.batch, cfg.pooling
    per_table = [torch.randint(0, r, (B * L,), generator=gen) for r in cfg.rows]
    values = torch.cat(per_table)
    offsets = torch.arange(0, T * B * L + 1, L, dtype=torch.int64)
    grad_out = torch.randn(B, sum(cfg.dims), generator=gen)
    return Batch(values, offsets, grad_out, [int(torch.unique(v).numel()) for v in per_table])


def bytes_moved(cfg: Config, batch: Batch, state: str) -> tuple[int, int]:
    """(forward bytes, training-step bytes) for one batch; see the module docstring."""
    B, L = cfg.batch, cfg.pooling
    N = batch.values.numel()
    out_bytes = B * sum(cfg.dims) * 4
    fwd = N * 8 + batch.offsets.numel() * 8 + sum(B * L * d * 4 for d in cfg.dims) + out_bytes
    rows_rw = sum(u * d * 4 * 2 for u, d in zip(batch.unique_rows, cfg.dims))
    state_per_row = {"rowwise": lambda d: 4, "elementwise": lambda d: d * 4, "none": lambda d: 0}[state]
    state_rw = sum(u * state_per_row(d) * 2 for u, d in zip(batch.unique_rows, cfg.dims))
    return fwd, fwd + out_bytes + N * 8 + rows_rw + state_rw


# ---- implementations -----------------------------------------------------------------------
@dataclass
class Impl:
    name: str
    state: str  # "rowwise" | "elementwise" | "none": optimizer state traffic per touched row
    forward: Callable[[Batch], torch.Tensor]
    train_step: Callable[[Batch], None]


def backend_impl(backend: str, cfg: Config, opt: SparseOptimizerSpec) -> Impl:
    """``backend`` is a backend name, or ``fbgemm:jit`` / ``fbgemm:generic``: fbgemm with that CPU
    update path (``FbgemmEmbeddingBag``'s cpu_update; plain ``fbgemm`` is its default, generic)."""
    name, _, cpu_update = backend.partition(":")
    m = create_embedding_bag(name, cfg.tables, opt, seed=0, **({"cpu_update": cpu_update} if cpu_update else {}))

    def forward(b: Batch) -> torch.Tensor:
        with torch.no_grad():
            return m(b.values, b.offsets)

    def train_step(b: Batch) -> None:
        m(b.values, b.offsets).backward(b.grad_out)

    state = {"rowwise_adagrad": "rowwise", "adagrad": "elementwise", "sgd": "none"}[opt.kind]
    return Impl(f"{backend} ({opt.kind})", state, forward, train_step)


def baseline_impl(cfg: Config, opt: SparseOptimizerSpec) -> Impl:
    bags = nn.ModuleList(
        nn.EmbeddingBag(r, d, mode="sum", sparse=True, _weight=init_table(0, t, r, d))
        for t, (r, d) in enumerate(zip(cfg.rows, cfg.dims))
    )
    if opt.kind == "sgd":
        torch_opt: torch.optim.Optimizer = torch.optim.SGD(bags.parameters(), lr=opt.lr)
        name, state = "torch EmbeddingBag + SGD (sparse)", "none"
    else:  # no row-wise Adagrad in torch: element-wise Adagrad is the nearest sparse optimizer
        torch_opt = torch.optim.Adagrad(bags.parameters(), lr=opt.lr, eps=opt.eps)
        name, state = "torch EmbeddingBag + Adagrad (sparse, element-wise)", "elementwise"
    # torch.optim.Adagrad rebuilds sparse tensors and warns about skipped invariant checks.
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    B = cfg.batch

    def pooled(b: Batch) -> torch.Tensor:
        n = B * cfg.pooling  # ids per table (fixed L)
        return torch.cat(
            [bag(b.values[t * n : (t + 1) * n], b.offsets[t * B : (t + 1) * B] - t * n) for t, bag in enumerate(bags)],
            dim=1,
        )

    def forward(b: Batch) -> torch.Tensor:
        with torch.no_grad():
            return pooled(b)

    def train_step(b: Batch) -> None:
        torch_opt.zero_grad(set_to_none=True)
        pooled(b).backward(b.grad_out)
        torch_opt.step()

    return Impl(name, state, forward, train_step)


# ---- measurement ---------------------------------------------------------------------------
def time_ms(fn: Callable[[Batch], object], batches: list[Batch], warmup: int, repeats: int) -> tuple[float, float]:
    """(median, min) milliseconds; the min is kept in the JSON for runs on a shared machine."""
    for i in range(warmup):
        fn(batches[i % len(batches)])
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(batches[i % len(batches)])
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def copy_bandwidth_gbs(mbytes: int = 256, repeats: int = 5) -> float:
    """Bytes read + written per second by a large float32 tensor copy (the practical ceiling)."""
    src = torch.ones(mbytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / min(times) / 1e9


def machine_info() -> dict[str, object]:
    from neo_train.testing import cpu_model

    cpu = cpu_model()
    info: dict[str, object] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "backends": available_backends(),
        # Other processes on a small machine skew every number: keep the load next to them.
        "loadavg_1m_at_start": os.getloadavg()[0],
    }
    if "fbgemm" in available_backends():
        import fbgemm_gpu

        info["fbgemm_gpu"] = getattr(fbgemm_gpu, "__version__", "unknown")
    return info


def run_config(cfg: Config, impls: list[str], opt: SparseOptimizerSpec, args: argparse.Namespace) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    batches = [make_batch(cfg, gen) for _ in range(3)]
    rows = []
    for which in impls:
        impl = baseline_impl(cfg, opt) if which == "baseline" else backend_impl(which, cfg, opt)
        fwd_ms, fwd_min = time_ms(impl.forward, batches, args.warmup, args.repeats)
        step_ms, step_min = time_ms(impl.train_step, batches, args.warmup, args.repeats)
        fwd_b, step_b = bytes_moved(cfg, batches[0], impl.state)
        rows.append(
            {
                "config": cfg.name,
                "impl": impl.name,
                "fwd_ms": fwd_ms,
                "step_ms": step_ms,
                "fwd_ms_min": fwd_min,
                "step_ms_min": step_min,
                "fwd_bytes": fwd_b,
                "step_bytes": step_b,
                "fwd_gbs": fwd_b / fwd_ms / 1e6,
                "step_gbs": step_b / step_ms / 1e6,
            }
        )
        del impl
        gc.collect()  # a modelA100 copy of the tables is ~3.7 GB: free it before the next
    base = next((r for r in rows if r["impl"].startswith("torch")), None)
    for r in rows:
        r["fwd_speedup"] = base["fwd_ms"] / r["fwd_ms"] if base else None
        r["step_speedup"] = base["step_ms"] / r["step_ms"] if base else None
    return rows


def print_table(rows: list[dict], copy_gbs: float) -> None:
    head = (
        f"{'config':<16} {'impl':<52} {'fwd ms':>8} {'fwd+bwd+opt ms':>15} {'fwd MB':>8} {'step MB':>8} "
        f"{'fwd GB/s':>9} {'step GB/s':>9} {'% copy':>7} {'fwd x':>6} {'step x':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        sx = f"{r['step_speedup']:.2f}" if r["step_speedup"] else "-"
        fx = f"{r['fwd_speedup']:.2f}" if r["fwd_speedup"] else "-"
        print(
            f"{r['config']:<16} {r['impl']:<52} {r['fwd_ms']:>8.2f} {r['step_ms']:>15.2f} "
            f"{r['fwd_bytes'] / 1e6:>8.1f} {r['step_bytes'] / 1e6:>8.1f} {r['fwd_gbs']:>9.2f} "
            f"{r['step_gbs']:>9.2f} {100 * r['step_gbs'] / copy_gbs:>6.1f}% {fx:>6} {sx:>6}"
        )


def _gbs(r: dict[str, Any], k: str) -> float | None:
    """Row ``r``'s GB/s for ``k`` in ("fwd", "step"); None where a time or byte count is missing or zero."""
    if r.get(f"{k}_gbs"):
        return r[f"{k}_gbs"]
    ms, b = r.get(f"{k}_ms"), r.get(f"{k}_bytes")
    return b / ms / 1e6 if ms and b else None


def _shape_text(c: dict[str, Any] | None) -> str:
    """A second tick-label line from the report's ``asdict(Config)``: T, B, L and the mean D."""
    if not c:
        return ""
    return f"\nT={len(c['rows'])} B={c['batch']} L={c['pooling']} mean D={sum(c['dims']) / len(c['dims']):.0f}"


def write_png(path: str, report: dict[str, Any]) -> None:
    """Grouped bars: GB/s of forward and of the training step, a group per config, a bar per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    impls = sorted(dict.fromkeys(r["impl"] for r in rows), key=lambda i: not i.startswith("torch"))  # baseline first
    shapes = {c["name"]: c for c in report.get("configs", [])}
    m = report.get("machine", {})
    copy_gbs = m.get("copy_gbs") or 0.0
    backends = [i for i in impls if not i.startswith("torch")]
    base_style = {"color": "0.6", "hatch": "//", "edgecolor": "k", "lw": 0.8}  # the torch baseline: grey, hatched
    width = min(0.8 / len(impls), 0.3)
    fig, axes = plt.subplots(1, 2, figsize=(max(12.0, 1.2 * len(configs) * len(impls) + 6), 5.2))
    panels = (("fwd", "forward"), ("step", "training step: forward + backward + optimizer\n(bytes include each "
                                           "implementation's own optimizer state)"))  # fmt: skip
    for ax, (k, title) in zip(axes, panels):
        top = max((_gbs(r, k) or 0.0 for r in rows), default=0.0) or 1.0
        for i, impl in enumerate(impls):
            style = {"color": f"C{backends.index(impl)}"} if impl in backends else base_style
            for ci, c in enumerate(configs):
                x = ci + (i - (len(impls) - 1) / 2) * width
                r = next((r for r in rows if r["config"] == c and r["impl"] == impl), None)
                v = _gbs(r, k) if r else None
                ax.bar(x, v or 0.0, width, label=impl if ci == 0 else None, **style)
                ms = r.get(f"{k}_ms") if r else None  # the median time: both numbers on the chart
                text = "n/a" if not v else f"{ms:.3g} ms" if ms else ""
                ax.text(x, (v or 0.0) + 0.01 * top, text, ha="center", va="bottom", rotation=90, fontsize=7)
        ax.set_xticks(range(len(configs)), [c + _shape_text(shapes.get(c)) for c in configs], fontsize=8)
        ax.set_xlim(-0.5, len(configs) - 0.5)
        ax.set_ylim(0, top * 1.3)
        ax.set_ylabel(f"{'forward' if k == 'fwd' else 'step'} GB/s (compulsory bytes / median time)")
        ax.set_title(title, fontsize=10)
        if copy_gbs > 0:
            sec = ax.secondary_yaxis("right", functions=(lambda g: 100 * g / copy_gbs, lambda p: p * copy_gbs / 100))
            sec.set_ylabel(f"% of copy bandwidth ({copy_gbs:.1f} GB/s)", fontsize=8)
    handles, names = axes[0].get_legend_handles_labels()
    ncol = min(len(impls), 3)
    fig.legend(handles, names, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    opt = (report.get("args") or {}).get("optimizer")
    where = (f"{m['cpu']}, {m['cpu_count']} CPUs, torch {m['torch']} ({m['torch_threads']} threads), load average "
             f"{m['loadavg_1m_at_start']:.2f} at start" if m else "machine not recorded")  # fmt: skip
    fig.suptitle(("SMOKE RUN (--quick, toy sizes) - not a measurement\n" if report.get("quick") else "")
                 + "embedding backends vs torch EmbeddingBag on CPU" + (f", optimizer {opt}" if opt else "")
                 + f": {where}", fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.03 + 0.045 * -(-len(impls) // ncol), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="dlrm26,modelA100", help="comma list: dlrm26, modelA100")
    p.add_argument("--backends", default=None, help="comma list of backends (default: all available)")
    p.add_argument("--no-baseline", action="store_true", help="skip the torch EmbeddingBag baseline")
    p.add_argument("--optimizer", default="rowwise_adagrad", choices=["sgd", "adagrad", "rowwise_adagrad"])
    p.add_argument("--rows", type=int, default=100_000, help="rows per table")
    p.add_argument("--repeats", type=int, default=None, help="timed iterations (default 5; 2 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="untimed iterations first (default 2; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    p.add_argument("--json", default=None, help="write every number and the machine info here")
    p.add_argument("--png", default=None, help="write the chart here: fwd and step GB/s per config and implementation")
    args = p.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)

    backends = available_backends() if args.backends is None else args.backends.split(",")
    if args.backends is None and "fbgemm" in backends and args.optimizer == "rowwise_adagrad":
        backends.append("fbgemm:jit")  # fbgemm's own CPU fast path, against our default (generic)
    missing = [b for b in backends if b.partition(":")[0] not in available_backends()]
    if missing:
        raise SystemExit(f"backend(s) {missing} unavailable here; available: {available_backends()}")
    impls = ([] if args.no_baseline else ["baseline"]) + backends
    opt = SparseOptimizerSpec(args.optimizer, lr=0.01)
    info = machine_info()
    copy_gbs = copy_bandwidth_gbs(16 if args.quick else 256)
    info["copy_gbs"] = copy_gbs
    print(f"# {info['cpu']}, {info['cpu_count']} CPUs, torch {info['torch']} ({info['torch_threads']} threads), "
          f"copy bandwidth {copy_gbs:.1f} GB/s, load average {info['loadavg_1m_at_start']:.2f}")  # fmt: skip
    rows = []
    configs = make_configs(args.configs.split(","), args.rows, args.quick)
    for cfg in configs:
        t0 = time.perf_counter()
        rows += run_config(cfg, impls, opt, args)
        print(f"# {cfg.name}: T={len(cfg.rows)} B={cfg.batch} L={cfg.pooling} rows={cfg.rows[0]} "
              f"mean D={sum(cfg.dims) / len(cfg.dims):.1f} ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    print_table(rows, copy_gbs)
    report = {"benchmark": "embedding", "quick": args.quick, "machine": info, "args": vars(args), "argv": sys.argv,
              "rows": rows, "configs": [asdict(c) for c in configs]}  # fmt: skip
    write_outputs(report, args.json, args.png, write_png, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
