"""The GPU tier: what only a real GPU can show. Never needed by CI.

    python -m pytest -m gpu -q                    # on a CUDA machine (triton installed): the tier
    python -m pytest -m gpu --collect-only -q     # anywhere: what the tier holds

Without CUDA every GPU test is collected and skipped, saying why; importing this file touches no
device. Once the tier passes on a real GPU, record it in ``kernels.registry.TRITON_GPU_VERIFIED``
(the GPU's name and the date): only then does ``--backend auto`` pick triton on CUDA.

GPU tests (``@gpu``: marked ``gpu`` and skipped without CUDA):
    test_triton_matches_reference        compiled Triton forward + fused backward/optimizer for every
                                         optimizer and weight dtype vs the reference backend and a
                                         float64 oracle; awkward sizes, hot rows, empty bags
    test_single_gpu_training_matches_cpu Trainer on cuda (triton, reference) vs the CPU reference run
    test_nccl_world_size_one_matches_cpu the sharded path under a 1-rank NCCL process group
    test_pipelined_equals_plain_on_gpu   cfg.train.pipeline on vs off, on cuda
    test_gloo_ranks_share_one_gpu        2 gloo ranks with CUDA tensors on one GPU vs 2 CPU ranks
    test_steady_state_host_syncs         <= 2 synchronising calls per pipelined step
    test_positions_where_on_gpu_needs_no_sync  the sync-free position select (hot-row split, TW sparse output)
    test_a_cuda_trace_times_the_stream   the tracer's CUDA clock: compute and waits in device time
    test_a_calibration_burst_fills_the_device  a busy calibration's compute on a GPU: device time, host waits
    test_sim_validation_on_a_gpu         benchmarks/sim_validation.py --quick --device cuda: a GPU trace predicted

CPU tests (not GPU-marked: they run in CI): the registry's ``auto`` policy on CUDA, and the
Triton parity harness itself at toy sizes under Triton's interpreter, so the GPU test's code
cannot rot unnoticed.

The marks are per test (``@gpu``), not a module-level ``pytestmark``: a module mark would also
mark, skip and (under ``-m "not gpu"``) deselect the CPU tests above.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from neo_train.config import Config, preset
from neo_train.kernels import SparseOptimizerSpec, TableSpec, registry
from neo_train.sharding import ShardingPlan
from neo_train.testing import RankFailed, free_port, run_ranks
from neo_train.train import Trainer

HERE = Path(__file__).resolve().parent
HAS_CUDA = torch.cuda.is_available()
NO_CUDA = "needs a CUDA GPU (the GPU tier: run `pytest -m gpu` on a CUDA machine)"
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def gpu(fn: Callable) -> Callable:
    """Mark a test for the GPU tier: ``-m gpu`` selects it; without CUDA it is skipped, saying why."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)(fn))


def _need_triton() -> None:
    pytest.importorskip("triton", reason="the triton backend needs the triton package")


