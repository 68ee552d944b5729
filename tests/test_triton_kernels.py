"""The triton backend against a float64 oracle: per-table nn.EmbeddingBag + textbook sparse optimizers.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before triton
is imported), so sizes are small; with CUDA the same tests run on the GPU.

The oracle owns no fused code: forward is torch's embedding_bag, the gradient is autograd's dense
``.grad``, and the update is written out per optimizer and applied to the rows the batch touched.
float32 weights must match it to float32 rounding; float16/bfloat16 weights follow the rule
|kernel - ref| <= 2 * |torch_same_dtype - ref| + atol, where ref is the oracle in float64 and
torch_same_dtype the same oracle run in the weights' dtype.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest
import torch
import torch.nn.functional as F_nn

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: @triton.jit reads it then
pytest.importorskip("triton", reason="the triton backend needs the triton package")

from neo_train.kernels import SparseOptimizerSpec, TableSpec  # noqa: E402
from neo_train.kernels.triton_backend import TritonEmbeddingBag, triton_available  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL, ATOL = 1e-5, 1e-6


# ---- the oracle ----------------------------------------------------------------------------
class Oracle:
    """Tables in ``dtype`` (forward and dense gradient in it too); optimizer state and update math
    in ``math_dtype`` (default: ``dtype``), the result rounded to ``dtype`` on store."""

    def __init__(self, tables: list[TableSpec], ftm: list[int], opt: SparseOptimizerSpec,
                 init: list[torch.Tensor], dtype: torch.dtype = torch.float64,
                 math_dtype: torch.dtype | None = None) -> None:  # fmt: skip
        self.tables, self.ftm, self.opt, self.dtype = tables, ftm, opt, dtype
        self.math_dtype = math_dtype or dtype
        self.w = [x.to(dtype).clone() for x in init]
        zeros = lambda *s: torch.zeros(*s, dtype=self.math_dtype)  # noqa: E731
        self.state = [
            {"sgd": {}, "adagrad": {"sum": zeros(t.rows, t.dim)}, "rowwise_adagrad": {"momentum": zeros(t.rows)},
             "adam": {"exp_avg": zeros(t.rows, t.dim), "exp_avg_sq": zeros(t.rows, t.dim)}}[opt.kind]
            for t in tables
        ]  # fmt: skip
        self.step = 0
        self.lr = opt.lr

    def pooled(self, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None,
               weights: list[torch.Tensor]) -> torch.Tensor:  # fmt: skip
        F = len(self.ftm)
        B = (offsets.numel() - 1) // F
        outs = []
        for f, t in enumerate(self.ftm):
            lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
            offs = offsets[f * B : (f + 1) * B + 1].long() - lo
            w = torch.ones(hi - lo, dtype=torch.float64) if psw is None else psw[lo:hi].double()
            if self.tables[t].pooling == "mean":
                lengths = offs.diff()
                w = w / lengths.repeat_interleave(lengths).clamp(min=1)
            outs.append(F_nn.embedding_bag(values[lo:hi].long(), weights[t], offs, mode="sum",
                                           per_sample_weights=w.to(self.dtype), include_last_offset=True))  # fmt: skip
        return torch.cat(outs, dim=1)

    def forward(self, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None) -> torch.Tensor:
        return self.pooled(values, offsets, psw, self.w)

    def train_step(self, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None,
                   grad_out: torch.Tensor) -> None:  # fmt: skip
        leaves = [w.clone().requires_grad_() for w in self.w]
        (self.pooled(values, offsets, psw, leaves) * grad_out.to(self.dtype)).sum().backward()
        F = len(self.ftm)
        B = (offsets.numel() - 1) // F
        self.step += 1
        o = self.opt
        for t, leaf in enumerate(leaves):
            ids = [values[int(offsets[f * B]) : int(offsets[(f + 1) * B])] for f in range(F) if self.ftm[f] == t]
            rows = torch.unique(torch.cat(ids).long()) if ids else torch.zeros(0, dtype=torch.int64)
            if rows.numel() == 0:
                continue
            w = self.w[t][rows].to(self.math_dtype)
            g = leaf.grad[rows].to(self.math_dtype) + o.weight_decay * w
            st = self.state[t]
            if o.kind == "sgd":
                w = w - self.lr * g
            elif o.kind == "adagrad":
                st["sum"][rows] += g * g
                w = w - self.lr * g / (st["sum"][rows].sqrt() + o.eps)
            elif o.kind == "rowwise_adagrad":
                st["momentum"][rows] += (g * g).mean(dim=1)
                w = w - self.lr * g / (st["momentum"][rows].sqrt() + o.eps)[:, None]
            else:  # adam, bias-corrected with the global step
                st["exp_avg"][rows] = o.beta1 * st["exp_avg"][rows] + (1 - o.beta1) * g
                st["exp_avg_sq"][rows] = o.beta2 * st["exp_avg_sq"][rows] + (1 - o.beta2) * g * g
                m_hat = st["exp_avg"][rows] / (1 - o.beta1**self.step)
                v_hat = st["exp_avg_sq"][rows] / (1 - o.beta2**self.step)
                w = w - self.lr * m_hat / (v_hat.sqrt() + o.eps)
            self.w[t][rows] = w.to(self.dtype)


# ---- batches and checks --------------------------------------------------------------------
def _seed(request: pytest.FixtureRequest) -> int:
    return zlib.crc32(request.node.name.encode())


def _spec(pooling: str, dims: tuple[int, int, int, int] = (3, 8, 17, 8)) -> tuple[list[TableSpec], list[int]]:
    """Dims 3/8/17 (not multiples of any block), a 1-row table, a table shared by two features."""
    mean = "mean" if pooling == "mixed" else "sum"
    tables = [TableSpec(50, dims[0], "sum", "t0"), TableSpec(1, dims[1], mean, "t1_one_row"),
              TableSpec(30, dims[2], "sum", "t2_shared"), TableSpec(20, dims[3], mean, "t3")]  # fmt: skip
    return tables, [0, 1, 2, 3, 2]


def _batch(gen: torch.Generator, tables: list[TableSpec], ftm: list[int], B: int, weighted: bool, kind: str,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """kind: "random"; "dups" (feature 0 empty, ids from a tiny range); "empty" (every bag empty)."""
    F = len(ftm)
    lengths = torch.randint(0, 5, (F, B), generator=gen)
    if kind == "empty":
        lengths.zero_()
    if kind == "dups":
        lengths[0] = 0
        lengths[1:, 0] = 4
    rows = torch.tensor([tables[t].rows for t in ftm])
    span = (rows.clamp(max=3) if kind == "dups" else rows).repeat_interleave(lengths.sum(1))
    values = (torch.rand(span.numel(), generator=gen) * span).long()
    offsets = torch.zeros(F * B + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    psw = torch.rand(values.numel(), generator=gen) * 2 - 0.5 if weighted else None
    return values, offsets, psw


def _dev(*xs: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if x is None else x.to(DEVICE) for x in xs]


def _model(tables: list[TableSpec], ftm: list[int], opt: SparseOptimizerSpec, **kw) -> TritonEmbeddingBag:
    return TritonEmbeddingBag(tables, opt, feature_table_map=ftm, device=DEVICE, **kw)


def _step(model: TritonEmbeddingBag, oracle: Oracle, batch, grad_out: torch.Tensor) -> None:
    """One training step of both; checks the forward outputs on the way."""
    values, offsets, psw = batch
    out = model(*_dev(values, offsets, psw))
    torch.testing.assert_close(out.detach().cpu().double(), oracle.forward(values, offsets, psw), rtol=RTOL,
                               atol=ATOL, msg=lambda m: f"forward: {m}")  # fmt: skip
    (out * grad_out.to(DEVICE)).sum().backward()
    oracle.train_step(values, offsets, psw, grad_out)


def _check(model: TritonEmbeddingBag, oracle: Oracle, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    for t in range(len(oracle.tables)):
        torch.testing.assert_close(model.get_table(t).cpu().double(), oracle.w[t], rtol=rtol, atol=atol,
                                   msg=lambda m: f"{what} table {t} weights: {m}")  # fmt: skip
        got = model.get_state(t)
        assert set(got) == set(oracle.state[t])
        for name, ref in oracle.state[t].items():
            torch.testing.assert_close(got[name].cpu().double(), ref, rtol=rtol, atol=atol,
                                       msg=lambda m: f"{what} table {t} state {name}: {m}")  # fmt: skip
    assert model.optimizer_step == oracle.step


# ---- parity --------------------------------------------------------------------------------
CASES = [  # (pooling, weighted, weight_decay, hot_row_threshold, dims, B): every optimizer runs each
    pytest.param("sum", False, 0.0, 64, (3, 8, 17, 8), 5, id="sum-unweighted"),
    pytest.param("mixed", True, 0.1, 1, (3, 8, 17, 8), 5, id="mixed-weighted-decay-allhot"),  # repeats pre-summed
    # dims that are multiples of 4 (the vector-width hints apply) and several programs per feature
    pytest.param("mixed", True, 0.0, 3, (4, 16, 96, 8), 40, id="aligned-dims-B40"),
]


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("pooling,weighted,wd,hot,dims,B", CASES)
def test_matches_oracle(request: pytest.FixtureRequest, kind: str, pooling: str, weighted: bool, wd: float,
                        hot: int, dims: tuple[int, int, int, int], B: int) -> None:  # fmt: skip
    tables, ftm = _spec(pooling, dims)
    opt = SparseOptimizerSpec(kind, lr=0.05, weight_decay=wd)
    seed = _seed(request)
    model = _model(tables, ftm, opt, seed=seed, hot_row_threshold=hot, hot_row_chunk=2)
    oracle = Oracle(tables, ftm, opt, [model.get_table(t).cpu() for t in range(len(tables))])
    gen = torch.Generator().manual_seed(seed)
    for step, kind_ in enumerate(["random", "dups", "empty", "random"]):
        if step == 3:  # the rate must reach the kernel
            model.set_learning_rate(opt.lr * 0.5)
            oracle.lr = opt.lr * 0.5
        batch = _batch(gen, tables, ftm, B, weighted, kind_)
        grad_out = torch.randn(B, model.total_dim, generator=gen)
        _step(model, oracle, batch, grad_out)
        _check(model, oracle, f"step {step} ({kind_})")


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_huge_bag_and_hot_row(request: pytest.FixtureRequest, kind: str) -> None:
    """One bag of 500 ids; one row hit 2000 times, across bags and two features sharing its table
    (the hot-row path); empty bags in between; dims 17 and 3."""
    tables = [TableSpec(1000, 17, "sum", "big"), TableSpec(40, 3, "mean", "small")]
    ftm = [0, 1, 0]
    B = 8
    opt = SparseOptimizerSpec(kind, lr=0.05)
    seed = _seed(request)
    model = _model(tables, ftm, opt, seed=seed)
    oracle = Oracle(tables, ftm, opt, [model.get_table(t).cpu() for t in range(len(tables))])
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([[500, 0, 3, 3, 0, 3, 3, 3], [2, 0, 5, 1, 0, 0, 3, 1], [250] * 8])  # (F, B)
    big = torch.randint(0, 1000, (515,), generator=gen)
    big[503::3] = 7  # row 7 in the small bags too
    values = torch.cat([big, torch.randint(0, 40, (12,), generator=gen), torch.full((2000,), 7)])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    psw = torch.rand(values.numel(), generator=gen)
    for step in range(2):
        grad_out = torch.randn(B, model.total_dim, generator=gen)
        _step(model, oracle, (values, offsets, psw), grad_out)
        _check(model, oracle, f"step {step}", rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("kind", ["rowwise_adagrad", "adam"])
def test_low_precision_weights(request: pytest.FixtureRequest, dtype: torch.dtype, kind: str) -> None:
    """|kernel - ref| <= 2 |torch in dtype - ref| + atol for the output, weights and state.

    "torch in dtype" is what plain PyTorch does with half parameters: forward and gradient in the
    weights' dtype, optimizer state and update math in float32 (base.py: state is always float32)."""
    tables, ftm = _spec("mixed")
    opt = SparseOptimizerSpec(kind, lr=0.05)
    seed = _seed(request)
    model = _model(tables, ftm, opt, seed=seed, weight_dtype=dtype)
    init = [model.get_table(t).cpu() for t in range(len(tables))]  # exact: float32 holds every half
    ref, same = Oracle(tables, ftm, opt, init), Oracle(tables, ftm, opt, init, dtype, torch.float32)
    gen = torch.Generator().manual_seed(seed)
    atol = 1e-6

    def bound(kernel: torch.Tensor, torch_same: torch.Tensor, exact: torch.Tensor, what: str) -> None:
        err, base = (kernel.double() - exact).abs().max().item(), (torch_same.double() - exact).abs().max().item()
        assert err <= 2 * base + atol, f"{what}: kernel error {err:.3g} > 2 * torch-{dtype} error {base:.3g} + {atol}"

    for step in range(3):
        batch = _batch(gen, tables, ftm, 4, True, "dups" if step == 1 else "random")
        grad_out = torch.randn(4, model.total_dim, generator=gen)
        values, offsets, psw = batch
        out = model(*_dev(values, offsets, psw))
        bound(out.detach().cpu(), same.forward(*batch), ref.forward(*batch), f"step {step} forward")
        (out * grad_out.to(DEVICE)).sum().backward()
        ref.train_step(*batch, grad_out)
        same.train_step(*batch, grad_out)
        for t in range(len(tables)):
            bound(model.get_table(t).cpu(), same.w[t], ref.w[t], f"step {step} table {t}")
            for name, exact in ref.state[t].items():
                bound(model.get_state(t)[name].cpu(), same.state[t][name], exact, f"step {step} table {t} {name}")


