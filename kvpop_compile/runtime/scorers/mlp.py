"""The ``mlp`` scorer: stateless, learned (design.md §3)."""

from __future__ import annotations

from ..reference.scorer_layers import token_features
from .base import Scorer
from .layers import PerHeadMLP


class MLPScorer(Scorer):
    """``mlp``: per-KV-head two-layer MLP on ``[k_t ; v_t]``."""

    def __init__(self, num_kv_heads: int, head_dim: int, hidden: int):
        super().__init__(num_kv_heads, head_dim)
        self.mlp = PerHeadMLP(num_kv_heads, 2 * head_dim, hidden)

    def readout_mlp(self) -> PerHeadMLP:
        return self.mlp

    def score_tokens(self, k, v, position):
        return self.mlp(token_features(k, v))
