"""Floor 1 of the runtime: the plain-PyTorch reference of every ``kvpop`` op and of the policy.

Nothing here imports Triton, so CPU-only code and tests always have an oracle; on CPU tensors
the ops run these very functions (design.md §6). One family per file: ``attention`` (prefill under
eviction steps, one decode query), ``eviction`` (priorities and the eviction rule, streaming
and parallel), ``evict`` (a decode step's in-place cache writes), ``target`` (the
future-attention training target), ``memory_scorer`` (the ``memory`` scorer's decode step) and
``scorer_layers`` (the learned scorers' arithmetic).
"""

from .attention import bounded_decode_attention, masked_attention, query_group
from .evict import evict_into_pool_, window_slot, write_new_token_
from .eviction import (
    BoundaryDecisions,
    beats,
    enters_pool,
    eviction_steps,
    prefix_kth_smallest,
    running_topk_boundary,
    spread_scores,
    streaming_eviction_steps,
    token_priority,
    weakest_slot,
)
from .memory_scorer import memory_scorer_step_
from .target import future_attention_target, future_attention_target_dense

__all__ = [
    "BoundaryDecisions",
    "beats",
    "bounded_decode_attention",
    "enters_pool",
    "evict_into_pool_",
    "eviction_steps",
    "future_attention_target",
    "future_attention_target_dense",
    "masked_attention",
    "memory_scorer_step_",
    "prefix_kth_smallest",
    "query_group",
    "running_topk_boundary",
    "spread_scores",
    "streaming_eviction_steps",
    "token_priority",
    "weakest_slot",
    "window_slot",
    "write_new_token_",
]
