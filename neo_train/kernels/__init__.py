"""Fused embedding kernels (installed as neo_train.kernels).

``import neo_train.kernels`` needs only torch: fbgemm_gpu is imported when a backend asks for it.
``backend_report()`` says which backends run here and which one is the default.
"""
from .base import SPARSE_OPTIMIZERS, FusedEmbeddingBag, SparseOptimizerSpec, TableSpec
from .registry import available_backends, backend_report, create_embedding_bag, default_backend

__all__ = [
    "TableSpec",
    "SparseOptimizerSpec",
    "SPARSE_OPTIMIZERS",
    "FusedEmbeddingBag",
    "create_embedding_bag",
    "available_backends",
    "default_backend",
    "backend_report",
]
