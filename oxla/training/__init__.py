"""Training from the ONNX file: TrainingSession runs ModelProto.training_info; make_trainable and
strip_training build and remove such a training section from standard ops."""

from __future__ import annotations

from oxla.training.make import (
    OPTIMIZERS,
    Adagrad,
    Adam,
    Momentum,
    Optimizer,
    make_trainable,
    strip_training,
)
from oxla.training.session import TrainingSession

__all__ = [
    "OPTIMIZERS",
    "Adagrad",
    "Adam",
    "Momentum",
    "Optimizer",
    "TrainingSession",
    "make_trainable",
    "strip_training",
]
