"""Building blocks of the learned scorers (``mlp``, ``memory``): detached, RMS-normalised token
features and per-KV-head linear maps and MLPs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Parameter-free RMS normalisation over the last dim, in float32.

    Scorers see keys and values of any model; fixing their scale makes one initialisation and
    learning rate work across layers and checkpoints."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def token_features(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[k ; v]`` detached and RMS-normalised: ``(..., D)`` x2 → ``(..., 2D)`` float32."""
    return torch.cat([rms_normalize(k.detach()), rms_normalize(v.detach())], dim=-1)


def per_head_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """``x (B, H, ..., in) @ weight (H, in, out) + bias (H, out)``, a separate map per head.

    One batched matmul over heads on ``(B, H, M, in)``; broadcasting ``weight`` against the
    token dims instead would copy each head's matrix once per token."""
    batch, heads, *middle, width = x.shape
    rows = x.reshape(batch, heads, -1, width)
    y = torch.einsum("bhmi,hio->bhmo", rows, weight)
    if bias is not None:
        y = y + bias.view(1, heads, 1, bias.shape[-1])
    return y.reshape(batch, heads, *middle, weight.shape[-1])


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(per_head_linear(x, self.w1, self.b1))
        return per_head_linear(hidden, self.w2, self.b2).squeeze(-1)