def _train(seed: int, steps: int, **kw) -> TritonEmbeddingBag:
    tables, ftm = _spec("mixed")
    model = _model(tables, ftm, SparseOptimizerSpec("adam", lr=0.05, weight_decay=0.01), seed=seed, **kw)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        values, offsets, psw = _batch(gen, tables, ftm, 6, True, "dups" if step % 2 else "random")
        grad_out = torch.randn(6, model.total_dim, generator=gen)
        (model(*_dev(values, offsets, psw)) * grad_out.to(DEVICE)).sum().backward()
    return model


@pytest.mark.parametrize("variant", ["fp32", "fp16-stochastic-rounding-allhot"])
def test_deterministic(variant: str) -> None:
    """Two identical runs give bit-identical weights and state (no atomics, stable sort)."""
    kw = {} if variant == "fp32" else dict(weight_dtype=torch.float16, stochastic_rounding=True, hot_row_threshold=1,
                                          hot_row_chunk=1)  # fmt: skip
    a, b = _train(11, 3, **kw), _train(11, 3, **kw)
    assert torch.equal(a.weights, b.weights)
    for name in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(a, f"state_{name}"), getattr(b, f"state_{name}"))


def test_stochastic_rounding() -> None:
    """Seeded: reproducible, seed-dependent, and each weight lands on a float16 neighbour of the
    round-to-nearest result (within one float16 ulp per step)."""
    kw = dict(weight_dtype=torch.float16, stochastic_rounding=True)
    a, b = _train(5, 2, **kw), _train(5, 2, **kw)
    nearest, reseeded = _train(5, 2, weight_dtype=torch.float16), _train(5, 2, stochastic_rounding_seed=9, **kw)
    assert torch.equal(a.weights, b.weights)
    assert not torch.equal(a.weights, nearest.weights)  # it did not round to nearest
    assert not torch.equal(a.weights, reseeded.weights)
    ulp = torch.finfo(torch.float16).eps * nearest.weights.float().abs().clamp(min=2**-14)
    assert ((a.weights.float() - nearest.weights.float()).abs() <= 2 * ulp).all()  # two steps, one ulp each


