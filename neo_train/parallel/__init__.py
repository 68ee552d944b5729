"""Parallelism applied to a plain DLRM: sharded embeddings + DDP dense part."""
from .model_parallel import DistributedModelParallel
from .pipeline import TrainPipeline

__all__ = ["DistributedModelParallel", "TrainPipeline"]