def _strict_fp32() -> None:
    """No TF32 in matmuls: the GPU runs must be float32 like the CPU runs they are compared with."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@pytest.fixture
def strict_fp32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    _strict_fp32()
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# ==== 1. compiled Triton vs the reference backend ================================================
def _oracle_cls() -> type:
    """tests/test_triton_kernels.py's float64 oracle (per-table embedding_bag + textbook sparse
    optimizers). Loaded on use, not at import: that module needs triton."""
    mod = sys.modules.get("test_triton_kernels")
    if mod is None:
        spec = importlib.util.spec_from_file_location("test_triton_kernels", HERE / "test_triton_kernels.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return mod.Oracle


# Awkward on purpose: rows 1, 37, 4099, 100_003 (none a power of two), dims 3, 5, 17, 33 (not
# multiples of 4 or 8), 130 and 600 (600 > the widest dim class, 512: the kernels walk the row
# in column chunks), sum and mean pooling, one table shared by two features.
GPU_TABLES = (
    TableSpec(1, 5, "sum", "one_row"),
    TableSpec(37, 3, "mean", "tiny_mean"),
    TableSpec(4099, 17, "sum", "shared"),
    TableSpec(100_003, 33, "sum", "big"),
    TableSpec(1000, 130, "mean", "wide_mean"),
    TableSpec(513, 600, "sum", "wider_than_a_tile"),
)
GPU_FTM = (0, 1, 2, 3, 2, 4, 5)
GPU_B, GPU_MAX_L = 257, 40  # B: not a multiple of any bags-per-program; bags of 0..40 ids


def parity_batch(gen: torch.Generator, tables, ftm, B: int, max_l: int, kind: str, weighted: bool):
    """A feature-major batch (values, offsets, psw | None) on the CPU.

    kind "random": bag lengths 0..max_l, ~15 % of bags empty, ids skewed to low rows (u**3 * rows:
    the first rows of big tables are hit more often than the hot-row threshold, 64);
    "hot": every id in rows 0..2 (a few rows take thousands of contributions); "empty": no ids."""
    F = len(ftm)
    lengths = torch.randint(0, max_l + 1, (F, B), generator=gen)
    lengths[torch.rand(F, B, generator=gen) < 0.15] = 0
    if kind == "empty":
        lengths.zero_()
    rows = torch.tensor([tables[t].rows for t in ftm]).repeat_interleave(lengths.sum(1))
    u = torch.rand(rows.numel(), generator=gen, dtype=torch.float64)
    values = (u * rows.clamp(max=3)).long() if kind == "hot" else (u**3 * rows).long()
    offsets = torch.zeros(F * B + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    psw = (torch.rand(values.numel(), generator=gen) * 2 - 0.5) if weighted else None
    return values, offsets, psw


def _bound(got: torch.Tensor, same: torch.Tensor, exact: torch.Tensor, what: str, floor: float) -> None:
    """flash-attention's rule in the 2-norm: ||got - exact|| <= 2 ||same - exact|| + floor ||exact||,
    ``same`` the reference backend in the weights' dtype, ``exact`` the float64 oracle.

    The 2-norm rather than the max: an adaptive update (adagrad, adam: g / (sqrt(s) + eps)) of an
    element whose gradient nearly cancels turns float32 rounding in its sum into an update error
    hundreds of ulps wide, for whichever backend summed in the less lucky order, so comparing two
    float32 backends' worst elements fails at random. The norm still catches any real fault: one
    wrong row moves it by ~lr * sqrt(D), orders of magnitude above the rounding noise."""
    exact = exact.double()
    norm = lambda x: torch.linalg.vector_norm(x.double().cpu() - exact).item()  # noqa: E731
    err, base = norm(got), norm(same)
    atol = floor * torch.linalg.vector_norm(exact).item() + 1e-12
    assert err <= 2 * base + atol, (
        f"{what}: triton error {err:.3g} > 2 * reference error {base:.3g} + {atol:.3g} (2-norms)"
    )


def run_parity(kind: str, dtype: torch.dtype, weighted: bool, weight_decay: float, tables, ftm, B: int,
               max_l: int, seed: int, device: str, hot_row_threshold: int = 64) -> None:  # fmt: skip
    """Train the triton backend on ``device``, the reference backend (CPU, same dtype) and the
    float64 oracle side by side for four steps (random, hot, empty, random at half the learning
    rate); check every forward output, table and optimizer state after every step.

    float32: outputs within rtol 1e-5 of the reference (atol 1e-5 of the output's scale: float32
    sums of up to 40 terms in another order); tables and state by ``_bound`` against the oracle
    (a fixed rtol on them would fail at random, see ``_bound``). float16/bfloat16: outputs, tables
    and state by ``_bound`` (the reference rounds to nearest, as the kernel does)."""
    from neo_train.kernels.reference import ReferenceEmbeddingBag
    from neo_train.kernels.triton_backend import TritonEmbeddingBag

    tables, ftm = list(tables), list(ftm)
    opt = SparseOptimizerSpec(kind, lr=0.05, weight_decay=weight_decay)
    tri = TritonEmbeddingBag(tables, opt, feature_table_map=ftm, device=device, weight_dtype=dtype, seed=seed,
                             hot_row_threshold=hot_row_threshold)  # fmt: skip
    ref = ReferenceEmbeddingBag(tables, opt, feature_table_map=ftm, device="cpu", weight_dtype=dtype, seed=seed)
    init = [tri.get_table(t).cpu() for t in range(len(tables))]  # float32 holds every half exactly
    for t in range(len(tables)):
        assert torch.equal(init[t], ref.get_table(t)), f"table {t}: triton and reference start apart"
    oracle = _oracle_cls()(tables, ftm, opt, init)
    gen = torch.Generator().manual_seed(seed)
    # 1e-5 of the tensor's norm: float32 noise passes even where both backends' errors come from
    # one ill-conditioned element (2-norm ratios up to ~0.5 seen in the interpreter at these
    # shapes); a wrong row (~lr * sqrt(D)) is still far above it
    floor = 1e-5
    for step, batch_kind in enumerate(("random", "hot", "empty", "random")):
        if step == 3:  # the rate must reach the kernel
            for m in (tri, ref):
                m.set_learning_rate(opt.lr * 0.5)
            oracle.lr = opt.lr * 0.5
        values, offsets, psw = parity_batch(gen, tables, ftm, B, max_l, batch_kind, weighted)
        grad = torch.randn(B, tri.total_dim, generator=gen)
        out_t = tri(values.to(device), offsets.to(device), None if psw is None else psw.to(device))
        out_r = ref(values, offsets, psw)
        what = f"step {step} ({batch_kind})"
        if dtype == torch.float32:
            scale = max(1.0, out_r.abs().max().item()) if out_r.numel() else 1.0
            torch.testing.assert_close(out_t.detach().cpu(), out_r.detach(), rtol=1e-5, atol=1e-5 * scale,
                                       msg=lambda m: f"{what} forward: {m}")  # fmt: skip
        else:
            _bound(out_t.detach(), out_r.detach(), oracle.forward(values, offsets, psw), f"{what} forward", floor)
        (out_t * grad.to(device)).sum().backward()
        (out_r * grad).sum().backward()
        oracle.train_step(values, offsets, psw, grad)
        for t in range(len(tables)):
            _bound(tri.get_table(t), ref.get_table(t), oracle.w[t], f"{what} table {t} weights", floor)
            got, same = tri.get_state(t), ref.get_state(t)
            assert set(got) == set(same) == set(oracle.state[t])
            for name, exact in oracle.state[t].items():
                _bound(got[name], same[name], exact, f"{what} table {t} state {name}", floor)
        assert tri.optimizer_step == ref.optimizer_step == oracle.step


@gpu
@pytest.mark.parametrize("weighted,weight_decay", [(False, 0.0), (True, 0.01)], ids=["plain", "weighted-decay"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_triton_matches_reference(request: pytest.FixtureRequest, kind: str, dtype: str, weighted: bool,
                                  weight_decay: float) -> None:  # fmt: skip
    """Compiled Triton (not the interpreter) vs the reference backend, every optimizer x every
    weight dtype the triton backend supports (TritonEmbeddingBag.supported_weight_dtypes)."""
    _need_triton()
    from neo_train.kernels.triton_backend import TritonEmbeddingBag

    assert set(DTYPES.values()) == set(TritonEmbeddingBag.supported_weight_dtypes)
    assert os.environ.get("TRITON_INTERPRET", "0") != "1", "the GPU tier must run compiled kernels"
    run_parity(kind, DTYPES[dtype], weighted, weight_decay, GPU_TABLES, GPU_FTM, GPU_B, GPU_MAX_L,
               zlib.crc32(request.node.name.encode()), "cuda")  # fmt: skip


@gpu
@pytest.mark.timeout(900)
def test_triton_matches_reference_at_model_a_scale() -> None:
    """One bigger batch of Model-A-like dims (192, 16, 64, 8, 96; 200,003 rows each; B = 8192,
    bags of up to 30 power-law ids): programs in the hundreds of thousands, hot rows with
    thousands of contributions, row-wise AdaGrad as in training."""
    _need_triton()
    tables = [TableSpec(200_003, d, "sum", f"t{i}") for i, d in enumerate((192, 16, 64, 8, 96))]
    run_parity("rowwise_adagrad", torch.float32, False, 0.0, tables, range(len(tables)), 8192, 30, 7, "cuda")


def test_parity_harness_on_cpu_interpreter() -> None:
    """The harness above, at toy sizes under Triton's interpreter (CPU, CI): keeps it working."""
    _need_triton()
    if HAS_CUDA:
        pytest.skip("on a CUDA machine test_triton_matches_reference runs the harness for real")
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        pytest.skip("TRITON_INTERPRET=1 was not set before triton was imported (tests/conftest.py sets it)")
    tables = (TableSpec(1, 5, "sum", "one_row"), TableSpec(37, 3, "mean", "m"), TableSpec(41, 17, "sum", "shared"))
    for kind, dtype, weighted in (("rowwise_adagrad", torch.float32, True), ("adam", torch.bfloat16, False)):
        run_parity(kind, dtype, weighted, 0.01, tables, (0, 1, 2, 2), 5, 4, 3, "cpu", hot_row_threshold=3)


