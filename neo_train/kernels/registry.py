"""Which fused embedding backends exist, which import here, and which one a run gets.

    create_embedding_bag(None, tables, optimizer)        # the default for the device
    create_embedding_bag("reference", tables, optimizer)  # a named one, or ValueError saying why not

Default ("auto"): on CPU "fbgemm" when fbgemm_gpu imports, else "reference". On CUDA "triton"
only once the GPU test tier (``pytest -m gpu``, tests/test_gpu.py) has passed on a real GPU and
``TRITON_GPU_VERIFIED`` below records it; until then "fbgemm" when a CUDA build of fbgemm_gpu
imports, else "reference". ``default_backend_reason(device)`` says why. Availability checks run
once and are cached; an optional library that fails to import with any exception (ImportError,
OSError from a missing .so, RuntimeError from a torch-version mismatch) makes its backend
unavailable, never the package.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .base import FusedEmbeddingBag, SparseOptimizerSpec, TableSpec

__all__ = [
    "register_backend",
    "registered_backends",
    "available_backends",
    "default_backend",
    "default_backend_reason",
    "create_embedding_bag",
    "backend_report",
    "backend_unavailable_reason",
    "backend_weight_dtypes",
    "dtype_refusal",
]

# factory(tables, optimizer, *, feature_table_map, feature_names, device, weight_dtype, seed)
BackendFactory = Callable[..., FusedEmbeddingBag]
_PRIORITY_CUDA: tuple[str, ...] = ("triton", "fbgemm", "reference")
_PRIORITY_CPU: tuple[str, ...] = ("fbgemm", "reference")

TRITON_GPU_VERIFIED: dict[str, str] | None = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-22"}
"""Where and when the GPU tier last passed with the triton backend, e.g. {"gpu": "H100 80GB HBM3",
"date": "2026-11-22"}; None: never, so ``auto`` on CUDA does not pick triton (it still runs when
named). Set it in the commit that records a passing ``pytest -m gpu`` run on a real GPU."""


@dataclass(frozen=True)
class _Backend:
    factory: BackendFactory
    available: Callable[[], bool]
    reason: Callable[[], str]  # why it is unavailable ("" when available)
    weight_dtypes: Callable[[], tuple[torch.dtype, ...]] | None = None  # the table dtypes it stores; None: not said


_BACKENDS: dict[str, _Backend] = {}


def register_backend(
    name: str,
    factory: BackendFactory,
    available: Callable[[], bool],
    reason: Callable[[], str] | None = None,
    weight_dtypes: Callable[[], tuple[torch.dtype, ...]] | None = None,
) -> None:
    """Register (or replace) a backend. ``available`` should be cheap after its first call;
    ``weight_dtypes`` (optional) names the table dtypes it stores, so ``auto`` passes over it for
    the others and a named backend is refused before any kernel is built."""
    _BACKENDS[name] = _Backend(factory, available, reason or (lambda: "its availability check returned False"),
                               weight_dtypes)


def _is_available(name: str) -> bool:
    try:
        return bool(_BACKENDS[name].available())
    except Exception:  # an availability probe must never take the caller down
        return False


def registered_backends() -> list[str]:
    """Every registered backend name, available here or not."""
    return list(_BACKENDS)


def available_backends() -> list[str]:
    """Names of the registered backends that can run here, in registration order."""
    return [name for name in _BACKENDS if _is_available(name)]


def backend_unavailable_reason(name: str) -> str:
    """Why ``name`` cannot run here ("" when it can)."""
    if name not in _BACKENDS:
        return f"no backend named {name!r} is registered (registered: {sorted(_BACKENDS)})"
    return "" if _is_available(name) else _BACKENDS[name].reason()


def backend_weight_dtypes(name: str) -> tuple[torch.dtype, ...] | None:
    """The table dtypes backend ``name`` stores (None: the backend does not say)."""
    b = _BACKENDS.get(name)
    return None if b is None or b.weight_dtypes is None else tuple(b.weight_dtypes())


def dtype_refusal(name: str, weight_dtype: torch.dtype) -> str:
    """Why backend ``name`` cannot store tables of ``weight_dtype`` ("" when it can or does not say)."""
    dtypes = backend_weight_dtypes(name)
    if dtypes is None or weight_dtype in dtypes:
        return ""
    names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
    return f"stores {names} tables only, not {str(weight_dtype).removeprefix('torch.')}"


def _passed_over(name: str, device_type: str, weight_dtype: torch.dtype = torch.float32) -> str:
    """Why ``auto`` passes over ``name`` on this device type for tables of ``weight_dtype`` ("" when
    it would take it)."""
    if name not in _BACKENDS:
        return "not registered"
    if not _is_available(name):
        return _BACKENDS[name].reason()
    refusal = dtype_refusal(name, weight_dtype)
    if refusal:
        return refusal
    if device_type == "cuda":
        if name == "triton" and TRITON_GPU_VERIFIED is None:
            return (
                "not yet verified on a GPU (run pytest -m gpu on one, then set "
                "kernels.registry.TRITON_GPU_VERIFIED)"
            )
        if name == "fbgemm":
            return _fbgemm_cuda_reason()
    return ""


def _choose(device: torch.device | str, weight_dtype: torch.dtype = torch.float32) -> tuple[str, list[str]]:
    """(the default backend for ``device`` and tables of ``weight_dtype``, "name: why not" for each
    one passed over first)."""
    device_type = torch.device(device).type
    passed: list[str] = []
    for name in _PRIORITY_CUDA if device_type == "cuda" else _PRIORITY_CPU:
        why = _passed_over(name, device_type, weight_dtype)
        if not why:
            return name, passed
        passed.append(f"{name}: {why}")
    return "reference", passed


def default_backend(device: torch.device | str = "cpu", weight_dtype: torch.dtype = torch.float32) -> str:
    """The fastest available backend for ``device`` and tables of ``weight_dtype`` that ``auto``
    may pick (see the module docstring)."""
    return _choose(device, weight_dtype)[0]


def default_backend_reason(device: torch.device | str = "cpu", weight_dtype: torch.dtype = torch.float32) -> str:
    """Why ``default_backend(device, weight_dtype)`` is what it is, e.g. on CUDA: "triton: not yet
    verified on a GPU (...); fbgemm: fbgemm_gpu failed to import (...); using reference"."""
    name, passed = _choose(device, weight_dtype)
    note = ""
    if name == "triton" and TRITON_GPU_VERIFIED is not None:
        note = f" (GPU tier passed on {TRITON_GPU_VERIFIED.get('gpu', '?')}, {TRITON_GPU_VERIFIED.get('date', '?')})"
    return "; ".join([*passed, f"using {name}{note}"])


