"""Qwen3 model shapes and random-weight models of them, for benchmarks that need no checkpoint.

A decode or prefill step's cost depends on the model's shapes, not on its weights, so a model
built from the released configuration's sizes with random weights times like the real one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


@dataclass(frozen=True)
class ModelShape:
    """A Qwen3's layer shapes and the released model's depth and vocabulary."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layers: int
    vocab: int
    tie_word_embeddings: bool

    def layer_shape(self) -> dict[str, int]:
        """The ``Qwen3Config`` fields of one decoder layer."""
        return dict(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
        )  # fmt: skip


# The released Qwen3 dense models' configurations, and a tiny one for tests and --quick runs.
MODELS = {
    "qwen3-0.6b": ModelShape(1024, 3072, 16, 8, 128, layers=28, vocab=151_936,
                             tie_word_embeddings=True),
    "qwen3-1.7b": ModelShape(2048, 6144, 16, 8, 128, layers=28, vocab=151_936,
                             tie_word_embeddings=True),
    "qwen3-4b": ModelShape(2560, 9728, 32, 8, 128, layers=36, vocab=151_936,
                           tie_word_embeddings=True),
    "qwen3-8b": ModelShape(4096, 12288, 32, 8, 128, layers=36, vocab=151_936,
                           tie_word_embeddings=False),
    "tiny": ModelShape(64, 128, 4, 2, 16, layers=2, vocab=256, tie_word_embeddings=False),
}  # fmt: skip
# Layer shapes by name: the ``Qwen3Config`` fields of one decoder layer.
SHAPES = {name: shape.layer_shape() for name, shape in MODELS.items()}


def qwen3_model(
    shape: str,
    *,
    layers: int,
    vocab: int,
    max_positions: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tie_word_embeddings: bool = False,
):
    """A Qwen3 with ``SHAPES[shape]`` layers and random weights, in eval mode, created directly
    on ``device`` in ``dtype``. The same ``seed`` gives the same weights, so a baseline and a
    transformed copy compute the same function."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}; got {shape!r}")
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        num_hidden_layers=layers,
        max_position_embeddings=max_positions,
        attn_implementation="sdpa",
        tie_word_embeddings=tie_word_embeddings,
        **SHAPES[shape],
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return Qwen3ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