# ==== 2-3. single-GPU training ====================================================================
# Losses of the GPU runs vs the CPU reference run: rtol 1e-4, atol 1e-5 (what tests/test_train.py
# allows between CPU backends). Both are float32 (TF32 off) and differ only in the order of
# float32 sums (cuBLAS vs CPU GEMM blockings, reductions, embedding sums: ~1e-7 relative per op);
# fbgemm vs reference on the CPU, another order, stays within 1e-7 relative over these 12 steps,
# so 1e-4 leaves two to three orders of margin for the GPU's orders, while a real fault (a missed
# row, a wrong pooling, a stale optimizer state) moves a loss of ~0.7 by 1e-3 or more.
TRAIN_RTOL, TRAIN_ATOL, TRAIN_STEPS = 1e-4, 1e-5, 12


def _cfg(backend: str, *, pipeline: bool = True, steps: int = TRAIN_STEPS) -> Config:
    cfg = preset("tiny")
    return cfg.replace(train=cfg.train.replace(steps=steps, kernel_backend=backend, pipeline=pipeline,
                                               eval_batches=2, log_every=4))  # fmt: skip


def _losses_close(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want) == TRAIN_STEPS, (len(got), len(want))
    torch.testing.assert_close(
        torch.tensor(got), torch.tensor(want), rtol=TRAIN_RTOL, atol=TRAIN_ATOL,
        msg=lambda m: f"{what}: per-step losses differ from the CPU reference run: {m}",
    )  # fmt: skip