def create_embedding_bag(
    backend: str | None,
    tables: Sequence[TableSpec],
    optimizer: SparseOptimizerSpec,
    *,
    feature_table_map: Sequence[int] | None = None,
    feature_names: Sequence[str] | None = None,
    device: torch.device | str = "cpu",
    weight_dtype: torch.dtype = torch.float32,
    seed: int = 0,
    **options: object,
) -> FusedEmbeddingBag:
    """Build a backend by name; None or "auto" picks ``default_backend(device, weight_dtype)``.
    ``options`` go to the backend's constructor (e.g. triton's ``stochastic_rounding``)."""
    name = default_backend(device, weight_dtype) if backend in (None, "auto") else backend
    assert name is not None
    if name not in _BACKENDS or not _is_available(name):
        raise ValueError(
            f"embedding backend {name!r} is not available: {backend_unavailable_reason(name)}. "
            f"Available here: {available_backends()}"
        )
    return _BACKENDS[name].factory(
        tables,
        optimizer,
        feature_table_map=feature_table_map,
        feature_names=feature_names,
        device=device,
        weight_dtype=weight_dtype,
        seed=seed,
        **options,
    )


def backend_report(device: torch.device | str = "cpu", weight_dtype: torch.dtype = torch.float32) -> str:
    """One line for logs, e.g. 'kernel backends: reference, fbgemm (default: fbgemm); default on
    cpu: using fbgemm' (for tables of ``weight_dtype``)."""
    line = f"kernel backends: {', '.join(available_backends())} (default: {default_backend(device, weight_dtype)})"
    missing = [n for n in _BACKENDS if not _is_available(n)]
    if missing:
        line += "; unavailable: " + "; ".join(f"{n} ({backend_unavailable_reason(n)})" for n in missing)
    return line + f"; default on {torch.device(device).type}: {default_backend_reason(device, weight_dtype)}"


# ---- built-in backends ---------------------------------------------------------------------
@functools.cache
def _fbgemm_probe() -> str:
    """Import fbgemm_gpu's TBE once; "" on success, else the reason it failed."""
    try:
        importlib.import_module("fbgemm_gpu.split_table_batched_embeddings_ops_training")
    except Exception as e:  # noqa: BLE001 - OSError/RuntimeError are as common as ImportError
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        return f"fbgemm_gpu failed to import ({type(e).__name__}: {first_line})"
    return ""


@functools.cache
def _fbgemm_cuda_reason() -> str:
    """"" when the importable fbgemm_gpu has CUDA kernels, else why not (its CPU-only build,
    fbgemm-gpu-cpu, reports ``__variant__ == "cpu"``)."""
    try:
        variant = str(getattr(importlib.import_module("fbgemm_gpu"), "__variant__", ""))
    except Exception as e:  # noqa: BLE001 - as in _fbgemm_probe
        return f"fbgemm_gpu failed to import ({type(e).__name__})"
    if variant.lower() == "cpu":
        return "fbgemm_gpu is its CPU-only build (variant 'cpu'): no CUDA kernels"
    return ""


def _lazy_factory(module: str, cls: str) -> BackendFactory:
    def factory(*args: object, **kwargs: object) -> FusedEmbeddingBag:
        return getattr(importlib.import_module(module, __package__), cls)(*args, **kwargs)

    return factory


def _lazy_dtypes(module: str, cls: str) -> Callable[[], tuple[torch.dtype, ...]]:
    """The class's ``supported_weight_dtypes`` (its module imports no optional library at import)."""
    return lambda: getattr(importlib.import_module(module, __package__), cls).supported_weight_dtypes


register_backend("reference", _lazy_factory(".reference", "ReferenceEmbeddingBag"), lambda: True,
                 weight_dtypes=_lazy_dtypes(".reference", "ReferenceEmbeddingBag"))
register_backend(
    "fbgemm",
    _lazy_factory(".fbgemm_backend", "FbgemmEmbeddingBag"),
    lambda: _fbgemm_probe() == "",
    _fbgemm_probe,
    weight_dtypes=_lazy_dtypes(".fbgemm_backend", "FbgemmEmbeddingBag"),
)


def _triton_reason() -> str:
    """"" when the triton backend runs here: CUDA, or CPU under TRITON_INTERPRET=1."""
    try:
        from .triton_backend import triton_unavailable_reason  # imports torch only, not triton
    except Exception as e:  # noqa: BLE001
        return f"triton backend failed to import ({type(e).__name__}: {e})"
    return triton_unavailable_reason()


register_backend(
    "triton",
    _lazy_factory(".triton_backend", "TritonEmbeddingBag"),
    lambda: _triton_reason() == "",
    _triton_reason,
    weight_dtypes=_lazy_dtypes(".triton_backend", "TritonEmbeddingBag"),
)
