"""Scorer training against the future-attention target."""

from .trainer import TrainingReport, train_scorer

__all__ = ["TrainingReport", "train_scorer"]