_CPU_LOSSES: list[list[float]] = []


def _cpu_reference_losses() -> list[float]:
    """The CPU reference run's per-step losses (computed once per session)."""
    if not _CPU_LOSSES:
        _CPU_LOSSES.append(Trainer(_cfg("reference"), device="cpu", progress=False).run().losses)
    return _CPU_LOSSES[0]


@gpu
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_single_gpu_training_matches_cpu(strict_fp32, backend: str) -> None:
    """Trainer(cfg, device="cuda"), no communicator: step-for-step losses of the CPU run."""
    if backend == "triton":
        _need_triton()
    result = Trainer(_cfg(backend), device="cuda", progress=False).run()
    assert result.backend == backend
    _losses_close(result.losses, _cpu_reference_losses(), f"cuda/{backend}")


def _world1_child(out_path: str, backend: str, dist_backend: str = "nccl", device: str = "cuda:0") -> None:
    """Runs in a fresh interpreter (RANK=0, WORLD_SIZE=1 in its environment): a 1-rank process
    group, a quick check that it moves data on ``device``, then the sharded trainer (table-wise
    plan). The test uses NCCL on cuda:0; gloo on the CPU runs the same code without a GPU."""
    import torch.distributed as dist

    from neo_train.comm.native import init_distributed

    if device.startswith("cuda"):
        _strict_fp32()
        torch.cuda.set_device(torch.device(device))
    comm = init_distributed(dist_backend, timeout_s=120.0)
    assert comm is not None and comm.backend == dist_backend and comm.world_size == 1, comm
    try:
        x = torch.arange(4.0, device=device)
        dist.all_reduce(x)
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x)
        assert x.tolist() == y.tolist() == [0.0, 1.0, 2.0, 3.0]
        cfg = _cfg(backend)
        plan = ShardingPlan.uniform(cfg.model, "table_wise", 1)
        result = Trainer(cfg, device=device, comm=comm, plan=plan, progress=False).run()
    finally:
        dist.destroy_process_group()
    Path(out_path).write_text(json.dumps({"losses": result.losses, "backend": result.backend}))


def run_world1(out: Path, backend: str, dist_backend: str = "nccl", device: str = "cuda:0") -> dict[str, Any]:
    """``_world1_child`` in a subprocess; its report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")  # fmt: skip
    args = ", ".join(repr(a) for a in (str(out), backend, dist_backend, device))
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_gpu; test_gpu._world1_child({args})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, (
        f"{dist_backend} world-size-1 run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return json.loads(out.read_text())


@gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_nccl_world_size_one_matches_cpu(tmp_path: Path, backend: str) -> None:
    """The sharded path (DistributedModelParallel, input dist, table-wise kernels, pipeline) on
    cuda under a 1-rank NCCL process group, in a subprocess (NCCL wants a process of its own;
    run_ranks spawns gloo ranks only). With one rank the communicator short-cuts its collectives
    to local copies, so NCCL's transfers are checked only by the direct calls in the child."""
    if backend == "triton":
        _need_triton()
    report = run_world1(tmp_path / "losses.json", backend)
    assert report["backend"] == backend
    _losses_close(report["losses"], _cpu_reference_losses(), f"nccl-1/{backend}")


@gpu
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_pipelined_equals_plain_on_gpu(strict_fp32, backend: str) -> None:
    """cfg.train.pipeline on vs off on cuda (side streams, loader thread): the same per-step
    losses (within 1e-6; the computation and its order are the plain loop's) and tables."""
    if backend == "triton":
        _need_triton()
    runs = {}
    for pipeline in (False, True):
        trainer = Trainer(_cfg(backend, pipeline=pipeline), device="cuda", progress=False)
        runs[pipeline] = (trainer.run().losses, trainer.gather_state_dict()["tables"])
    (plain, plain_tables), (piped, piped_tables) = runs[False], runs[True]
    torch.testing.assert_close(torch.tensor(piped), torch.tensor(plain), rtol=0, atol=1e-6)
    for name, entries in plain_tables.items():
        for key, value in entries.items():
            torch.testing.assert_close(piped_tables[name][key], value, rtol=0, atol=1e-6,
                                       msg=lambda m: f"table {name} {key}: {m}")  # fmt: skip


# ==== 4. several gloo ranks on one GPU ============================================================
def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


