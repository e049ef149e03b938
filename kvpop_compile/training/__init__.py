"""Scorer training against the future-attention target: :func:`train_scorer` with its
:class:`TrainSettings`, and the training-only code it runs (losses, the distillation student,
the training passes)."""

from .settings import TargetKind, TrainMode, TrainSettings
from .trainer import TrainingReport, train_scorer

__all__ = ["TargetKind", "TrainMode", "TrainSettings", "TrainingReport", "train_scorer"]
