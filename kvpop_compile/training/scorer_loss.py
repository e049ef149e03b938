"""``ScorerLoss``: a layer's scorer and its training loss against the future-attention target.

Applied to what each layer's teacher graph returns besides its output (the pre-RoPE keys,
values and log target that ``insert_future_attention_target`` adds); returns the loss and the
ranking accuracy. The scorer runs in its parallel form.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import nn

from ..config import KVpopConfig
from ..runtime.policy import token_priority
from ..runtime.scorers.base import Scorer
from .losses import (
    boundary_accuracy,
    boundary_decisions,
    boundary_loss,
    quantile_bce_loss,
    regression_loss,
)


class LossKind(str, Enum):
    BOUNDARY = "boundary"  # pairwise logistic on the policy's keep-or-drop decisions (default)
    GAP = "gap"  # the same pairs, each weighted by its gap under the target
    REGRESSION = "regression"  # squared error on the log target
    QUANTILE = "quantile"  # BCE on "in the top keep_fraction" labels


class ScorerLoss(nn.Module):
    """``forward(raw_k, v, log_target, valid) -> (loss, accuracy)`` for one layer."""

    def __init__(self, scorer: Scorer, config: KVpopConfig, loss: LossKind | str, tau: float):
        super().__init__()
        self.scorer = scorer
        self.config = config
        self.loss = LossKind(loss)
        self.tau = tau

    def forward(self, raw_k, v, log_target, valid):
        config = self.config
        rhat, _ = self.scorer.score_sequence(raw_k, v, config.window)
        priority = token_priority(rhat, config.lam)
        with torch.no_grad():
            decisions = boundary_decisions(
                log_target, sinks=config.sinks, window=config.window, topk=config.topk,
                lam=config.lam,
            )  # fmt: skip
        accuracy = boundary_accuracy(priority, decisions)
        if self.loss is LossKind.BOUNDARY:
            loss = boundary_loss(priority, decisions, tau=self.tau)
        elif self.loss is LossKind.GAP:
            target = token_priority(log_target, config.lam)
            loss = boundary_loss(priority, decisions, tau=self.tau, target_priority=target)
        elif self.loss is LossKind.REGRESSION:
            loss = regression_loss(rhat, log_target, valid)
        else:
            kept = config.topk / max(int(valid.sum()), 1)
            loss = quantile_bce_loss(
                rhat, log_target, valid, keep_fraction=min(max(kept, 1e-3), 0.999)
            )
        return loss, accuracy
