"""The KVpop runtime, in floors; each floor imports only the floors below it.

1. :mod:`.policy` — the policy's arithmetic every path shares: priorities, the order between
   tokens, ring slots, GQA groups.
2. :mod:`.reference` — the plain-PyTorch reference of every op (no Triton): the oracle of the
   kernels and the CPU implementation of the ops.
3. :mod:`.kernels` — the Triton kernels (imported only on the Triton path), one file per op,
   named as its reference is.
4. :mod:`.ops` and :mod:`.dispatch` — the ``kvpop`` custom ops, each choosing its kernel or
   its reference by device.
5. :mod:`.scorers` — the scorers, one family per file behind the one ``Scorer`` interface.
6. :mod:`.cache`, :mod:`.decode_step`, :mod:`.chunk_step` and :mod:`.bounded_attention` — one
   layer's bounded cache state, the two steps that update it, and the module a rewritten graph
   calls.

Training-only code (the target's losses, the distillation student) lives in
:mod:`kvpop_compile.training`.
"""

from .bounded_attention import BoundedAttention
from .cache import BoundedCacheState
from .chunk_step import chunk_step
from .decode_step import decode_step, decode_tokens, leaving_token, update_state_
from .policy import BoundaryDecisions, spread_scores, token_priority, weakest_slot
from .reference import (
    decode_attention,
    eviction_steps,
    future_attention_target,
    future_attention_target_dense,
    masked_attention,
    prefix_kth_smallest,
    running_topk_boundary,
    streaming_eviction_steps,
)
from .scorers import (
    H2OScorer,
    KNormScorer,
    MemoryScorer,
    MLPScorer,
    RandomScorer,
    Scorer,
    TOVAScorer,
    WindowScorer,
    build_scorer,
)

__all__ = [
    "BoundaryDecisions",
    "BoundedAttention",
    "BoundedCacheState",
    "H2OScorer",
    "KNormScorer",
    "MLPScorer",
    "MemoryScorer",
    "RandomScorer",
    "Scorer",
    "TOVAScorer",
    "WindowScorer",
    "decode_attention",
    "build_scorer",
    "chunk_step",
    "decode_step",
    "decode_tokens",
    "eviction_steps",
    "future_attention_target",
    "future_attention_target_dense",
    "leaving_token",
    "masked_attention",
    "prefix_kth_smallest",
    "running_topk_boundary",
    "spread_scores",
    "streaming_eviction_steps",
    "token_priority",
    "update_state_",
    "weakest_slot",
]
