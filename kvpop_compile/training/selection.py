"""Choosing the scorer a run keeps by a measure the caller names, not by the last step.

The training loss ranks tokens; what a user wants of a scorer is often something else (the
answers of their task under a budget), and the two need not move together: on the embedded
model's recall items, scorers with equal held-out ranking accuracy answer very differently.
With a ``select`` measure, a run saves its scorers as a *candidate* at the start and at every
evaluation, scores each with the measure, and keeps the best one (on a tie, the later one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from torch import nn

from ..scorer_io import layer_tensors, load_layer, read_tensors, save_scorers

CANDIDATES = "candidates"


class CandidateSelection:
    """The candidates of one run, under ``output_dir/candidates/step-NNNNNN/``, and their
    measures. ``select(folder) -> float``: higher is better; ``folder`` is a saved scorer
    (load it with :func:`~kvpop_compile.load_scorer` into a model transformed with the
    training config)."""

    def __init__(self, select: Callable[[Path], float], output_dir: Path):
        if not callable(select):
            raise TypeError(f"select must be callable (folder -> float), got {select!r}")
        self.select = select
        self.folder = output_dir / CANDIDATES
        self.measured: list[dict] = []  # {"step": int, "select": float}, in step order

    def folder_of(self, step: int) -> Path:
        return self.folder / f"step-{step:06d}"

    def measure(self, step: int, scorers: list[nn.Module], description: dict, group) -> float:
        """Save ``scorers`` as step ``step``'s candidate (the main process writes), measure
        it on every process, record and return the measure."""
        folder = self.folder_of(step)
        if group.is_main:
            save_scorers(scorers, description, folder)
        group.barrier()
        value = self.select(folder)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise ValueError(f"select must return a finite number, got {value!r} for {folder}")
        self.measured = [m for m in self.measured if m["step"] != step]
        self.measured.append({"step": step, "select": float(value)})
        return float(value)

    def best_step(self) -> int:
        """The step of the best candidate (the later one on a tie)."""
        if not self.measured:
            raise ValueError("no candidate was measured")
        return max(self.measured, key=lambda m: (m["select"], m["step"]))["step"]

    def load_best(self, scorers: list[nn.Module]) -> int:
        """Load the best candidate into ``scorers`` (in place); return its step."""
        step = self.best_step()
        tensors = read_tensors(self.folder_of(step))
        for index, scorer in enumerate(scorers):
            load_layer(scorer, layer_tensors(tensors, index), index)
        return step
