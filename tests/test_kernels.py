"""Every kernel backend against an oracle of per-table nn.EmbeddingBag + textbook sparse optimizers.

The oracle owns no fused code: forward is torch's EmbeddingBag (sum / mean / per_sample_weights),
gradients are autograd's dense ``.grad``, and the optimizer update is written out below and
applied to the rows the batch's ids touched. Each backend must match it in forward values,
every table's weights and every table's optimizer state, step after step.

Tolerances: float32 rounding (rtol 1e-5, atol 1e-6); backends and oracle sum duplicate ids in
different orders, so bit equality is not expected.
"""
from __future__ import annotations

import functools
import os
import zlib
from typing import Any

import pytest
import torch
from torch import nn

from neo_train.kernels import (
    SPARSE_OPTIMIZERS,
    FusedEmbeddingBag,
    SparseOptimizerSpec,
    TableSpec,
    available_backends,
    backend_report,
    create_embedding_bag,
    default_backend,
)
from neo_train.kernels import registry

ALL_BACKENDS = registry.registered_backends()  # available or not: unavailable ones skip
RTOL, ATOL = 1e-5, 1e-6


def _need(backend: str) -> None:
    if backend not in available_backends():
        pytest.skip(f"backend {backend!r} unavailable: {registry.backend_unavailable_reason(backend)}")
    if backend == "triton" and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        # these CPU-tensor tests reach triton only through its interpreter; on a GPU machine
        # tests/test_triton_kernels.py runs the same oracle checks on the device
        pytest.skip("triton runs on CUDA tensors here: covered by tests/test_triton_kernels.py")


@functools.cache
def _caps(backend: str) -> dict[str, Any]:
    """What a backend supports, read from a tiny instance (ClassVars may differ per device)."""
    m = create_embedding_bag(backend, [TableSpec(4, 4)], SparseOptimizerSpec("sgd"))
    # a backend may take weight decay with one optimizer's instance only (fbgemm's generic CPU loop)
    decays = [k for k in m.supported_optimizers if k in getattr(
        create_embedding_bag(backend, [TableSpec(4, 4)], SparseOptimizerSpec(k)), "weight_decay_optimizers", SPARSE_OPTIMIZERS)]
    return {
        "optimizers": tuple(m.supported_optimizers),
        "dim_multiple": int(getattr(m, "dim_multiple", 1)),
        "weight_decay": tuple(decays),
        "dtypes": tuple(m.supported_weight_dtypes),
    }


def _seed(request: pytest.FixtureRequest) -> int:
    """A different, reproducible seed for every parametrisation."""
    return zlib.crc32(request.node.name.encode())


