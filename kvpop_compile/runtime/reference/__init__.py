"""Floor 2 of the runtime: the plain-PyTorch reference of every ``kvpop`` op.

Nothing here imports Triton, so CPU-only code and tests always have an oracle; on CPU tensors
the ops run these very functions (design.md §6). One op per file, named after the op, as its
kernel in :mod:`..kernels` is: ``masked_attention``, ``decode_attention``, ``eviction_steps``
(with the streaming simulation it is tested against), ``running_topk_boundary``,
``update_cache``, ``memory_scorer_step``, ``future_attention_target``; ``scorer_layers`` holds
the learned scorers' arithmetic. The policy's own arithmetic, which the production steps share,
is :mod:`..policy`.
"""

from .decode_attention import decode_attention
from .eviction_steps import eviction_steps, prefix_kth_smallest, streaming_eviction_steps
from .future_attention_target import future_attention_target, future_attention_target_dense
from .masked_attention import masked_attention
from .memory_scorer_step import memory_scorer_step_
from .running_topk_boundary import running_topk_boundary
from .update_cache import evict_into_pool_, update_cache_, write_new_token_

__all__ = [
    "decode_attention",
    "evict_into_pool_",
    "eviction_steps",
    "future_attention_target",
    "future_attention_target_dense",
    "masked_attention",
    "memory_scorer_step_",
    "prefix_kth_smallest",
    "running_topk_boundary",
    "streaming_eviction_steps",
    "update_cache_",
    "write_new_token_",
]
