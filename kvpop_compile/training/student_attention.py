"""``StudentAttention``: differentiable attention under the running top-k, for distillation.

The student sees exactly the keys a KVpop cache would hold: eviction steps come from the
scorer's priorities (no gradient: the decision is discrete) and attention runs under that mask
with autograd, in query blocks (O(block * N) memory). Gradients reach the LLM's weights; the
scorer (the layer's, shared with the teacher's graph and attached by the distillation
objective) learns from its own loss on the teacher's target.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import KVpopConfig
from ..runtime import ops  # noqa: F401  (registers the kvpop ops)
from ..runtime.policy import spread_scores, token_priority
from ..runtime.reference.masked_attention import masked_attention
from ..runtime.scorers.base import Scorer


class StudentAttention(nn.Module):
    """``forward(q, k, v, raw_k) -> (B, Hq, N, D)``, shapes as in
    :class:`~kvpop_compile.runtime.bounded_attention.BoundedAttention`."""

    def __init__(self, config: KVpopConfig, scale: float):
        super().__init__()
        self.scorer: Scorer | None = None  # the layer's, attached by the distillation objective
        self.config = config
        self.scale = scale

    def forward(self, q, k, v, raw_k):
        if self.scorer is None:
            raise RuntimeError("StudentAttention has no scorer: attach the layer's scorer first")
        config = self.config
        with torch.no_grad():
            rhat, _ = self.scorer.score_sequence(raw_k, v, config.window)
            # The student sees what inference keeps, spread scores included.
            none_before = rhat.new_full((*rhat.shape[:2], config.priority_span), float("-inf"))
            positions = torch.arange(rhat.shape[-1], device=rhat.device)
            rhat, _ = spread_scores(rhat, none_before, positions, config.sinks)
            # The op: a Triton kernel on CUDA. Attention below stays the differentiable
            # reference, since the student's weights train through it.
            steps = torch.ops.kvpop.eviction_steps(
                token_priority(rhat, config.lam), config.sinks, config.window, config.topk
            )
        out, _ = masked_attention(q, k, v, steps, scale=self.scale, block=config.prefill_block)
        return out