# ---- launcher, accessors, inputs -----------------------------------------------------------
def test_pool_launcher_matches_its_reference() -> None:
    """triton_forward.pool against the PyTorch reference over the same storage; int32 inputs."""
    from neo_train.kernels import triton_forward as fw

    tables, ftm = _spec("sum")
    model = _model(tables, ftm, SparseOptimizerSpec("sgd"), weight_dtype=torch.bfloat16, seed=2)
    gen = torch.Generator().manual_seed(2)
    values, offsets, psw = _dev(*_batch(gen, tables, ftm, 7, True, "random"))
    B = 7
    args = (values.int(), offsets.int(), psw, model.weights, model._feat_meta)
    got = fw.pool(*args, fw.pool_work_list(model._feat_meta, model._feat_class, B), B, model.total_dim,
                  class_mask=sum(1 << c for c in set(model._feat_class)), loop_top=False,
                  col_values=model._col_values)  # fmt: skip
    torch.testing.assert_close(got, fw.pool_reference(*args, B, model.total_dim), rtol=1e-6, atol=1e-6)


def test_wide_dims_loop_over_columns(request: pytest.FixtureRequest) -> None:
    """A dim above the widest class (512) walks the row in column chunks, rowwise in two passes."""
    tables, ftm = [TableSpec(6, 600), TableSpec(5, 3)], [0, 1]
    opt = SparseOptimizerSpec("rowwise_adagrad", lr=0.1, weight_decay=0.1)
    model = _model(tables, ftm, opt, seed=1, hot_row_threshold=2)
    oracle = Oracle(tables, ftm, opt, [model.get_table(t).cpu() for t in range(2)])
    gen = torch.Generator().manual_seed(1)
    for step in range(2):
        batch = _batch(gen, tables, ftm, 3, True, "dups")
        grad_out = torch.randn(3, model.total_dim, generator=gen)
        _step(model, oracle, batch, grad_out)
        _check(model, oracle, f"step {step}")


