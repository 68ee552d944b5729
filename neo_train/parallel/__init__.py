"""Parallelism applied to a plain DLRM: sharded embeddings + DDP dense part."""
from .model_parallel import DistributedModelParallel

__all__ = ["DistributedModelParallel"]
