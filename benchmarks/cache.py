"""The embedding row cache (kernels/cache.py): hit rate and step time vs cache size, and the SSD
tier's throughput (issue 12, item 7).

    python benchmarks/cache.py --json cache.json --png cache.png      # the default sweep (~3 min, 2 cores)
    python benchmarks/cache.py --quick --json c.json --png c.png      # a smoke run (seconds)
    python benchmarks/cache.py --backend fbgemm --zipf 1.05 --fractions 0.05,0.1 --storage-dir /nvme/tmp --big

Workload (flags change it): T=1 table of 200,000 rows, D=64, float32, sum pooling, B=512 bags of
mean L=20 ids (synthetic.py's bag lengths: 5 % empty, 1 + Poisson), ids from synthetic.py's
bounded power law P(k) ~ k^-alpha with alpha = --zipf. The sparse optimizer is the fused
rowwise_adagrad; a step is forward, an MSE loss against a fixed target, backward (the fused
update). Every configuration sees the same batch sequence for its zipf.

1. Hit rate. For each zipf x policy x cache fraction a fresh CachedEmbeddingBag (host store,
   cache_rows = ceil(fraction x rows), inner backend --backend) trains --warmup steps, then
   --steps measured ones. hit rate = d(hits) / d(unique_rows) of ``stats()`` over the measured
   steps: the fraction of a batch's unique rows already resident (per unique row, not per id).
   "ceiling" = 1 - the measured steps' compulsory share (unique rows no earlier batch of the run
   touched): no cache can beat it, and the 100 % cache must equal it. A cache smaller than one
   batch's unique rows is reported as "too small" (the kernel's ValueError).
2. Step time. Median host-clock time of a measured step, next to the resident inner kernel
   (same backend, every row resident, no cache) timed on the same batch right after each cached
   step, so both see the same machine load; ratio = median cached / median resident; cpu ratio
   = the same with the process's CPU seconds per step (every thread's; time spent waiting for a
   CPU is not counted, so it is steadier on a shared machine, but it counts the prefetch
   thread's work even where a free core would hide it). "prefetch"
   is a second fresh run in which, as in the training pipeline, ``kernel.prefetch(batch i+1)``
   runs on a worker thread between batch i's forward and backward and is waited for before
   batch i+1's forward (inside the timed step). Store traffic per step:
       store MB/step = (d bytes_read + d bytes_written) / steps,
       bytes per row = D x 4 (float32 weight) + 4 (rowwise_adagrad's one float32 state)
   (both counted by the kernel: misses read, dirty victims written back).
   Issue 12's goal: at a 10 % cache on Zipf 1.05 a step costs <= 1.3x the resident step on CPU.
   On a small shared machine pass --threads 1: with torch's default threads the CPU seconds
   count its idle workers' spinning, and the cpu ratio swings run to run (notes/cache.md).
3. SSD tier. An MmapStore of --ssd-rows rows (D as above) in --storage-dir (default: a temp dir
   under $TMPDIR), filled sequentially and flushed, then ``store.read`` / ``store.write`` of
   --ssd-batch random unique rows (sorted, as the cache passes them):
       row MB/s   = rows x bytes per row / seconds       (the bytes the cache asked for)
       dev rd/wr  = /proc/self/io read_bytes and write_bytes (pages dirtied, which writeback
                    must write) during the call; ampl. = (dev rd + dev wr) / row bytes
   A row (260 B) is far smaller than a 4 KiB page, and a weight row and its state sit in two
   files, so a random row costs at least two pages; a cold fault also reads the readahead
   window around it unless the mapping is advised MADV_RANDOM. Cold reads are measured with the
   store's own advice (read back from /proc/self/smaps) and again with the other one (normal
   readahead vs MADV_RANDOM), so the table shows what the advice buys. Reads "cold" follow a best-effort page-cache drop
   (madvise(MADV_DONTNEED) on the mappings, then posix_fadvise(DONTNEED) on the files: no root
   needed; `fincore` reports what stayed), "warm" re-read the same rows; writes go into the
   mapping, and with the flush (msync) that makes them durable. Next to them the disk's
   sequential speed: a file of --seq-mb MB written with fsync, read back cold (same drop) and
   warm. Cold reads may still be served by a virtual disk's host-side cache: the numbers are
   what this process saw, not the device's datasheet.
"""
from __future__ import annotations

import argparse
import gc
import math
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from neo_train.data.synthetic import bag_lengths, power_law_ids
from neo_train.kernels import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec, available_backends
from neo_train.kernels import create_embedding_bag
from neo_train.kernels.cache import CACHE_POLICIES, CachedEmbeddingBag, MmapStore
from neo_train.kernels.huge_pages import smaps_mappings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # embedding.py, when imported as a module
from embedding import machine_info  # noqa: E402
from report_io import write_outputs  # noqa: E402  (benchmarks/ is on the path: run as a script)

