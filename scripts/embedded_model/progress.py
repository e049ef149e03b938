"""How far a training run has come: steps of each kind, tokens, time and recall items, saved
with each checkpoint so that a resumed run continues the same counts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Progress:
    steps_copy: int = 0
    steps_short: int = 0
    steps_long: int = 0
    tokens: int = 0
    seconds: float = 0.0
    recall_items: int = 0
    stretch_items: int = 0

    def steps(self) -> int:
        return self.steps_copy + self.steps_short + self.steps_long
