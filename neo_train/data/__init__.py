"""Batches and data sources: the sparse batch type, the synthetic generator, the Criteo reader."""
from .batch import Batch, SparseFeatures
from .synthetic import SyntheticData

__all__ = ["Batch", "SparseFeatures", "SyntheticData"]
