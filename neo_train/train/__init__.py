"""Training: the trainer loop and evaluation metrics."""
from .metrics import auc, binary_metrics, log_loss, normalized_entropy
from .trainer import Trainer, TrainResult, build_model, make_data, make_dense_optimizer

__all__ = [
    "Trainer",
    "TrainResult",
    "build_model",
    "make_data",
    "make_dense_optimizer",
    "auc",
    "binary_metrics",
    "log_loss",
    "normalized_entropy",
]
