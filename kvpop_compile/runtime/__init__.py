"""KVpop runtime: the policy, the bounded cache, scorers and the training target.

Everything importable from here is plain PyTorch (no Triton), so it is the oracle for the
kernels and graph passes built on it.
"""

from .attention import bounded_decode_attention, masked_attention
from .bounded_attention import (
    decode_step,
    decode_tokens,
    evict_,
    leaving_token,
    prefill,
    write_token_,
)
from .cache import BoundedCacheState
from .eviction import (
    BoundaryDecisions,
    eviction_steps,
    prefix_kth_smallest,
    running_topk_boundary,
    streaming_eviction_steps,
    weakest_slot,
)
from .loss import (
    boundary_accuracy,
    boundary_decisions,
    boundary_loss,
    quantile_bce_loss,
    regression_loss,
    target_priority,
)
from .memory_scorer import MemoryScorer
from .scorers import (
    H2OScorer,
    KNormScorer,
    MLPScorer,
    RandomScorer,
    Scorer,
    TOVAScorer,
    WindowScorer,
    build_scorer,
)
from .target import future_attention_target, future_attention_target_dense

__all__ = [
    "BoundaryDecisions",
    "BoundedCacheState",
    "H2OScorer",
    "KNormScorer",
    "MLPScorer",
    "MemoryScorer",
    "RandomScorer",
    "Scorer",
    "TOVAScorer",
    "WindowScorer",
    "boundary_accuracy",
    "boundary_decisions",
    "boundary_loss",
    "bounded_decode_attention",
    "build_scorer",
    "decode_step",
    "decode_tokens",
    "evict_",
    "eviction_steps",
    "future_attention_target",
    "future_attention_target_dense",
    "leaving_token",
    "masked_attention",
    "prefill",
    "prefix_kth_smallest",
    "quantile_bce_loss",
    "regression_loss",
    "running_topk_boundary",
    "streaming_eviction_steps",
    "target_priority",
    "weakest_slot",
    "write_token_",
]