def probe_collectives(comm: Any, device: str = "cuda:0") -> dict[str, str]:
    """Each torch.distributed collective on ``device`` tensors through the world (gloo) group:
    "" when it ran and gave the right answer, else the exception's first line. An unsupported op
    raises on every rank alike, before any transfer; a stuck one hits the group's timeout
    (run_ranks sets it), so a probe never hangs."""
    import torch.distributed as dist

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    W, r = comm.world_size, comm.rank

    def all_reduce() -> None:
        x = torch.full((4,), float(r + 1), device=dev)
        dist.all_reduce(x)
        assert x.tolist() == [W * (W + 1) / 2] * 4, x

    def broadcast() -> None:
        x = torch.full((3,), float(r + 5), device=dev)
        dist.broadcast(x, src=0)
        assert x.tolist() == [5.0] * 3, x

    def all_gather() -> None:
        x = torch.full((2,), float(r), device=dev)
        out = [torch.empty_like(x) for _ in range(W)]
        dist.all_gather(out, x)
        assert [o.tolist() for o in out] == [[float(s)] * 2 for s in range(W)], out

    def all_to_all_single() -> None:
        x = torch.arange(2 * W, dtype=torch.float32, device=dev) + 100 * r
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, [2] * W, [2] * W)
        assert out.tolist() == [100.0 * s + 2 * r + j for s in range(W) for j in range(2)], out

    def reduce_scatter() -> None:
        out = torch.empty(2, device=dev)
        dist.reduce_scatter(out, [torch.full((2,), float(s), device=dev) for s in range(W)])
        assert out.tolist() == [float(r * W)] * 2, out

    results = {}
    for fn in (all_reduce, broadcast, all_gather, all_to_all_single, reduce_scatter):
        try:
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            results[fn.__name__] = ""
        except Exception as e:  # noqa: BLE001 - recorded, judged by the test
            results[fn.__name__] = _first_line(e)
    return results


# what neo_train's native communicator and DDP call: all_to_all_v, all_gather_v (padded
# all_gather), all_reduce (metrics, DP tables, DDP's buckets through the comm hook), broadcast
# (DDP's start); reduce-scatter-v is an all-to-all plus a local sum, so reduce_scatter is not needed
_NEEDED_BY_TRAINING = ("all_reduce", "broadcast", "all_gather", "all_to_all_single")


def _gloo_probe_rank(comm: Any, device: str = "cuda:0") -> dict[str, str]:
    return probe_collectives(comm, device)


def _gloo_train_rank(comm: Any, device: str, backend: str) -> list[float]:
    """One rank of a 2-rank run of the tiny preset: t0 row-wise, t2 data-parallel, the rest
    table-wise (every collective kind the trainer issues). Both ranks share GPU 0."""
    if device.startswith("cuda"):
        _strict_fp32()
        torch.cuda.set_device(torch.device(device))
    cfg = _cfg(backend)
    plan = ShardingPlan.uniform(cfg.model, "table_wise", comm.world_size).with_overrides(
        cfg.model, {"t0": "row_wise", "t2": "data_parallel"}
    )
    return Trainer(cfg, device=device, comm=comm, plan=plan, progress=False).run().losses


@gpu
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_gloo_ranks_share_one_gpu(backend: str) -> None:
    """Two gloo ranks, both on GPU 0, training with CUDA tensors; losses vs 2 CPU gloo ranks.

    What gloo does with CUDA tensors (torch's ProcessGroupGloo.cpp): all_reduce, broadcast,
    all_gather, all_to_all_single (alltoall_base has a CUDA work class, AsyncAlltoallCUDAWork),
    gather, scatter and reduce stage them through pinned host memory, on a stream of their own;
    send/recv hand the device pointer straight to the transport (not staged), so the schedule
    executor's point-to-point rounds are not exercised here; reduce_scatter's CUDA support
    depends on the torch version (probed and reported, not needed). Each collective the trainer needs is probed first on
    both ranks: a wrong answer fails the test; an unsupported one must be a prompt error on every
    rank (never a hang: run_ranks and the group's timeout bound every wait), and then training
    must fail with a CollectiveError naming the collective, after which the comparison is
    skipped with the reason."""
    if backend == "triton":
        _need_triton()
    probes = run_ranks(_gloo_probe_rank, 2, timeout_s=180, collective_timeout_s=60)
    assert probes[0] == probes[1], f"ranks disagree on what gloo supports: {probes}"
    probe = probes[0]
    print(f"gloo with CUDA tensors here: {json.dumps(probe)}")
    wrong = {op: e for op, e in probe.items() if e.startswith("AssertionError")}
    assert not wrong, f"gloo gave wrong results on CUDA tensors: {wrong}"
    for op, err in probe.items():
        assert not err or len(err) > len("RuntimeError: "), f"{op}: an unsupported op must say why, got {err!r}"
    missing = {op: probe[op] for op in _NEEDED_BY_TRAINING if probe[op]}
    if missing:
        t0 = time.monotonic()
        with pytest.raises(RankFailed, match=r"CollectiveError|unsupported|not supported"):
            run_ranks(_gloo_train_rank, 2, "cuda:0", backend, timeout_s=300, collective_timeout_s=60)
        assert time.monotonic() - t0 < 240, "the unsupported collective took minutes to fail"
        pytest.skip(f"gloo here cannot run {sorted(missing)} on CUDA tensors ({missing}); "
                    "training was checked to fail with a clear error")  # fmt: skip
    gpu_losses = run_ranks(_gloo_train_rank, 2, "cuda:0", backend, timeout_s=420, collective_timeout_s=120)
    cpu_losses = run_ranks(_gloo_train_rank, 2, "cpu", "reference", timeout_s=300, collective_timeout_s=120)
    assert gpu_losses[0] == gpu_losses[1], "the global losses must be the same on every rank"
    _losses_close(gpu_losses[0], cpu_losses[0], f"2 gloo ranks on cuda/{backend}")