def _round_dim(d: int, multiple: int) -> int:
    return -(-d // multiple) * multiple


def _model_spec(backend: str, pooling: str) -> tuple[list[TableSpec], list[int]]:
    """Dims 3/8/17 (rounded up where a backend needs multiples), a 1-row table, a shared table
    used by two non-adjacent features, and optional mean pooling."""
    m = _caps(backend)["dim_multiple"]
    mean = "mean" if pooling == "mixed" else "sum"
    tables = [
        TableSpec(50, _round_dim(3, m), "sum", "t0"),
        TableSpec(1, _round_dim(8, m), mean, "t1_one_row"),
        TableSpec(30, _round_dim(17, m), "sum", "t2_shared"),
        TableSpec(20, _round_dim(8, m), mean, "t3"),
    ]
    return tables, [0, 1, 2, 3, 2]


# ---- the oracle ----------------------------------------------------------------------------
class Oracle:
    """Per-table nn.EmbeddingBag + the textbook sparse optimizer, applied to touched rows."""

    def __init__(self, tables: list[TableSpec], ftm: list[int], opt: SparseOptimizerSpec, init: list[torch.Tensor]):
        self.tables, self.ftm, self.opt = tables, ftm, opt
        self.bags = [nn.EmbeddingBag(t.rows, t.dim, mode="sum") for t in tables]
        for bag, w in zip(self.bags, init):
            bag.weight.data.copy_(w)
        self.state = [
            {
                "sgd": {},
                "adagrad": {"sum": torch.zeros(t.rows, t.dim)},
                "rowwise_adagrad": {"momentum": torch.zeros(t.rows)},
                "adam": {"exp_avg": torch.zeros(t.rows, t.dim), "exp_avg_sq": torch.zeros(t.rows, t.dim)},
            }[opt.kind]
            for t in tables
        ]
        self.step = 0
        self.lr = opt.lr

    def forward(self, values: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None) -> torch.Tensor:
        F = len(self.ftm)
        B = (offsets.numel() - 1) // F
        outs = []
        for f, t in enumerate(self.ftm):
            lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
            ids = values[lo:hi]
            offs = offsets[f * B : (f + 1) * B] - lo  # (B,) bag starts
            bag = self.bags[t]
            if self.tables[t].pooling == "mean" and psw is None:
                out = nn.functional.embedding_bag(ids, bag.weight, offs, mode="mean")
            elif self.tables[t].pooling == "mean":
                lengths = torch.diff(offsets[f * B : (f + 1) * B + 1])
                w = psw[lo:hi] / lengths.repeat_interleave(lengths).clamp(min=1)  # weighted mean
                out = bag(ids, offs, per_sample_weights=w)
            else:
                out = bag(ids, offs, per_sample_weights=None if psw is None else psw[lo:hi])
            outs.append(out)
        return torch.cat(outs, dim=1)

    def step_update(self, values: torch.Tensor, offsets: torch.Tensor) -> None:
        """Apply the optimizer to each table's touched rows using the dense .grad."""
        F = len(self.ftm)
        B = (offsets.numel() - 1) // F
        self.step += 1
        o = self.opt
        for t, bag in enumerate(self.bags):
            ids = [values[int(offsets[f * B]) : int(offsets[(f + 1) * B])] for f in range(F) if self.ftm[f] == t]
            rows = torch.unique(torch.cat(ids)) if ids else torch.zeros(0, dtype=torch.int64)
            grad = bag.weight.grad
            bag.weight.grad = None
            if rows.numel() == 0:
                continue
            w = bag.weight.data[rows]
            g = grad[rows] + o.weight_decay * w
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
            bag.weight.data[rows] = w


# ---- batches -------------------------------------------------------------------------------
def _batch(
    gen: torch.Generator, tables: list[TableSpec], ftm: list[int], B: int, weighted: bool, kind: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """kind: "random"; "dups" (feature 0 empty, ids from a tiny range so they repeat inside and
    across bags); "empty" (every bag of every feature empty)."""
    F = len(ftm)
    lengths = torch.randint(0, 5, (F, B), generator=gen)
    if kind == "empty":
        lengths.zero_()
    if kind == "dups":
        lengths[0] = 0
        lengths[1:, 0] = 4  # at least one long bag per feature: in-bag repeats are likely
    rows = torch.tensor([tables[t].rows for t in ftm])
    span = rows.clamp(max=3) if kind == "dups" else rows
    per_id_span = span.repeat_interleave(lengths.sum(1))
    values = (torch.rand(per_id_span.numel(), generator=gen) * per_id_span).long()
    offsets = torch.zeros(F * B + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    psw = torch.rand(values.numel(), generator=gen) * 2 - 0.5 if weighted else None
    return values, offsets, psw


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def _check_against_oracle(model: FusedEmbeddingBag, oracle: Oracle, step: int) -> None:
    for t in range(len(oracle.tables)):
        _assert_close(model.get_table(t), oracle.bags[t].weight.data, f"step {step} table {t} weights")
        got = model.get_state(t)
        assert set(got) == set(oracle.state[t]), f"table {t} state keys"
        for name, ref in oracle.state[t].items():
            _assert_close(got[name], ref, f"step {step} table {t} state {name}")
    assert model.optimizer_step == oracle.step


def _run_parity(
    request: pytest.FixtureRequest, backend: str, opt: SparseOptimizerSpec, pooling: str, weighted: bool,
    **options: object,
) -> FusedEmbeddingBag:
    tables, ftm = _model_spec(backend, pooling)
    seed = _seed(request)
    model = create_embedding_bag(backend, tables, opt, feature_table_map=ftm, seed=seed, **options)
    oracle = Oracle(tables, ftm, opt, [model.get_table(t) for t in range(len(tables))])
    gen = torch.Generator().manual_seed(seed)
    B = 5
    for step, kind in enumerate(["random", "dups", "empty", "random"]):
        if step == 3:  # the rate must reach the backend's kernel (set before forward)
            model.set_learning_rate(opt.lr * 0.5)
            oracle.lr = opt.lr * 0.5
        values, offsets, psw = _batch(gen, tables, ftm, B, weighted, kind)
        grad_out = torch.randn(B, model.total_dim, generator=gen)
        out = model(values, offsets, psw)
        ref = oracle.forward(values, offsets, psw)
        _assert_close(out.detach(), ref.detach(), f"step {step} ({kind}) forward")
        (out * grad_out).sum().backward()
        (ref * grad_out).sum().backward()
        oracle.step_update(values, offsets)
        _check_against_oracle(model, oracle, step)
    return model


# ---- parity --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("kind", SPARSE_OPTIMIZERS)
@pytest.mark.parametrize("pooling", ["sum", "mixed"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_matches_oracle(request: pytest.FixtureRequest, backend: str, kind: str, pooling: str, weighted: bool) -> None:
    _need(backend)
    if kind not in _caps(backend)["optimizers"]:
        pytest.skip(f"{backend} does not support {kind} here (its refusal is tested below)")
    _run_parity(request, backend, SparseOptimizerSpec(kind, lr=0.05), pooling, weighted)



@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("kind", SPARSE_OPTIMIZERS)
def test_apply_gradients_is_the_backward_of_the_lookup(request: pytest.FixtureRequest, backend: str, kind: str) -> None:
    """``apply_gradients(values, offsets, g)`` (the data-parallel replay; no forward on backends
    with ``_backward_update``) updates tables, optimizer state and the step counter exactly as
    the backward of ``g`` through the unweighted lookup does: mean-pooled features (their 1/L),
    a shared table, repeated ids, an all-empty batch, B = 1; step after step."""
    _need(backend)
    if kind not in _caps(backend)["optimizers"]:
        pytest.skip(f"{backend} does not support {kind} here")
    tables, ftm = _model_spec(backend, "mixed")
    seed = _seed(request)
    opt = SparseOptimizerSpec(kind, lr=0.05)
    via_backward = create_embedding_bag(backend, tables, opt, feature_table_map=ftm, seed=seed)
    direct = create_embedding_bag(backend, tables, opt, feature_table_map=ftm, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    for step, (kind_b, B) in enumerate([("random", 5), ("dups", 5), ("empty", 3), ("random", 1), ("dups", 7)]):
        values, offsets, _ = _batch(gen, tables, ftm, B, False, kind_b)
        g = torch.randn(B, direct.total_dim, generator=gen)
        torch.autograd.backward(via_backward(values, offsets, None), g)
        direct.apply_gradients(values, offsets, g)
        for t in range(len(tables)):
            torch.testing.assert_close(direct.get_table(t), via_backward.get_table(t), rtol=0, atol=0,
                                       msg=lambda m: f"step {step} ({kind_b}) table {t}: {m}")
            for name, ref in via_backward.get_state(t).items():
                torch.testing.assert_close(direct.get_state(t)[name], ref, rtol=0, atol=0,
                                           msg=lambda m: f"step {step} ({kind_b}) table {t} {name}: {m}")
        assert direct.optimizer_step == via_backward.optimizer_step == step + 1

@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("kind", SPARSE_OPTIMIZERS)
def test_weight_decay(request: pytest.FixtureRequest, backend: str, kind: str) -> None:
    """L2 decay joins the gradient; a backend that cannot do it must refuse, not ignore it."""
    _need(backend)
    caps = _caps(backend)
    if kind not in caps["optimizers"]:
        pytest.skip(f"{backend} does not support {kind} here")
    opt = SparseOptimizerSpec(kind, lr=0.05, weight_decay=0.1)
    if kind not in caps["weight_decay"]:
        tables, ftm = _model_spec(backend, "sum")
        with pytest.raises(ValueError, match="weight_decay"):
            create_embedding_bag(backend, tables, opt, feature_table_map=ftm)
        return
    _run_parity(request, backend, opt, "mixed", weighted=True)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_half_weights(request: pytest.FixtureRequest, backend: str) -> None:
    """float16 weights: float32 math, rounded on store. Tolerance is float16's: one rounding of
    a weight of size <= 1 is <= 2^-11 (4.9e-4) relative; a few steps compound to ~2e-3."""
    _need(backend)
    if torch.float16 not in _caps(backend)["dtypes"]:
        pytest.skip(f"{backend} has no float16 weights")
    tables, ftm = _model_spec(backend, "mixed")
    opt = SparseOptimizerSpec("rowwise_adagrad", lr=0.05)
    seed = _seed(request)
    model, again = (
        create_embedding_bag(backend, tables, opt, feature_table_map=ftm, weight_dtype=torch.float16, seed=seed)
        for _ in range(2)
    )
    oracle = Oracle(tables, ftm, opt, [model.get_table(t) for t in range(len(tables))])
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        values, offsets, psw = _batch(gen, tables, ftm, 4, True, "random")
        grad_out = torch.randn(4, model.total_dim, generator=gen)
        out = model(values, offsets, psw)
        ref = oracle.forward(values, offsets, psw)
        torch.testing.assert_close(out.detach(), ref.detach(), rtol=2e-3, atol=2e-3)
        (out * grad_out).sum().backward()
        (ref * grad_out).sum().backward()
        (again(values, offsets, psw) * grad_out).sum().backward()
        oracle.step_update(values, offsets)
    for t in range(len(tables)):
        # Round to nearest, never stochastic rounding: two runs are bit-identical.
        assert torch.equal(model.get_table(t), again.get_table(t)), f"table {t}: float16 update not reproducible"
        torch.testing.assert_close(model.get_table(t), oracle.bags[t].weight.data, rtol=4e-3, atol=4e-3)
        torch.testing.assert_close(model.get_state(t)["momentum"], oracle.state[t]["momentum"], rtol=1e-2, atol=1e-4)


def test_backends_start_from_the_same_tables() -> None:
    """Switching backends must not change a run's starting point: same seed, same bits."""
    backends = available_backends()
    tables = [TableSpec(7, 4), TableSpec(1, 8), TableSpec(33, 12)]
    opt = SparseOptimizerSpec("sgd")
    models = [create_embedding_bag(b, tables, opt, seed=3) for b in backends]
    for t, spec in enumerate(tables):
        first = models[0].get_table(t)
        bound = (1.0 / spec.rows) ** 0.5
        assert first.abs().max() <= bound and first.std() > 0
        for m in models[1:]:
            assert torch.equal(m.get_table(t), first), f"{m.backend_name} table {t} differs from {backends[0]}"
    other = create_embedding_bag(backends[0], tables, opt, seed=4)
    assert not torch.equal(other.get_table(2), models[0].get_table(2))


# ---- state accessors -----------------------------------------------------------------------
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_state_roundtrip(backend: str) -> None:
    _need(backend)
    tables = [TableSpec(6, 4), TableSpec(3, 8)]
    for kind in _caps(backend)["optimizers"]:
        m = create_embedding_bag(backend, tables, SparseOptimizerSpec(kind))
        for t, spec in enumerate(tables):
            w = torch.randn(spec.rows, spec.dim)
            m.set_table(t, w)
            assert torch.equal(m.get_table(t), w)
            state = {k: torch.rand(v.shape) for k, v in m.get_state(t).items()}
            m.set_state(t, state)
            for k, v in m.get_state(t).items():
                assert torch.equal(v, state[k]), (kind, t, k)
            with pytest.raises(ValueError, match="shape"):
                m.set_table(t, torch.zeros(spec.rows + 1, spec.dim))
        m.set_optimizer_step(7)
        assert m.optimizer_step == 7


# ---- input errors --------------------------------------------------------------------------
def _small(backend: str) -> FusedEmbeddingBag:
    return create_embedding_bag(
        backend, [TableSpec(10, 4, name="users"), TableSpec(5, 8, name="items")], SparseOptimizerSpec("sgd"),
        feature_table_map=[0, 1], feature_names=["user_id", "item_id"],
    )  # fmt: skip


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_out_of_range_ids(backend: str) -> None:
    _need(backend)
    m = _small(backend)
    offsets = torch.tensor([0, 1, 2, 3, 4])  # F=2, B=2
    with pytest.raises(ValueError, match=r"feature 'item_id'.*id 5 out of range \[0, 5\)"):
        m(torch.tensor([1, 2, 0, 5]), offsets)
    with pytest.raises(ValueError, match=r"feature 'user_id'.*id -1 out of range"):
        m(torch.tensor([1, -1, 0, 1]), offsets)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_bad_offsets(backend: str) -> None:
    _need(backend)
    m = _small(backend)
    values = torch.tensor([1, 2, 0, 4])
    with pytest.raises(ValueError, match="F\\*B\\+1"):
        m(values, torch.tensor([0, 1, 2, 4]))  # 4 entries: not F*B+1 for F=2
    with pytest.raises(ValueError, match="F\\*B\\+1"):
        m(values, torch.zeros(0, dtype=torch.int64))
    with pytest.raises(ValueError, match="len\\(values\\)"):
        m(values, torch.tensor([0, 1, 2, 3, 5]))  # claims 5 ids, 4 given
    with pytest.raises(ValueError, match="non-decreasing"):
        m(values, torch.tensor([0, 3, 2, 3, 4]))
    with pytest.raises(ValueError, match="per_sample_weights"):
        m(values, torch.tensor([0, 1, 2, 3, 4]), torch.ones(3))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_zero_batch_and_int32_inputs(backend: str) -> None:
    _need(backend)
    m = _small(backend)
    out = m(torch.zeros(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))  # B = 0
    assert out.shape == (0, 12)
    out.sum().backward()
    v32, o32 = torch.tensor([1, 2, 0, 4], dtype=torch.int32), torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    torch.testing.assert_close(m(v32, o32), m(v32.long(), o32.long()), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_unsupported_optimizer_is_refused(backend: str) -> None:
    _need(backend)
    caps = _caps(backend)
    for kind in SPARSE_OPTIMIZERS:
        if kind in caps["optimizers"]:
            continue
        with pytest.raises(ValueError, match=f"backend '{backend}' does not support sparse optimizer '{kind}'"):
            create_embedding_bag(backend, [TableSpec(4, 4)], SparseOptimizerSpec(kind))


def test_fbgemm_constraints() -> None:
    """What fbgemm-gpu-cpu cannot do is refused with a reason, not run with other semantics."""
    _need("fbgemm")
    with pytest.raises(ValueError, match="does not support sparse optimizer 'adam'"):
        create_embedding_bag("fbgemm", [TableSpec(4, 4)], SparseOptimizerSpec("adam"))
    with pytest.raises(ValueError, match="multiples of 4"):
        create_embedding_bag("fbgemm", [TableSpec(4, 4), TableSpec(4, 3, name="odd")], SparseOptimizerSpec("sgd"))
    with pytest.raises(ValueError, match="bfloat16"):
        create_embedding_bag("fbgemm", [TableSpec(4, 4)], SparseOptimizerSpec("sgd"), weight_dtype=torch.bfloat16)


@pytest.mark.parametrize("cpu_update", ["generic", "jit"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fbgemm_cpu_rowwise_adagrad_paths(request: pytest.FixtureRequest, cpu_update: str, weight_decay: float) -> None:
    """Both CPU rowwise-AdaGrad paths match the oracle: ``generic`` (ghost features route every
    table to fbgemm's generic loop: one ghost per table read by one feature, none for the shared
    table, and the ghosts' zero columns never reach the caller) and ``jit`` (fbgemm's fast path,
    which drops weight decay, so decay is refused there)."""
    _need("fbgemm")
    opt = SparseOptimizerSpec("rowwise_adagrad", lr=0.05, weight_decay=weight_decay)
    if cpu_update == "jit" and weight_decay:
        tables, ftm = _model_spec("fbgemm", "sum")
        with pytest.raises(ValueError, match="weight_decay > 0 is not available with 'rowwise_adagrad'"):
            create_embedding_bag("fbgemm", tables, opt, feature_table_map=ftm, cpu_update=cpu_update)
        return
    model = _run_parity(request, "fbgemm", opt, "mixed", weighted=True, cpu_update=cpu_update)
    # _model_spec: features [0, 1, 2, 3, 2]; tables 0, 1, 3 are read by one feature each
    internal = [0, 0, 1, 1, 2, 2, 3, 3] if cpu_update == "generic" else [0, 1, 2, 2, 3]
    assert list(model._tbe.feature_table_map) == internal
    assert model.total_dim == sum(model.feature_dims)
    with pytest.raises(ValueError, match="cpu_update must be one of"):
        create_embedding_bag("fbgemm", [TableSpec(4, 4)], opt, cpu_update="fast")


# ---- registry ------------------------------------------------------------------------------
def test_registry_defaults_and_report() -> None:
    names = available_backends()
    assert "reference" in names
    expected = "fbgemm" if "fbgemm" in names else "reference"
    assert default_backend("cpu") == expected
    assert backend_report().startswith(f"kernel backends: {', '.join(names)} (default: {expected})")
    m = create_embedding_bag(None, [TableSpec(4, 4)], SparseOptimizerSpec("sgd"))
    assert m.backend_name == expected
    assert create_embedding_bag("auto", [TableSpec(4, 4)], SparseOptimizerSpec("sgd")).backend_name == expected

def test_auto_passes_over_a_backend_that_cannot_store_the_table_dtype() -> None:
    """``auto`` with bf16 tables skips fbgemm (fp32/fp16 only) and says so; reference stores it."""
    from neo_train.kernels.registry import backend_weight_dtypes, default_backend_reason, dtype_refusal

    assert torch.bfloat16 in backend_weight_dtypes("reference") and dtype_refusal("reference", torch.bfloat16) == ""
    assert default_backend("cpu", torch.bfloat16) == "reference"
    m = create_embedding_bag(None, [TableSpec(4, 4)], SparseOptimizerSpec("sgd"), weight_dtype=torch.bfloat16)
    assert m.backend_name == "reference" and m.weight_dtype == torch.bfloat16
    if "fbgemm" in available_backends():
        assert dtype_refusal("fbgemm", torch.bfloat16) == "stores float32, float16 tables only, not bfloat16"
        assert "fbgemm: stores float32, float16 tables only" in default_backend_reason("cpu", torch.bfloat16)
        assert default_backend("cpu", torch.float16) == "fbgemm"



def test_registry_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"'nope' is not available.*Available here: \['reference'"):
        create_embedding_bag("nope", [TableSpec(4, 4)], SparseOptimizerSpec("sgd"))
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))

    def broken_probe() -> bool:
        raise RuntimeError("driver exploded")

    registry.register_backend("broken", lambda *a, **k: None, broken_probe)  # type: ignore[arg-type,return-value]
    registry.register_backend("absent", lambda *a, **k: None, lambda: False, lambda: "libfoo.so not found")  # type: ignore[arg-type,return-value]
    assert "broken" not in available_backends() and "absent" not in available_backends()
    with pytest.raises(ValueError, match="libfoo.so not found"):
        create_embedding_bag("absent", [TableSpec(4, 4)], SparseOptimizerSpec("sgd"))
    assert "absent (libfoo.so not found)" in backend_report()


def test_fbgemm_probe_survives_any_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """fbgemm_gpu can fail with OSError (missing .so) or RuntimeError (torch mismatch)."""
    probe = registry._fbgemm_probe.__wrapped__  # uncached
    for exc in (ImportError("no module"), OSError("libcudart.so.12: cannot open"), RuntimeError("torch 2.x ABI")):

        def fail(name: str, package: str | None = None, exc: Exception = exc) -> None:
            raise exc

        monkeypatch.setattr(registry.importlib, "import_module", fail)
        reason = probe()
        assert type(exc).__name__ in reason and str(exc) in reason



# ---- huge pages ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["reference", "fbgemm"])
def test_large_tables_sit_on_huge_pages(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables (and optimizer state) of at least huge_pages.MIN_BYTES get memory advised for
    transparent huge pages before it is first written; smaller ones, and every table with
    NEO_TRAIN_HUGE_PAGES=0, keep torch's ordinary memory. The contents are the same either way."""
    from neo_train.kernels import huge_pages

    _need(backend)
    if not huge_pages.enabled():
        pytest.skip("transparent huge pages are off here (not Linux, or THP 'never')")
    rows = huge_pages.MIN_BYTES // (64 * 4) + 1000  # just over the threshold at D = 64
    opt = SparseOptimizerSpec("adagrad", lr=0.05)  # element-wise state: as large as the weights

    def buffers(m: FusedEmbeddingBag) -> list[torch.Tensor]:
        if backend == "fbgemm":
            return [m._tbe.weights_host, m._tbe.momentum1_host]
        return [m.weights, m.state_sum]

    big = create_embedding_bag(backend, [TableSpec(rows, 64), TableSpec(10, 64)], opt, seed=3)
    assert all(huge_pages.advised(b) for b in buffers(big))
    small = create_embedding_bag(backend, [TableSpec(1000, 64)], opt, seed=3)
    assert not any(huge_pages.advised(b) for b in buffers(small))
    values, offsets = torch.tensor([0, rows - 1, 5, 2, 7]), torch.tensor([0, 2, 3, 4, 5])  # B = 2, F = 2
    out = big(values, offsets)
    out.backward(torch.ones_like(out))
    monkeypatch.setenv("NEO_TRAIN_HUGE_PAGES", "0")
    plain = create_embedding_bag(backend, [TableSpec(rows, 64), TableSpec(10, 64)], opt, seed=3)
    assert not any(huge_pages.advised(b) for b in buffers(plain))
    ref = plain(values, offsets)
    ref.backward(torch.ones_like(ref))
    assert torch.equal(out, ref)
    for t in range(2):
        assert torch.equal(big.get_table(t), plain.get_table(t))
        assert torch.equal(big.get_state(t)["sum"], plain.get_state(t)["sum"])


def test_host_store_tables_sit_on_huge_pages() -> None:
    """The DRAM tier of the row cache (cache_store.HostStore) allocates like the backends."""
    from neo_train.kernels import huge_pages
    from neo_train.kernels.cache_store import HostStore

    if not huge_pages.enabled():
        pytest.skip("transparent huge pages are off here (not Linux, or THP 'never')")
    rows = huge_pages.MIN_BYTES // (64 * 4) + 1000
    store = HostStore([TableSpec(rows, 64), TableSpec(100, 64)], "rowwise_adagrad", torch.float32)
    assert huge_pages.advised(store.weights[0]) and not huge_pages.advised(store.weights[1])
    assert not store.weights[0].any() and not store.states[0]["momentum"].any()