__all__ = ["Workload", "main"]

GOAL = {"zipf": 1.05, "fraction": 0.10, "max_ratio": 1.3}


@dataclass(frozen=True)
class Workload:
    rows: int  # per table
    dim: int  # D
    tables: int  # T, one feature each
    batch: int  # B
    pooling: float  # L, mean ids per bag

    @property
    def specs(self) -> list[TableSpec]:
        return [TableSpec(self.rows, self.dim, "sum", f"t{t}") for t in range(self.tables)]

    @property
    def row_bytes(self) -> int:
        return self.dim * 4 + 4  # float32 weight + rowwise_adagrad's one float32 state


@dataclass
class Batch:
    values: torch.Tensor  # (N,) int64, feature-major
    offsets: torch.Tensor  # (T*B+1,) int64
    unique: int  # unique rows, summed over tables
    unique_max: int  # the most unique rows of one table (what one table's cache must hold)
    first_seen: int  # of those, rows no earlier batch touched (compulsory misses)


def make_batches(w: Workload, alpha: float, n: int, seed: int) -> list[Batch]:
    """n batches drawn as synthetic.py draws them (same bag lengths, ids and per-table salt)."""
    rng = np.random.default_rng([seed, round(alpha * 1000)])
    seen = [np.zeros(w.rows, dtype=bool) for _ in range(w.tables)]
    out = []
    for _ in range(n):
        values, lengths, unique, unique_max, first = [], [], 0, 0, 0
        for t in range(w.tables):
            lens = bag_lengths(rng, w.batch, w.pooling)
            ids = power_law_ids(rng, int(lens.sum()), w.rows, alpha, salt=t * 7919 + 13)
            u = np.unique(ids)
            unique += u.size
            unique_max = max(unique_max, u.size)
            first += int((~seen[t][u]).sum())
            seen[t][u] = True
            values.append(ids)
            lengths.append(lens)
        offsets = np.zeros(w.tables * w.batch + 1, dtype=np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
        values_t = torch.from_numpy(np.concatenate(values))
        out.append(Batch(values_t, torch.from_numpy(offsets), unique, unique_max, first))
    return out


# ---- 1 and 2: hit rate and step time --------------------------------------------------------
def train_step(
    m: FusedEmbeddingBag, b: Batch, target: torch.Tensor, pool: ThreadPoolExecutor | None, nxt: Batch | None
) -> tuple[float, float]:
    """One step (forward, MSE loss, backward + fused update); with a pool, the next batch's
    prefetch runs between forward and backward and is waited for. Returns (host seconds, CPU
    seconds of the whole process: every thread's, the prefetch's and torch's workers')."""
    t0, c0 = time.perf_counter(), time.process_time()
    pooled = m(b.values, b.offsets)  # (B, T*D)
    pending = pool.submit(m.prefetch, nxt.values, nxt.offsets) if pool is not None else None
    (pooled - target).pow(2).mean().backward()
    if pending is not None:
        pending.result()  # the pipeline waits for it before the next forward: part of the step
    return time.perf_counter() - t0, time.process_time() - c0


def run_cached(
    w: Workload, batches: list[Batch], target: torch.Tensor, resident: FusedEmbeddingBag,
    fraction: float, policy: str, prefetch: bool, args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """A fresh cache trained over ``batches`` (warmup, then measured steps; the last batch is
    only prefetched). The resident kernel runs each measured batch right after the cached one."""
    cache_rows = max(1, min(w.rows, math.ceil(fraction * w.rows - 1e-9)))
    opt = SparseOptimizerSpec("rowwise_adagrad", lr=0.01)
    m = CachedEmbeddingBag(w.specs, opt, cache_rows=[cache_rows] * w.tables, policy=policy,
                           inner_backend=args.backend, seed=0)  # fmt: skip
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-prefetch") if prefetch else None
    row: dict[str, Any] = {"fraction": fraction, "policy": policy, "prefetch": prefetch, "cache_rows": cache_rows}
    cached_s, resident_s, fetch_s, cached_cpu, resident_cpu = [], [], [], [], []
    try:
        if pool is not None:
            m.prefetch(batches[0].values, batches[0].offsets)  # as the pipeline does before step 0
        for i in range(args.warmup):
            train_step(m, batches[i], target, pool, batches[i + 1])
        s0 = m.stats()
        for i in range(args.warmup, args.warmup + args.steps):
            b = batches[i]
            f0 = m.stats()["fetch_s"]
            wall, cpu = train_step(m, b, target, pool, batches[i + 1])
            cached_s.append(wall)
            cached_cpu.append(cpu)
            fetch_s.append(m.stats()["fetch_s"] - f0)
            wall, cpu = train_step(resident, b, target, None, None)
            resident_s.append(wall)
            resident_cpu.append(cpu)
        s1 = m.stats()
    except ValueError as e:
        if "cache holds" not in str(e):
            raise
        return row | {"status": "too small", "error": str(e)}
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    d = {k: s1[k] - s0[k] for k in s1}
    cached_ms, resident_ms = statistics.median(cached_s) * 1e3, statistics.median(resident_s) * 1e3
    return row | {
        "status": "ok",
        "hit_rate": d["hits"] / max(d["unique_rows"], 1),
        "misses_per_step": d["misses"] / args.steps,
        "writebacks_per_step": d["writebacks"] / args.steps,
        "store_mb_per_step": (d["bytes_read"] + d["bytes_written"]) / args.steps / 1e6,
        "fetch_ms_per_step": d["fetch_s"] / args.steps * 1e3,  # mean: one stalled step moves it
        "fetch_ms_median": statistics.median(fetch_s) * 1e3,
        "prefetch_deferred": d["prefetch_deferred"],
        "step_ms": cached_ms,
        "step_ms_min": min(cached_s) * 1e3,
        "resident_ms": resident_ms,
        "ratio": cached_ms / resident_ms,
        "ratio_of_per_step": statistics.median(c / r for c, r in zip(cached_s, resident_s)),
        # CPU time does not count waiting for a CPU: steadier than the ratio on a shared machine
        "cpu_ratio": statistics.median(cached_cpu) / statistics.median(resident_cpu),
    }


def sweep(w: Workload, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every zipf x policy x fraction, without and with prefetch."""
    rows: list[dict[str, Any]] = []
    target = torch.randn(w.batch, w.tables * w.dim, generator=torch.Generator().manual_seed(0))
    n = args.warmup + args.steps + 1
    total = len(args.zipf) * len(args.policies) * len(args.fractions)
    k = 0
    for alpha in args.zipf:
        batches = make_batches(w, alpha, n, args.seed)
        measured = batches[args.warmup : args.warmup + args.steps]
        ceiling = 1.0 - sum(b.first_seen for b in measured) / sum(b.unique for b in measured)
        max_unique = max(b.unique_max for b in batches[:-1])  # per table
        resident = create_embedding_bag(args.backend, w.specs, SparseOptimizerSpec("rowwise_adagrad", lr=0.01), seed=0)
        for _ in range(2):  # the resident kernel's first steps allocate
            train_step(resident, batches[0], target, None, None)
        print(f"# zipf {alpha}: {np.mean([b.unique for b in measured]):.0f} unique rows/batch (one table: at most "
              f"{max_unique}), hit-rate ceiling {ceiling:.3f} over the measured steps", flush=True)  # fmt: skip
        for policy in args.policies:
            for fraction in args.fractions:
                k += 1
                t0 = time.perf_counter()
                base = run_cached(w, batches, target, resident, fraction, policy, False, args)
                pre = (run_cached(w, batches, target, resident, fraction, policy, True, args)
                       if base["status"] == "ok" else base)  # fmt: skip
                row = {"zipf": alpha, "ceiling": ceiling, "max_unique_rows": max_unique} | base
                if base["status"] == "ok":
                    row |= {f"prefetch_{key}": pre[key] for key in
                            ("hit_rate", "step_ms", "resident_ms", "ratio", "cpu_ratio", "fetch_ms_median",
                             "prefetch_deferred")}
                rows.append(row)
                gc.collect()
                what = (f"hit {row['hit_rate']:.3f}, {row['ratio']:.2f}x / {row['prefetch_ratio']:.2f}x with prefetch"
                        if row["status"] == "ok" else "too small")  # fmt: skip
                print(f"  [{k}/{total}] zipf {alpha} {policy} {100 * fraction:g}% ({row['cache_rows']} rows): "
                      f"{what} ({time.perf_counter() - t0:.1f} s, load {os.getloadavg()[0]:.2f})",
                      flush=True)  # fmt: skip
        del resident
        gc.collect()
    return rows


def print_sweep(rows: list[dict[str, Any]]) -> None:
    head = (f"{'zipf':>5} {'policy':<6} {'cache':>6} {'rows':>7} {'hit':>6} {'ceil':>6} {'miss/st':>8} "
            f"{'store MB/st':>11} {'fetch ms':>8} {'step ms':>8} {'resid ms':>8} {'ratio':>6} {'cpu':>6} "
            f"{'pf hit':>6} {'pf ms':>7} {'pf ratio':>8} {'pf cpu':>6}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in rows:
        lead = f"{r['zipf']:>5} {r['policy']:<6} {100 * r['fraction']:>5g}% {r['cache_rows']:>7}"
        if r["status"] != "ok":
            print(f"{lead} too small (one batch has up to {r['max_unique_rows']} unique rows of a table)")
            continue
        print(f"{lead} {r['hit_rate']:>6.3f} {r['ceiling']:>6.3f} {r['misses_per_step']:>8.0f} "
              f"{r['store_mb_per_step']:>11.2f} {r['fetch_ms_median']:>8.2f} {r['step_ms']:>8.2f} "
              f"{r['resident_ms']:>8.2f} {r['ratio']:>5.2f}x {r['cpu_ratio']:>5.2f}x "
              f"{r['prefetch_hit_rate']:>6.3f} {r['prefetch_step_ms']:>7.2f} {r['prefetch_ratio']:>7.2f}x "
              f"{r['prefetch_cpu_ratio']:>5.2f}x")  # fmt: skip


def goal_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 12's step-time goal, per policy and with / without prefetch, where it was measured."""
    out = []
    for r in rows:
        if r["zipf"] != GOAL["zipf"] or not math.isclose(r["fraction"], GOAL["fraction"]):
            continue
        for pf in (False, True):
            ok = r["status"] == "ok"
            ratio = (r["prefetch_ratio"] if pf else r["ratio"]) if ok else None
            cpu = (r["prefetch_cpu_ratio"] if pf else r["cpu_ratio"]) if ok else None
            out.append({"policy": r["policy"], "prefetch": pf, "ratio": ratio, "cpu_ratio": cpu,
                        "met": None if ratio is None else ratio <= GOAL["max_ratio"]})  # fmt: skip
    return out


# ---- 3: the SSD tier --------------------------------------------------------------------------
def advise(maps: Sequence[np.memmap], advice: int) -> None:
    """madvise every mapping (numpy keeps the mmap.mmap behind a memmap in ``_mmap``)."""
    for mm in maps:
        raw = getattr(mm, "_mmap", None)
        if raw is not None and hasattr(raw, "madvise"):
            raw.madvise(advice)


def mapping_advice(path: Path) -> str | None:
    """How this process's mapping of ``path`` is advised: "random" (MADV_RANDOM), "sequential"
    or "normal", from /proc/self/smaps' VmFlags (rr / sr); None when not found."""
    for _, _, mapped, flags in smaps_mappings():
        if mapped == str(path):
            return "random" if "rr" in flags else "sequential" if "sr" in flags else "normal"
    return None


def drop_page_cache(paths: Sequence[Path], maps: Sequence[np.memmap] = ()) -> None:
    """Best effort, without root: unmap our pages of the mappings (the kernel keeps mapped pages
    in the page cache), then ask it to drop the files' clean pages."""
    advise(maps, mmap.MADV_DONTNEED)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_mb(paths: Sequence[Path]) -> float | None:
    """MB of the files in the page cache (util-linux fincore), or None where it is missing."""
    if shutil.which("fincore") is None:
        return None
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
                             capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
        return sum(int(x) for x in out.split()) / 1e6
    except (subprocess.SubprocessError, ValueError):
        return None


def sequential_disk(directory: Path, mb: int) -> dict[str, Any]:
    """Write an mb-MB file in 8 MiB chunks and fsync it; read it back cold (dropped) and warm."""
    path = directory / "sequential.bin"
    chunk = np.random.default_rng(0).integers(0, 255, 8 * 2**20, dtype=np.uint8).tobytes()
    n = max(1, mb * 2**20 // len(chunk))
    nbytes = n * len(chunk)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(n):
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    write_s = time.perf_counter() - t0

    def read_all() -> float:
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
        return time.perf_counter() - t0

    buf = bytearray(len(chunk))
    drop_page_cache([path])
    left = resident_mb([path])
    io0 = io_bytes()
    cold_s = read_all()
    io1 = io_bytes()
    warm_s = read_all()
    path.unlink()
    return {"mb": nbytes / 1e6, "write_mbs": nbytes / 1e6 / write_s, "read_cold_mbs": nbytes / 1e6 / cold_s,
            "read_warm_mbs": nbytes / 1e6 / warm_s, "resident_mb_after_drop": left,
            "read_cold_device_mb": (io1[0] - io0[0]) / 1e6 if io0 and io1 else None}  # fmt: skip


def io_bytes() -> tuple[int, int] | None:
    """This process's (read_bytes, write_bytes) from /proc/self/io: bytes it made the block
    layer read, and bytes of pages it dirtied (what writeback must write), or None."""
    try:
        fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        return int(fields["read_bytes"]), int(fields["write_bytes"])
    except (OSError, KeyError, ValueError):
        return None


def store_throughput(w: Workload, directory: Path, rows: int, k: int, repeats: int) -> dict[str, Any]:
    """Random-row ``read`` / ``write`` of an MmapStore (module docstring, part 3)."""
    store = MmapStore([TableSpec(rows, w.dim, "sum", "ssd")], "rowwise_adagrad", torch.float32, directory)
    maps = store._maps  # the store's np.memmaps: no public handle, needed to unmap their pages
    paths = sorted(p for p in directory.iterdir() if p.name.startswith("table"))
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for a in range(0, rows, 1 << 16):  # fill: sequential through the mapping, then msync
        b = min(rows, a + (1 << 16))
        store.weights[0][a:b].copy_(torch.randn(b - a, w.dim, generator=g))
        for s in store.states[0].values():
            s[a:b].copy_(torch.rand(b - a, *s.shape[1:], generator=g))
    store.sync()
    fill_s = time.perf_counter() - t0
    file_mb = sum(p.stat().st_size for p in paths) / 1e6
    rng = np.random.default_rng(1)
    k = min(k, rows)

    def row_set() -> torch.Tensor:
        return torch.from_numpy(np.sort(rng.choice(rows, size=k, replace=False)))  # sorted, as torch.unique's

    store_advice = mapping_advice(paths[0])
    other = "normal" if store_advice == "random" else "random"
    keys = ("read_cold", "read_warm", "write", "write_sync", "read_cold_other")
    secs: dict[str, list[float]] = {key: [] for key in keys}
    dev: dict[str, list[tuple[int, int]]] = {key: [] for key in keys}  # (read, write) bytes, /proc/self/io
    left = []

    def timed(key: str, fn: Any) -> Any:
        io0, t0 = io_bytes(), time.perf_counter()
        out = fn()
        secs[key].append(time.perf_counter() - t0)
        io1 = io_bytes()
        if io0 is not None and io1 is not None:
            dev[key].append((io1[0] - io0[0], io1[1] - io0[1]))
        return out

    for _ in range(repeats):
        r = row_set()
        drop_page_cache(paths, maps)
        left.append(resident_mb(paths))
        weight, state = timed("read_cold", lambda: store.read(0, r))
        timed("read_warm", lambda: store.read(0, r))
        r = row_set()  # other rows: mostly not in the page cache, so a write faults its pages in first
        timed("write", lambda: store.write(0, r, weight + 1.0, state))
        t0 = time.perf_counter()
        store.sync()
        secs["write_sync"].append(secs["write"][-1] + time.perf_counter() - t0)
        if dev["write"]:
            dev["write_sync"].append(dev["write"][-1])  # write_bytes counts pages when dirtied
    # the other advice: MADV_RANDOM makes a fault read its page only, normal readahead reads a
    # window (up to the device's read_ahead_kb) around it
    advise(maps, mmap.MADV_NORMAL if other == "normal" else mmap.MADV_RANDOM)
    for _ in range(repeats):
        r = row_set()
        drop_page_cache(paths, maps)
        timed("read_cold_other", lambda: store.read(0, r))
    row_mb = k * w.row_bytes / 1e6
    out: dict[str, Any] = {"rows": rows, "file_mb": file_mb, "batch_rows": k, "row_bytes": w.row_bytes,
                           "fill_mbs": file_mb / fill_s, "resident_mb_after_drop": left,
                           "store_advice": store_advice, "other_advice": other}  # fmt: skip
    for key in keys:
        t = statistics.median(secs[key])
        out[f"{key}_mbs"] = row_mb / t
        out[f"{key}_rows_per_s"] = k / t
        out[f"{key}_device_read_mb"] = statistics.median(x[0] for x in dev[key]) / 1e6 if dev[key] else None
        out[f"{key}_device_write_mb"] = statistics.median(x[1] for x in dev[key]) / 1e6 if dev[key] else None
    del store, maps, weight, state
    gc.collect()
    return out


def ssd_part(w: Workload, args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.storage_dir) if args.storage_dir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="neo_cache_bench_", dir=base))
    try:
        seq = sequential_disk(directory, args.seq_mb)
        store = store_throughput(w, directory, args.ssd_rows, args.ssd_batch, args.ssd_repeats)
        df = ["df", "--output=source,fstype,target", str(directory)]
        fs = subprocess.run(df, capture_output=True, text=True).stdout.split("\n")[1:2]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"directory": str(base), "filesystem": fs[0] if fs else None, "sequential": seq, "store": store}


def print_ssd(s: dict[str, Any]) -> None:
    seq, st = s["sequential"], s["store"]
    print(f"# store: {st['rows']:,} rows x {st['row_bytes']} B ({st['file_mb']:.0f} MB in files), "
          f"{st['batch_rows']:,} random rows per call ({st['batch_rows'] * st['row_bytes'] / 1e6:.2f} MB of rows); "
          f"sequential file {seq['mb']:.0f} MB; filesystem {s['filesystem']}")  # fmt: skip
    head = (f"{'operation':<46} {'row MB/s':>9} {'rows/s':>10} {'dev rd MB':>9} {'dev wr MB':>9} {'ampl.':>6} "
            f"{'sequential MB/s':>16} {'row/seq':>8}")  # fmt: skip
    print(head)
    print("-" * len(head))
    lines = [
        (f"random read, cold (store's advice: {st['store_advice']})", "read_cold", seq["read_cold_mbs"]),
        (f"  same, mappings advised {st['other_advice']}", "read_cold_other", seq["read_cold_mbs"]),
        ("random read, warm (page cache)", "read_warm", seq["read_warm_mbs"]),
        ("random write into the mapping (no flush)", "write", seq["write_mbs"]),
        ("random write + flush (msync)", "write_sync", seq["write_mbs"]),
    ]
    row_mb = st["batch_rows"] * st["row_bytes"] / 1e6
    for label, key, ref in lines:
        rd, wr = st[key + "_device_read_mb"], st[key + "_device_write_mb"]
        d = f"{rd:>9.2f} {wr:>9.2f} {(rd + wr) / row_mb:>5.1f}x" if rd is not None else f"{'?':>9} {'?':>9} {'?':>6}"
        print(f"{label:<46} {st[key + '_mbs']:>9.1f} {st[key + '_rows_per_s']:>10,.0f} {d} "
              f"{ref:>16.1f} {st[key + '_mbs'] / ref:>7.3f}x")  # fmt: skip
    print(f"{'sequential fill of the store + msync':<46} {st['fill_mbs']:>9.1f} {'':>10} {'':>9} {'':>9} {'':>6} "
          f"{seq['write_mbs']:>16.1f} {st['fill_mbs'] / seq['write_mbs']:>7.3f}x")  # fmt: skip
    left = [x for x in st["resident_mb_after_drop"] if x is not None]
    print(f"# sequential: write+fsync {seq['write_mbs']:.1f} MB/s; read cold {seq['read_cold_mbs']:.1f} MB/s "
          f"({seq['read_cold_device_mb']} MB from the device), warm {seq['read_warm_mbs']:.1f} MB/s. "
          f"dev rd / wr MB = /proc/self/io read_bytes / write_bytes (pages dirtied) per call; ampl. = device / "
          f"row bytes. Page-cache MB left after each drop (fincore): sequential file {seq['resident_mb_after_drop']}, "
          f"store {left or 'unknown'}. No root: 'cold' reads may still be served by the host's disk "
          f"cache.")  # fmt: skip


# ---- plot, main -------------------------------------------------------------------------------
def write_png(path: str, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["sweep"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(19, 5.2), gridspec_kw={"width_ratios": [3, 3, 2.4]})
    zipfs = sorted({r["zipf"] for r in rows})
    for ci, alpha in enumerate(zipfs):
        for policy, ls in zip(CACHE_POLICIES, ("-", "--")):
            sel = [r for r in rows if r["zipf"] == alpha and r["policy"] == policy]
            if not sel:
                continue
            x = [100 * r["fraction"] for r in sel]
            ok = [r["status"] == "ok" for r in sel]
            hit = [r["hit_rate"] if o else np.nan for r, o in zip(sel, ok)]
            ratio = [r["ratio"] if o else np.nan for r, o in zip(sel, ok)]
            pratio = [r["prefetch_ratio"] if o else np.nan for r, o in zip(sel, ok)]
            ax1.plot(x, hit, ls=ls, marker="o", color=f"C{ci}", label=f"zipf {alpha} {policy}")
            ax2.plot(x, ratio, ls=ls, marker="o", color=f"C{ci}", label=f"zipf {alpha} {policy}")
            ax2.plot(x, pratio, ls=ls, marker="x", color=f"C{ci}", alpha=0.6, label=f"zipf {alpha} {policy} +prefetch")
        ax1.axhline(next(r["ceiling"] for r in rows if r["zipf"] == alpha), color=f"C{ci}", lw=0.8, ls=":")
    ax2.axhline(GOAL["max_ratio"], color="k", lw=1, ls=":", label=f"goal {GOAL['max_ratio']}x")
    ax2.axvline(100 * GOAL["fraction"], color="k", lw=0.5, ls=":")
    w = report["workload"]
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("cache fraction of the table's rows (%)")
    ax1.set_ylim(0, 1.02)
    ax1.set_ylabel("steady-state hit rate (unique rows)")
    ax1.set_title(f"hit rate (dotted: compulsory-miss ceiling)\nT={w['tables']} rows={w['rows']:,} D={w['dim']}; "
                  f"solid lru, dashed lfu", fontsize=10)  # fmt: skip
    ax1.legend(fontsize=7)
    ax2.set_ylabel("median step time / resident step")
    ax2.set_title(f"step time / all-resident step ({report['backend']}), B={w['batch']} L={w['pooling']:g}\n"
                  f"o without, x with prefetch; dotted: issue 12's goal", fontsize=10)  # fmt: skip
    ax2.legend(fontsize=6, ncol=2)
    ssd = report.get("ssd")
    if ssd:
        st, seq = ssd["store"], ssd["sequential"]
        labels = [f"rand rd\ncold\n({st['store_advice']})", f"rand rd\ncold\n({st['other_advice']})",
                  "rand rd\nwarm", "rand wr", "rand wr\n+msync",
                  "seq wr\n+fsync", "seq rd\ncold", "seq rd\nwarm"]  # fmt: skip
        vals = [st["read_cold_mbs"], st["read_cold_other_mbs"], st["read_warm_mbs"], st["write_mbs"],
                st["write_sync_mbs"], seq["write_mbs"], seq["read_cold_mbs"], seq["read_warm_mbs"]]  # fmt: skip
        ax3.bar(range(len(vals)), vals, color=["C0"] * 5 + ["C7"] * 3)
        ax3.set_xticks(range(len(vals)), labels, fontsize=7)
        ax3.set_yscale("log")
        ax3.set_ylabel("MB/s (row bytes for the store)")
        ax3.set_title(f"SSD tier: {st['batch_rows']:,} random rows x {st['row_bytes']} B\n"
                      f"of a {st['file_mb']:.0f} MB store (blue) vs the disk (grey)", fontsize=10)  # fmt: skip
    else:
        ax3.set_axis_off()
    m = report["machine"]
    fig.suptitle(("SMOKE RUN (--quick, toy sizes) - not a measurement - " if report["quick"] else "")
                 + f"{m['cpu']}, {m['cpu_count']} CPUs, load average {m['loadavg_1m_at_start']:.2f} at start, "
                 f"{m['loadavg_1m_at_end']:.2f} at end")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_pressure() -> str | None:
    """/proc/pressure/cpu's "some" line: the share of time runnable tasks waited for a CPU."""
    try:
        return Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None


def floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 fractions, 1 zipf: a smoke test only")
    p.add_argument("--backend", default="reference", help="inner (and resident) kernel backend")
    p.add_argument("--rows", type=int, default=None, help="rows per table (default 200,000; --quick 5,000)")
    p.add_argument("--dim", type=int, default=None, help="D (default 64; --quick 16)")
    p.add_argument("--tables", type=int, default=1, help="T tables, one feature each")
    p.add_argument("--batch", type=int, default=None, help="B (default 512; --quick 64)")
    p.add_argument("--pooling", type=float, default=None, help="mean ids per bag L (default 20; --quick 4)")
    p.add_argument("--fractions", type=floats, default=None,
                   help="cache fractions of the rows (default 0.01,0.02,0.05,0.1,0.2,0.5,1; --quick 0.01,0.1)")
    p.add_argument("--zipf", type=floats, default=None, help="power-law exponents (default 0.8,1.05,1.2)")
    p.add_argument("--policies", default=",".join(CACHE_POLICIES), help="comma list of lru, lfu")
    p.add_argument("--warmup", type=int, default=None, help="unmeasured steps first (default 40; --quick 3)")
    p.add_argument("--steps", type=int, default=None, help="measured steps (default 100; --quick 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--storage-dir", default=None, help="where the SSD part's files go (default: a temp dir)")
    p.add_argument("--big", action="store_true", help="SSD part: a 2 GB store and sequential file (default ~130 MB)")
    p.add_argument("--ssd-rows", type=int, default=None, help="store rows (default 500,000; --big 8M; --quick 20,000)")
    p.add_argument("--ssd-batch", type=int, default=None, help="random rows per read/write (default 4096; --quick 512)")
    p.add_argument("--ssd-repeats", type=int, default=None, help="read/write repeats (default 7; --quick 2)")
    p.add_argument("--seq-mb", type=int, default=None, help="sequential file MB (default 256; --big 2048; --quick 8)")
    p.add_argument("--no-ssd", action="store_true", help="skip part 3")
    p.add_argument("--json", default=None, help="write every number and the machine info here")
    p.add_argument("--png", default=None, help="write the charts here")
    args = p.parse_args(argv)
    q = args.quick

    def pick(value: Any, full: Any, quick: Any, big: Any = None) -> Any:
        return value if value is not None else quick if q else big if (args.big and big is not None) else full

    w = Workload(pick(args.rows, 200_000, 5_000), pick(args.dim, 64, 16), args.tables, pick(args.batch, 512, 64),
                 pick(args.pooling, 20.0, 4.0))  # fmt: skip
    args.fractions = pick(args.fractions, [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0], [0.01, 0.1])
    args.zipf = pick(args.zipf, [0.8, 1.05, 1.2], [1.05])
    args.policies = [x for x in args.policies.split(",") if x]
    args.warmup = pick(args.warmup, 40, 3)
    args.steps = pick(args.steps, 100, 4)
    args.ssd_rows = pick(args.ssd_rows, 500_000, 20_000, 8_000_000)
    args.ssd_batch = pick(args.ssd_batch, 4096, 512)
    args.ssd_repeats = pick(args.ssd_repeats, 7, 2)
    args.seq_mb = pick(args.seq_mb, 256, 8, 2048)
    if args.backend not in available_backends():
        raise SystemExit(f"backend {args.backend!r} unavailable here; available: {available_backends()}")
    bad = [x for x in args.policies if x not in CACHE_POLICIES]
    if bad or not args.policies:
        raise SystemExit(f"--policies: choose from {CACHE_POLICIES}, got {args.policies}")
    if not args.fractions or any(not 0 < f <= 1 for f in args.fractions):
        raise SystemExit(f"--fractions must be in (0, 1], got {args.fractions}")
    if args.threads:
        torch.set_num_threads(args.threads)

    info = machine_info()
    info["cpu_pressure_at_start"] = cpu_pressure()
    print(f"# {info['cpu']}, {info['cpu_count']} CPUs, torch {info['torch']} ({info['torch_threads']} threads), "
          f"load average {info['loadavg_1m_at_start']:.2f}; inner backend {args.backend}"
          + ("; SMOKE RUN (--quick): numbers measure nothing" if q else ""), flush=True)  # fmt: skip
    print(f"# workload: T={w.tables} rows={w.rows:,} D={w.dim} B={w.batch} L={w.pooling:g}, rowwise_adagrad, "
          f"{args.warmup} warmup + {args.steps} measured steps per run", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    rows = sweep(w, args)
    sweep_s = time.perf_counter() - t0
    ssd = None
    if not args.no_ssd:
        print(f"# SSD tier ({args.storage_dir or tempfile.gettempdir()})", flush=True)
        ssd = ssd_part(w, args)
    info["loadavg_1m_at_end"] = os.getloadavg()[0]
    info["cpu_pressure_at_end"] = cpu_pressure()

    print(f"\n## 1-2. hit rate and step time (sweep {sweep_s:.0f} s; hit = steady-state share of unique rows "
          f"resident; ceil = 1 - compulsory share; fetch ms = median host ms per step in the cache's _lookup/prefetch "
          f"bookkeeping and copies; ratio = median step / median resident step; cpu = the same with the process's CPU "
          f"seconds per step; pf = with prefetch)")  # fmt: skip
    print_sweep(rows)
    goals = goal_rows(rows)
    print(f"\n## goal: zipf {GOAL['zipf']}, {100 * GOAL['fraction']:g}% cache, step <= {GOAL['max_ratio']}x the "
          f"resident step (CPU)")  # fmt: skip
    if not goals:
        print("not measured (that zipf / fraction is not in this sweep)")
    for g in goals:
        verdict = ("too small" if g["ratio"] is None else
                   f"{g['ratio']:.2f}x  {'MET' if g['met'] else 'NOT MET'}  "
                   f"(CPU time {g['cpu_ratio']:.2f}x)")  # fmt: skip
        print(f"  {g['policy']:<4} {'with prefetch' if g['prefetch'] else 'no prefetch':<14} {verdict}")
    if q and goals:
        print("  (smoke run: toy sizes, the verdict means nothing)")
    if ssd:
        print("\n## 3. SSD tier")
        print_ssd(ssd)
    print(f"# load average {info['loadavg_1m_at_start']:.2f} at start, {info['loadavg_1m_at_end']:.2f} at end; "
          f"{info['cpu_pressure_at_end']} (/proc/pressure/cpu)")  # fmt: skip

    report = {"benchmark": "cache", "quick": q, "machine": info, "argv": sys.argv, "args": vars(args),
              "backend": args.backend, "workload": asdict(w), "row_bytes": w.row_bytes, "sweep": rows,
              "goal": GOAL | {"rows": goals}, "ssd": ssd}  # fmt: skip
    write_outputs(report, args.json, args.png, write_png, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
