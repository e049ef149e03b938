"""kvpop_compile: a bounded KV cache with a learned keep-or-drop policy for Qwen3 models.

The policy reference lives in :mod:`kvpop_compile.runtime`; graph passes in
:mod:`kvpop_compile.passes`.
"""

from .config import KVpopConfig, ScorerKind

__version__ = "0.1.0"

__all__ = ["KVpopConfig", "ScorerKind", "__version__"]
