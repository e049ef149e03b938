"""The arithmetic of the learned scorers (``mlp``, ``memory``) on bare tensors: detached,
RMS-normalised token features, per-KV-head linear maps and the per-head two-layer MLP.

Plain functions of the weights, so that the scorer modules (:mod:`..scorers`) and the
reference of the fused ``kvpop::memory_scorer_step`` op (:mod:`.memory_scorer`) compute with
the same code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Parameter-free RMS normalisation over the last dim, in float32 (float64 stays float64,
    for the kernels' tests' exact truths).

    Scorers see keys and values of any model; fixing their scale makes one initialisation and
    learning rate work across layers and checkpoints."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def token_features(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[k ; v]`` detached and RMS-normalised: ``(..., D)`` x2 → ``(..., 2D)`` float32 (or
    float64)."""
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


def per_head_mlp(
    x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor
) -> torch.Tensor:
    """Two-layer SiLU MLP, separate weights per KV head: ``x (B, H, ..., in)``, ``w1 (H, in,
    hidden)``, ``b1 (H, hidden)``, ``w2 (H, hidden, 1)``, ``b2 (H, 1)`` → ``(B, H, ...)``."""
    hidden = F.silu(per_head_linear(x, w1, b1))
    return per_head_linear(hidden, w2, b2).squeeze(-1)
