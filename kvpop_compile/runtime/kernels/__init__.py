"""Floor 2 of the runtime: the Triton kernels behind the ``kvpop`` ops, the CUDA implementation
of each op whose CPU implementation is the PyTorch reference (design.md §6, invariant 6). One
kernel family per file; each launcher takes the reference's arguments and returns the same
results. Kernels import only the reference's public helpers (:mod:`..reference`).

Importing this package imports triton; :mod:`kvpop_compile.runtime.ops` does so only on the
Triton path (see :mod:`kvpop_compile.runtime.dispatch`).
"""

from .decode_attention import bounded_decode_attention
from .evict import update_cache
from .eviction_steps import eviction_steps, running_topk_boundary
from .masked_attention import masked_attention
from .memory_scorer import memory_scorer_step
from .target import future_attention_target

__all__ = [
    "bounded_decode_attention",
    "eviction_steps",
    "future_attention_target",
    "masked_attention",
    "memory_scorer_step",
    "running_topk_boundary",
    "update_cache",
]
