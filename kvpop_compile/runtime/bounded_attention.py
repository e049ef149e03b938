"""``BoundedAttention``: the module a rewritten graph calls in place of each attention (the top
of the runtime's floors).

It owns the layer's scorer (so the scorer's parameters are module parameters of the transformed
model) and dispatches on the static query length: one token is a decode step, more tokens are
a chunk step, which continues whatever the cache holds. The cache state arrives as explicit
tensor inputs, so a caller can keep it anywhere (a transformers cache object, or an exported
graph's inputs/outputs).
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import KVpopConfig
from .cache import BoundedCacheState
from .chunk_step import chunk_step
from .decode_step import decode_step
from .scorers.base import Scorer


class BoundedAttention(nn.Module):
    """KVpop bounded attention of one layer.

    ``forward(q, k, v, raw_k, *state)``: ``q (B, Hq, N, D)`` after RoPE, ``k, v, raw_k
    (B, Hkv, N, D)`` (keys after and before RoPE), ``state`` the tensors of a
    :class:`BoundedCacheState` in field order. Returns ``(B, Hq, N, D)``.
    """

    def __init__(self, config: KVpopConfig, layer_idx: int, scale: float):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.scale = scale
        self.scorer: Scorer | None = None  # attached by the insert_scorer pass

    def extra_repr(self) -> str:
        return f"layer={self.layer_idx}, capacity={self.config.capacity}, scale={self.scale:.4g}"

    def forward(self, q, k, v, raw_k, *state_tensors: torch.Tensor) -> torch.Tensor:
        if self.scorer is None:
            raise RuntimeError(
                f"BoundedAttention of layer {self.layer_idx} has no scorer: run the insert_scorer "
                "pass (kvpop_compile.transform does) before calling it"
            )
        state = BoundedCacheState(*state_tensors)
        kwargs = {"scorer": self.scorer, "config": self.config, "scale": self.scale}
        if q.shape[2] == 1:
            return decode_step(state, q, k, raw_k, v, **kwargs)
        return chunk_step(state, q, k, raw_k, v, **kwargs)
