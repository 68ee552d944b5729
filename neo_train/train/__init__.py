"""Training: the trainer loop and evaluation metrics."""
from .checkpoint import CheckpointError, find_latest, load_checkpoint, resume_from_latest, save_checkpoint
from .metrics import auc, binary_metrics, log_loss, normalized_entropy
from .pipeline import TrainPipeline
from .trainer import Trainer, TrainResult, build_model, make_data, make_dense_optimizer

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "find_latest",
    "resume_from_latest",
    "CheckpointError",
    "Trainer",
    "TrainPipeline",
    "TrainResult",
    "build_model",
    "make_data",
    "make_dense_optimizer",
    "auc",
    "binary_metrics",
    "log_loss",
    "normalized_entropy",
]
