"""The learned scorers' parameter block: a per-KV-head two-layer MLP (its arithmetic is
:func:`~..reference.scorer_layers.per_head_mlp`)."""

from __future__ import annotations

import torch
from torch import nn

from ..reference.scorer_layers import per_head_mlp


class PerHeadMLP(nn.Module):
    """Two-layer SiLU MLP with separate weights per KV head: ``(B, H, ..., in) → (B, H, ...)``."""

    def __init__(self, num_heads: int, in_features: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_heads, in_features, hidden))
        self.b1 = nn.Parameter(torch.zeros(num_heads, hidden))
        self.w2 = nn.Parameter(torch.empty(num_heads, hidden, 1))
        self.b2 = nn.Parameter(torch.zeros(num_heads, 1))
        nn.init.normal_(self.w1, std=in_features**-0.5)
        nn.init.normal_(self.w2, std=hidden**-0.5)

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``w1, b1, w2, b2``, the order :func:`per_head_mlp` takes them in."""
        return self.w1, self.b1, self.w2, self.b2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return per_head_mlp(x, *self.weights())