# ==== 5. host syncs per steady-state step ========================================================
def _steps(trainer: Trainer, n: int) -> list[Any]:
    """Run the trainer's next ``n`` steps the way Trainer.run does with cfg.train.pipeline on;
    returns what each step returned (device tensors are not read here: reading one is a sync)."""
    start = getattr(trainer, "_gpu_test_next_step", 0)
    trainer._gpu_test_next_step = start + n  # type: ignore[attr-defined]
    pipe = getattr(trainer, "_gpu_test_pipeline", None)
    if pipe is None:
        from neo_train.train import TrainPipeline

        pipe = trainer._gpu_test_pipeline = TrainPipeline(trainer)  # type: ignore[attr-defined]
    return [pipe.step(i) for i in range(start, start + n)]


def _close_steps(trainer: Trainer) -> None:
    pipe = getattr(trainer, "_gpu_test_pipeline", None)
    if pipe is not None:
        pipe.close()


SYNCS_PER_STEP = 2  # the goal: e.g. the input dist's headers and one loss read


@gpu
def test_steady_state_host_syncs(strict_fp32, monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm up 5 steps (kernels compile, caches fill), then count the host syncs of 10 pipelined
    steps, from every thread (the loader's too): at most SYNCS_PER_STEP per step. The failure
    lists the call sites.

    Counted: what torch.cuda.set_sync_debug_mode("warn") reports (implicit syncs: .item(),
    .tolist(), bool() of a device tensor, nonzero, device-to-host copies, Stream.synchronize)
    plus explicit torch.cuda.synchronize() calls, which the debug mode does not report (wrapped
    here). Not counted: waits on one CUDA event (Event.synchronize / elapsed_time), e.g. the phase
    timer reading its events once per logging interval, mostly long after they completed."""
    _need_triton()
    warmup, n = 5, 10
    trainer = Trainer(_cfg("triton", steps=warmup + n), device="cuda", progress=False)
    explicit: list[str] = []
    device_sync = torch.cuda.synchronize

    def counted_sync(*args: Any, **kwargs: Any) -> None:
        caller = sys._getframe(1)
        explicit.append(f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno} (torch.cuda.synchronize)")
        device_sync(*args, **kwargs)

    implicit: list[str] = []
    repo = str(HERE.parent)

    def record_sync(message: Any, category: Any, filename: str, lineno: int, *args: Any, **kwargs: Any) -> None:
        """A sync warning: its torch site and the innermost frame of this repository that led to it."""
        if "synchroniz" not in str(message).lower():
            return
        ours = [f for f in traceback.extract_stack()[:-1]
                if ("neo_train" in f.filename or f.filename.startswith(repo)) and "site-packages" not in f.filename
                and not f.filename.endswith("test_gpu.py")]  # fmt: skip
        stack = traceback.extract_stack()[:-1]
        where = ours[-1:] or stack[-3:]  # no frame of ours: the innermost frames, whatever they are
        via = " > ".join(f"{Path(f.filename).name}:{f.lineno}" for f in where) + " -> "
        implicit.append(f"{via}{Path(filename).name}:{lineno}")

    try:
        _steps(trainer, warmup)
        torch.cuda.synchronize()
        with warnings.catch_warnings(), monkeypatch.context() as mp:
            warnings.simplefilter("always")
            mp.setattr(warnings, "showwarning", record_sync)
            mp.setattr(torch.cuda, "synchronize", counted_sync)
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = _steps(trainer, n)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        losses = [float(v) for v in out]  # read after the window
    finally:
        _close_steps(trainer)
    assert len(losses) == n and all(v == v for v in losses)
    sites = Counter(implicit + explicit)
    per_step = (len(implicit) + len(explicit)) / n
    assert per_step <= SYNCS_PER_STEP, (
        f"{per_step:.1f} host syncs per steady-state step (goal <= {SYNCS_PER_STEP}); "
        f"by call site over {n} steps: {sites.most_common(15)}"
    )


@gpu
def test_positions_where_on_gpu_needs_no_sync() -> None:
    """The hot-row id split and the table-wise sparse output exchange select positions of a
    device mask whose count the host already has (``nonzero_static`` on a GPU): equal to the
    CPU's positions on awkward masks, and no synchronising call."""
    from neo_train.sharding.common import positions_where

    from test_sharding import _position_masks  # noqa: E402  (tests/ is on the path)

    masks = list(_position_masks("cuda"))
    counts = [int(m.sum()) for m in masks]  # read before the checked window
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = [positions_where(m, c) for m, c in zip(masks, counts)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for m, c, g in zip(masks, counts, got):
        assert g.is_cuda and g.tolist() == positions_where(m.cpu(), c).tolist(), (m.numel(), c)


# ==== registry policy (CPU: not GPU tests) =======================================================
@pytest.fixture
def fake_backends(monkeypatch: pytest.MonkeyPatch):
    """A private copy of the registry with stand-in triton and fbgemm backends (both import);
    returns a dict the factories record their calls in."""
    calls: dict[str, Any] = {}

    def factory(name: str):
        def make(tables, optimizer, **kw):
            calls[name] = kw
            return name

        return make

    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    registry.register_backend("triton", factory("triton"), lambda: True)
    registry.register_backend("fbgemm", factory("fbgemm"), lambda: True)
    monkeypatch.setattr(registry, "TRITON_GPU_VERIFIED", None)
    monkeypatch.setattr(registry, "_fbgemm_cuda_reason", lambda: "fbgemm_gpu is its CPU-only build (variant 'cpu')")
    return calls


def test_auto_on_cuda_skips_unverified_triton(fake_backends) -> None:
    assert registry.default_backend("cuda") == "reference"
    reason = registry.default_backend_reason("cuda")
    assert reason.startswith(
        "triton: not yet verified on a GPU (run pytest -m gpu on one, then set kernels.registry.TRITON_GPU_VERIFIED)"
    ), reason
    assert "fbgemm: fbgemm_gpu is its CPU-only build" in reason and reason.endswith("using reference")
    assert "default on cuda: triton: not yet verified" in registry.backend_report("cuda")
    # the CPU default is untouched by the CUDA policy
    assert registry.create_embedding_bag("auto", [TableSpec(4, 4)], SparseOptimizerSpec("sgd")) == "fbgemm"


def test_auto_on_cuda_takes_a_cuda_fbgemm(fake_backends, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_fbgemm_cuda_reason", lambda: "")
    assert registry.default_backend("cuda") == "fbgemm"
    assert registry.default_backend_reason("cuda").endswith("; using fbgemm")
    assert registry.create_embedding_bag(None, [TableSpec(4, 4)], SparseOptimizerSpec("sgd"), device="cuda") == "fbgemm"
    assert fake_backends["fbgemm"]["device"] == "cuda"


def test_auto_on_cuda_takes_verified_triton(fake_backends, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "TRITON_GPU_VERIFIED", {"gpu": "H100 80GB HBM3", "date": "2026-11-22"})
    assert registry.default_backend("cuda:1") == "triton"
    assert registry.default_backend_reason("cuda") == "using triton (GPU tier passed on H100 80GB HBM3, 2026-11-22)"
    made = registry.create_embedding_bag("auto", [TableSpec(4, 4)], SparseOptimizerSpec("sgd"), device="cuda")
    assert made == "triton"
    # verified but not importable here: passed over, saying why
    registry.register_backend("triton", lambda *a, **k: None, lambda: False, lambda: "triton failed to import (X)")
    assert registry.default_backend("cuda") == "reference"
    assert registry.default_backend_reason("cuda").startswith("triton: triton failed to import (X); fbgemm:")


def test_auto_on_cpu_is_unchanged(fake_backends, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU: fbgemm when it imports, else reference; triton is never the CPU default."""
    monkeypatch.setattr(registry, "TRITON_GPU_VERIFIED", {"gpu": "x", "date": "y"})
    assert registry.default_backend("cpu") == "fbgemm"
    assert registry.default_backend_reason("cpu") == "using fbgemm"
    registry.register_backend("fbgemm", lambda *a, **k: None, lambda: False, lambda: "fbgemm_gpu failed to import (Y)")
    assert registry.default_backend("cpu") == "reference"
    assert registry.default_backend_reason("cpu") == "fbgemm: fbgemm_gpu failed to import (Y); using reference"
    report = registry.backend_report()
    assert report.endswith("default on cpu: fbgemm: fbgemm_gpu failed to import (Y); using reference"), report


def test_verified_record_and_fbgemm_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is None or names the GPU and the date; the CUDA check of fbgemm_gpu reads its
    build variant (fbgemm-gpu-cpu says "cpu")."""
    rec = registry.TRITON_GPU_VERIFIED
    assert rec is None or (isinstance(rec, dict) and rec.get("gpu") and rec.get("date")), rec
    probe = registry._fbgemm_cuda_reason.__wrapped__  # uncached
    for variant, expect_reason in (("cpu", True), ("cuda", False), ("rocm", False)):
        fake = type(sys)("fbgemm_gpu")
        fake.__variant__ = variant  # type: ignore[attr-defined]
        monkeypatch.setattr(registry.importlib, "import_module", lambda name, package=None, m=fake: m)
        assert bool(probe()) == expect_reason, variant


@gpu
def test_a_cuda_trace_times_the_stream(tmp_path: Path) -> None:
    """A CUDA communicator's trace (``comm.trace.CudaClock``) gives the stream's times: kernels the
    host only enqueued between two collectives count as compute, a collective the stream stood
    at (a wait on another stream's work) as blocked, though the host returned at once from both."""
    import torch

    from neo_train.comm.interface import Handle
    from neo_train.comm.trace import TracingCommunicator, load_trace

    side = torch.cuda.Stream()

    class StreamComm:  # one rank: a "collective" is 1 M cycles of another stream the caller then waits for
        rank, world_size, device = 0, 1, torch.device("cuda", torch.cuda.current_device())

        def _do(self, x, async_op):
            done = torch.cuda.Event()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.cuda._sleep(1_000_000)
                done.record()

            def wait():
                torch.cuda.current_stream().wait_event(done)
                return x
            return Handle(wait) if async_op else wait()

        def all_reduce(self, x, op="sum", *, async_op=False, tag=""):
            return self._do(x, async_op)

        all_to_all_v = all_gather_v = None  # unused

        def barrier(self):
            pass

    x = torch.ones(4, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    per_million_ms = start.elapsed_time(end)  # the device's time for 1 M cycles
    tc = TracingCommunicator(StreamComm())
    assert tc.recorder.clock is not None  # chosen from the communicator's device
    t_host = time.perf_counter()
    tc.all_reduce(x, tag="a")
    torch.cuda._sleep(3_000_000)  # "compute": enqueued only
    h = tc.all_reduce(x, async_op=True, tag="b")
    torch.cuda._sleep(500_000)
    h.wait()
    host_ms = (time.perf_counter() - t_host) * 1e3
    e = load_trace(tc.dump(tmp_path))
    ms = 1e-6
    assert [x["clock"] for x in e] == ["cuda", "cuda"]
    assert e[0]["call_ns"] * ms == pytest.approx(per_million_ms, rel=0.3)
    assert e[1]["compute_ns"] * ms == pytest.approx(3 * per_million_ms, rel=0.3)
    assert e[1]["wait_compute_ns"] * ms == pytest.approx(0.5 * per_million_ms, rel=0.3)
    assert e[1]["wait_ns"] * ms == pytest.approx(0.5 * per_million_ms, rel=0.5)  # 1 M cycles, 0.5 M behind the launch
    assert host_ms < per_million_ms, f"the host waited ({host_ms:.2f} ms): the test measures nothing"


@gpu
def test_a_calibration_burst_fills_the_device() -> None:
    """A busy calibration's burst on a GPU (``calibrate._busy``) keeps the device computing for the
    time asked and returns when the stream is done: the host's and the device's clocks agree."""
    import torch

    from neo_train.topology.calibrate import _busy

    work = torch.randn(1024, 1024, device="cuda")
    _busy(work, 0.001)  # the product's time measured once
    for seconds in (0.002, 0.01):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        _busy(work, seconds)
        host_s = time.perf_counter() - t0
        assert torch.cuda.current_stream().query(), "the burst returned before the device finished it"
        end.record()
        end.synchronize()
        device_s = start.elapsed_time(end) / 1e3
        assert device_s == pytest.approx(seconds, rel=0.3)
        assert host_s == pytest.approx(device_s, rel=0.3, abs=2e-4)


# ==== 7. the simulator on a GPU trace (issue 14) =================================================
@gpu
@pytest.mark.timeout(600)
def test_sim_validation_on_a_gpu(tmp_path: Path) -> None:
    """``benchmarks/sim_validation.py --quick --device cuda``: ranks training on the GPU (gloo ranks
    sharing it when it is one), the tracer timing the stream, the transport calibrated with device
    tensors; every case is predicted. The goals are the full run's (its figures are in the README):
    here the trace must be a CUDA-clock trace and the prediction finite."""
    out, keep = tmp_path / "v.json", tmp_path / "keep"
    proc = subprocess.run([sys.executable, str(HERE.parent / "benchmarks" / "sim_validation.py"), "--quick",
                           "--device", "cuda", "--json", str(out), "--keep", str(keep)],
                          capture_output=True, text=True, timeout=540, cwd=HERE.parent)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["args"]["device"] == "cuda" and report["machine"]["gpu"] == torch.cuda.get_device_name(0)
    assert {(r["W"], r["plan"]) for r in report["rows"]} == {(2, "tw"), (4, "twrw")}
    for r in report["rows"]:
        assert r["measured_step_ms"] > 0 and r["predicted_step_ms"] > 0 and r["collectives"]
    from neo_train.topology.trace_input import load_trace

    clocks = Counter(e.get("clock", "host") for d in sorted(keep.glob("w*_*")) for es in load_trace(d).values()
                     for e in es if isinstance(e, dict) and e.get("backend"))  # fmt: skip
    assert set(clocks) == {"cuda"}, f"collectives not timed on the stream: {clocks}"
