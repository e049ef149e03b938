"""What the quality benchmark compares: full attention and every policy at each budget.

Budgets are named by compression of a :data:`~.data.SEQUENCE_LENGTH`-token sequence: at "75%"
each layer and KV head keeps 512 of 2048 tokens, at "88%" 256 (12.5%). Sinks and window are
counted inside the budget. Every policy runs at the same sinks and window, so a method differs
from another only in how it fills the pool.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..config import KVpopConfig, ScorerKind
from ..scorer_io import load_scorer
from ..transform import transform
from .data import SEQUENCE_LENGTH

BUDGETS = {"75%": SEQUENCE_LENGTH // 4, "88%": SEQUENCE_LENGTH // 8}
"""Compression label -> capacity (tokens kept per layer and KV head)."""
SINKS, WINDOW = 4, 64
POLICIES = tuple(kind.value for kind in ScorerKind)
"""memory, mlp, window (StreamingLLM), random, knorm, h2o, tova."""
FULL = "full"
EMBEDDED_SCORERS = Path(__file__).resolve().parents[1] / "embedded" / "scorers"
"""Folder of the scorers trained for the embedded model, one sub-folder per policy and budget."""


def budget_config(policy: str, capacity: int) -> KVpopConfig:
    """The benchmark's config for ``policy`` keeping ``capacity`` tokens."""
    if capacity <= SINKS + WINDOW:
        raise ValueError(
            f"capacity must exceed sinks + window = {SINKS + WINDOW} so that the pool has a "
            f"slot, got {capacity}"
        )
    return KVpopConfig(sinks=SINKS, window=WINDOW, topk=capacity - SINKS - WINDOW, scorer=policy)


def scorer_folder(policy: str, capacity: int, root: str | Path | None = None) -> Path:
    """The trained scorer of ``policy`` at ``capacity``: ``root/<policy>-<capacity>``."""
    return Path(root if root is not None else EMBEDDED_SCORERS) / f"{policy}-{capacity}"


@dataclass(frozen=True)
class Method:
    """One row of the benchmark: ``policy`` at ``budget`` (both None for full attention)."""

    policy: str | None
    budget: str | None

    @property
    def name(self) -> str:
        return FULL if self.policy is None else f"{self.policy} @ {self.budget}"

    @property
    def capacity(self) -> int | None:
        return None if self.budget is None else BUDGETS[self.budget]


def methods(policies=POLICIES, budgets=tuple(BUDGETS)) -> list[Method]:
    """Full attention, then every policy at every budget (unknown names raise ValueError)."""
    for budget in budgets:
        if budget not in BUDGETS:
            raise ValueError(f"budget must be one of {', '.join(BUDGETS)}; got {budget!r}")
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    return [Method(None, None)] + [Method(p, b) for b in budgets for p in policies]


def build_model(original: nn.Module, method: Method, scorer_root: str | Path | None = None):
    """``original`` itself for full attention; else a transformed copy with the method's policy.

    Learned policies load their trained scorer from ``scorer_root`` (default: the scorers
    shipped with the embedded model); a missing one raises ``FileNotFoundError``.
    """
    if method.policy is None:
        return original
    config = budget_config(method.policy, method.capacity)
    model = transform(copy.deepcopy(original), config)
    if config.scorer.learned:
        folder = scorer_folder(method.policy, method.capacity, scorer_root)
        if not folder.is_dir():
            raise FileNotFoundError(
                f"no trained {method.policy} scorer for capacity {method.capacity} at {folder}; "
                "train one with scripts/train_embedded_scorers.py or pass --scorers"
            )
        load_scorer(model, folder)
    return model
