"""Tiny Qwen3 and Qwen3-MoE models built from configs, with seeded random weights."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
}


def tiny_qwen3(seed: int = 0, *, moe: bool = False, dtype=torch.float32, **overrides):
    """A two-layer Qwen3 (or Qwen3-MoE) in eval mode; ``overrides`` change config fields."""
    settings = {**TINY, **overrides}
    torch.manual_seed(seed)
    if moe:
        config = Qwen3MoeConfig(
            moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, **settings
        )
        model = Qwen3MoeForCausalLM(config)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**settings))
    return model.to(dtype).eval()


def prompt(seed: int = 0, batch: int = 2, length: int = 12) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (batch, length), generator=generator)
