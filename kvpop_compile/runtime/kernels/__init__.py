"""Floor 2 of the runtime: the Triton kernels behind the ``kvpop`` ops, the CUDA implementation
of each op whose CPU implementation is the PyTorch reference (design.md §6, invariant 6). One op
per file, named after the op, as its reference in :mod:`..reference` is; each launcher takes
the reference's arguments and returns the same results. Kernels import only the policy's
shared arithmetic (:mod:`..policy`) and the reference's public helpers.

Importing this package imports triton; :mod:`kvpop_compile.runtime.ops` does so only on the
Triton path (see :mod:`kvpop_compile.runtime.dispatch`).
"""

from .decode_attention import decode_attention
from .eviction_steps import eviction_steps
from .future_attention_target import future_attention_target
from .masked_attention import masked_attention
from .memory_scorer_step import memory_scorer_step
from .running_topk_boundary import running_topk_boundary
from .update_cache import update_cache

__all__ = [
    "decode_attention",
    "eviction_steps",
    "future_attention_target",
    "masked_attention",
    "memory_scorer_step",
    "running_topk_boundary",
    "update_cache",
]
