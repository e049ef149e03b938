"""Attention-fed baselines (design.md §3): ``h2o`` (cumulative attention received) and ``tova``
(the last query's attention). Their scores change every step, so they run through the
bounded cache's decode steps only (the streaming rule)."""

from __future__ import annotations

import torch

from .base import Scorer


class AttentionFedScorer(Scorer):
    """Base of ``h2o`` and ``tova``: the score of a cached token is a per-slot statistic of the
    attention it receives, updated every step, so only the streaming rule applies."""

    attention_fed = True

    def observe(self, statistic: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """New per-slot statistic from ``attention (B, H, C)``, the current query's attention
        to every slot averaged over the KV head's query group."""
        raise NotImplementedError(f"{type(self).__name__} must define observe")

    def score_tokens(self, k, v, position):
        raise ValueError(
            f"the {type(self).__name__} scorer is attention-fed: its scores change every step, "
            "so it has no per-token score; run it through the bounded cache's decode steps"
        )


class H2OScorer(AttentionFedScorer):
    """``h2o``: cumulative attention received since the token arrived."""

    def observe(self, statistic, attention):
        return statistic + attention


class TOVAScorer(AttentionFedScorer):
    """``tova``: the attention the latest query gave the token."""

    def observe(self, statistic, attention):
        return attention
