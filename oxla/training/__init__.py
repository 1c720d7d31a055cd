"""Training from the ONNX file: TrainingSession runs ModelProto.training_info; make_trainable and
strip_training build and remove such a training section from standard ops."""

from __future__ import annotations

from oxla.training.make import (
    LOSSES,
    OPTIMIZERS,
    Adagrad,
    Adam,
    AdamW,
    Momentum,
    Optimizer,
    make_trainable,
    strip_training,
)
from oxla.training.modes import TrainMode
from oxla.training.parallel import join
from oxla.training.recipe import Recipe, Schedule
from oxla.training.session import TrainingSession

__all__ = [
    "LOSSES",
    "OPTIMIZERS",
    "Adagrad",
    "Adam",
    "AdamW",
    "Momentum",
    "Optimizer",
    "Recipe",
    "Schedule",
    "TrainMode",
    "TrainingSession",
    "join",
    "make_trainable",
    "strip_training",
]
