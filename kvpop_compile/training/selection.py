"""Choosing the scorer a run keeps by a measure the caller names, not by the last step.

The training loss ranks tokens; what a user wants of a scorer is often something else (the
answers of their task under a budget), and the two need not move together: on the embedded
model's recall items, scorers with equal held-out ranking accuracy answer very differently.
With a ``select`` measure, a run saves its scorers as a *candidate* at the start and at every
evaluation, scores each with the measure, and keeps the best one (on a tie, the later one).
The main process saves and measures; the others receive its measure.

For the embedded model's scorers the measure is taken on recall items
(:func:`recall_selection_items`) of code no benchmark asks about, in the trained families and the
validation ones: syntaxes no benchmark row asks. Never in held-out families, which only the
benchmark's held-out-family rows ask, so that those rows stay unseen by every choice made.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..embedded.recall import TASKS, RecallItem, recall_items
from ..scorer_io import load_layers, read_tensors, save_scorers

CANDIDATES = "candidates"
SELECTION_FAMILIES = ("train", "validation")
"""The family groups recall items for choosing among candidates are drawn from."""
SELECTION_SPLITS = ("validation", "train")
"""The code they are planted in: the validation text (the standard library's test folder, which
the corpus leaves out), or the training files; never the held-out files the benchmark asks."""


def recall_selection_items(
    split: str, per_task: int, seed: int, length: int
) -> list[list[RecallItem]]:
    """``per_task`` recall items of ``length`` bytes of each :data:`SELECTION_FAMILIES` group
    and task, planted in ``split`` (:data:`SELECTION_SPLITS`), drawn with ``seed``: one list per
    (family group, task), family groups first."""
    if split not in SELECTION_SPLITS:
        raise ValueError(
            f"split must be one of {SELECTION_SPLITS} (choosing on held-out code would tune to "
            f"the benchmark), got {split!r}"
        )
    return [
        recall_items(split, task, length, per_task, seed, families=families)
        for families in SELECTION_FAMILIES
        for task in TASKS
    ]


def _as_measure(value: object, folder: Path) -> float:
    """``value`` as a float if it is a finite real number (a Python or NumPy number, or a
    one-element tensor), else ``ValueError``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not real or not math.isfinite(value):
        raise ValueError(f"select must return a finite number, got {value!r} for {folder}")
    return float(value)


class CandidateSelection:
    """The candidates of one run, under ``output_dir/candidates/step-NNNNNN/``, and their
    measures. ``select(folder) -> float``: higher is better; ``folder`` is a saved scorer (load
    it with :func:`~kvpop_compile.load_scorer` into a *separate* model transformed with the
    training config: transforming the model being trained would change it in place)."""

    def __init__(self, select: Callable[[Path], float], output_dir: Path):
        if not callable(select):
            raise TypeError(f"select must be callable (folder -> float), got {select!r}")
        self.select = select
        self.folder = output_dir / CANDIDATES
        self.measured: list[dict] = []  # {"step": int, "select": float}, in step order

    def folder_of(self, step: int) -> Path:
        return self.folder / f"step-{step:06d}"

    def measure(self, step: int, scorers: list[nn.Module], description: dict, group) -> float:
        """Save ``scorers`` as step ``step``'s candidate and measure it (the main process does
        both and sends the measure to the others); record and return the measure."""
        value = None
        if group.is_main:
            value = self._measure(save_scorers(scorers, description, self.folder_of(step)))
        value = group.from_main(value)
        # A resumed run measures again the steps after its checkpoint, never the ones it holds.
        self.measured.append({"step": step, "select": value})
        return value

    def measure_saved(self, steps: list[int]) -> list[dict]:
        """Measure the candidates saved for ``steps`` (a finished run's, as its report lists
        them), in step order, replacing the measures held: a finished run chosen again by
        another measure, without training again."""
        if not steps:
            raise ValueError(f"no step to measure under {self.folder}: give the run's steps")
        missing = [step for step in steps if not self.folder_of(step).is_dir()]
        if missing:
            raise FileNotFoundError(
                f"no candidate is saved under {self.folder} for steps {missing}: measure the "
                "steps the run saved"
            )
        self.measured = [
            {"step": step, "select": self._measure(self.folder_of(step))} for step in sorted(steps)
        ]
        return list(self.measured)

    def _measure(self, folder: Path) -> float:
        with torch.no_grad():
            return _as_measure(self.select(folder), folder)

    def best_step(self) -> int:
        """The step of the best candidate (the later one on a tie)."""
        if not self.measured:
            raise ValueError(f"no candidate under {self.folder} was measured")
        return max(self.measured, key=lambda m: (m["select"], m["step"]))["step"]

    def load_best(self, scorers: list[nn.Module]) -> int:
        """Load the best candidate into ``scorers`` (in place); return its step."""
        step = self.best_step()
        load_layers(scorers, read_tensors(self.folder_of(step)))
        return step