def test_accessors_padding_and_zero_batch() -> None:
    tables = [TableSpec(6, 3), TableSpec(3, 8)]
    for kind in ("sgd", "adagrad", "rowwise_adagrad", "adam"):
        m = _model(tables, [0, 1], SparseOptimizerSpec(kind))
        for t, spec in enumerate(tables):
            w = torch.randn(spec.rows, spec.dim)
            m.set_table(t, w)
            assert torch.equal(m.get_table(t).cpu(), w)
            state = {k: torch.rand(v.shape) for k, v in m.get_state(t).items()}
            m.set_state(t, state)
            assert all(torch.equal(v.cpu(), state[k]) for k, v in m.get_state(t).items())
            with pytest.raises(ValueError, match="shape"):
                m.set_table(t, torch.zeros(spec.rows + 1, spec.dim))
        m.set_optimizer_step(7)
        assert m.optimizer_step == 7
    assert not m.weights[:24].view(6, 4)[:, 3].any()  # dim 3 is stored with stride 4: the padding stays 0
    out = m(torch.zeros(0, dtype=torch.int64, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE))
    assert out.shape == (0, 11)
    out.sum().backward()
    assert m.optimizer_step == 8


def test_availability_and_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    assert triton_available()
    with pytest.raises(ValueError, match="stochastic_rounding"):
        _model([TableSpec(4, 4)], [0], SparseOptimizerSpec("sgd"), stochastic_rounding=True)
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert not triton_available()
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            TritonEmbeddingBag([TableSpec(4, 4)], SparseOptimizerSpec("sgd"))
    # ``import neo_train.kernels`` must not import triton (CPU-only installs).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import sys, neo_train.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plan_segments_matches_a_plain_grouping(seed: int) -> None:
    """plan_segments (one host read, sizes from nonzero_static, a bounded partial list) against
    the obvious construction (torch.unique_consecutive): rows, runs, table ranges, hot rows, and
    the partial list (its real entries cover each hot row's ids once, in order; the padding
    entries past P have dim 0). Skewed ids: some rows take hundreds of ids; one table unused."""
    from neo_train.kernels.triton_backward import plan_segments

    gen = torch.Generator().manual_seed(seed)
    rows, dims, ftm = [5, 300, 7, 1000], [4, 8, 3, 16], [0, 1, 1, 3]  # table 2 has no feature
    B, F = 37, len(ftm)
    lengths = torch.randint(0, 30, (F * B,), generator=gen)
    lengths[torch.rand(F * B, generator=gen) < 0.2] = 0
    feat = torch.arange(F).repeat_interleave(lengths.view(F, B).sum(1))
    u = torch.rand(feat.numel(), generator=gen, dtype=torch.float64)
    values = (u**4 * torch.tensor(rows)[torch.tensor(ftm)][feat]).long()
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    tab_row_base = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()])
    feat_row_base = tab_row_base[torch.tensor(ftm)]
    thr, chunk = 20, 4
    s = plan_segments(values, offsets, None, B, feat_row_base, tab_row_base, torch.tensor(dims), sum(rows), thr, chunk)
    keys = values + feat_row_base[feat]
    sk, order = torch.sort(keys, stable=True)
    uniq, counts = torch.unique_consecutive(sk, return_counts=True)
    assert torch.equal(s.uniq.long(), uniq) and torch.equal(s.seg, torch.cat([torch.zeros(1), counts.cumsum(0)]).long())
    tab_u = torch.searchsorted(uniq, tab_row_base)
    assert torch.equal(s.tab_u, tab_u) and s.tab_u_host == tab_u.tolist()
    bag = torch.arange(F * B).repeat_interleave(lengths)
    assert torch.equal(s.bag.long(), bag[order])
    hot = torch.nonzero(counts > thr).squeeze(1)
    assert hot.numel() > 0 and torch.equal(s.hot_rows, hot)
    assert torch.equal(s.hot_tab, torch.searchsorted(tab_u, hot, right=True) - 1)
    n_chunks = (counts[hot] + s.chunk - 1) // s.chunk
    assert torch.equal(s.part_index[1:] - s.part_index[:-1], torch.zeros_like(counts).index_put((hot,), n_chunks))
    P = int(n_chunks.sum())
    real = s.chunk_dim > 0
    assert int(real.sum()) == P and bool(real[:P].all()) and s.chunk_u.numel() >= P
    want_u = hot.repeat_interleave(n_chunks)
    want_j0 = torch.cat([torch.arange(int(n)) * s.chunk for n in n_chunks])
    assert torch.equal(s.chunk_u[:P], want_u) and torch.equal(s.chunk_j0[:P], want_j0)
    assert torch.equal(s.chunk_dim[:P], torch.tensor(dims)[s.hot_tab.repeat_interleave(n_chunks)])
    # no ids: nothing to update
    empty = plan_segments(values[:0], torch.zeros(F * B + 1, dtype=torch.int64), None, B, feat_row_base,
                          tab_row_base, torch.tensor(dims), sum(rows), thr, chunk)  # fmt: skip
    assert empty.uniq.numel() == 0 and empty.tab_u_host == [0] * (len(rows) + 1)
