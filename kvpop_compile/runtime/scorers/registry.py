"""``build_scorer``: the scorer a :class:`KVpopConfig` names, for one layer."""

from __future__ import annotations

import torch

from ...config import KVpopConfig, ScorerKind, require_int
from .attention_fed import H2OScorer, TOVAScorer
from .heuristics import KNormScorer, RandomScorer, WindowScorer
from .memory import MemoryScorer
from .mlp import MLPScorer


def build_scorer(config: KVpopConfig, num_kv_heads: int, head_dim: int, layer_idx: int = 0):
    """The scorer ``config.scorer`` names, for one layer with ``num_kv_heads`` heads."""
    require_int("num_kv_heads", num_kv_heads, 1)
    require_int("head_dim", head_dim, 1)
    kind = ScorerKind(config.scorer)
    generator_state = torch.random.get_rng_state()
    # Seed initialisation per layer so a transformed model is reproducible.
    torch.manual_seed(config.seed * 1_000_003 + layer_idx)
    try:
        if kind is ScorerKind.MEMORY:
            return MemoryScorer(
                num_kv_heads,
                head_dim,
                hidden=config.scorer_hidden,
                key_dim=config.memory_dim,
                value_dim=config.memory_value_dim,
            )
        if kind is ScorerKind.MLP:
            return MLPScorer(num_kv_heads, head_dim, config.scorer_hidden)
        if kind is ScorerKind.RANDOM:
            return RandomScorer(num_kv_heads, head_dim, config.seed, layer_idx)
        simple = {
            ScorerKind.WINDOW: WindowScorer,
            ScorerKind.KNORM: KNormScorer,
            ScorerKind.H2O: H2OScorer,
            ScorerKind.TOVA: TOVAScorer,
        }
        return simple[kind](num_kv_heads, head_dim)
    finally:
        torch.random.set_rng_state(generator_state)
