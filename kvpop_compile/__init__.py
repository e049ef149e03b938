"""kvpop_compile: a bounded KV cache with a learned keep-or-drop policy for Qwen3 models.

``transform(model, config)`` rewrites a Hugging Face Qwen3 / Qwen3-MoE model so that its cache
never exceeds ``config.capacity`` tokens per layer and KV head; ``compile`` compiles its decode
step whole. The policy reference lives in :mod:`kvpop_compile.runtime`; graph passes in
:mod:`kvpop_compile.passes`.
"""

# First: refuses an unsupported transformers release before any module relies on it.
from . import compatibility  # noqa: F401
from ._version import __version__
from .config import KVpopConfig, ScorerKind
from .engines import EngineRunner, export, load
from .generation import compile, decode_one_token, generate, new_cache, prefill
from .kv_cache import KVpopCache
from .scorer_io import load_scorer, save_scorer
from .streaming_heads import make_streaming_heads, streaming_heads
from .training import TrainSettings, train_scorer
from .transform import transform

__all__ = [
    "EngineRunner",
    "KVpopCache",
    "KVpopConfig",
    "ScorerKind",
    "TrainSettings",
    "__version__",
    "compile",
    "decode_one_token",
    "export",
    "generate",
    "load",
    "load_scorer",
    "make_streaming_heads",
    "new_cache",
    "prefill",
    "save_scorer",
    "streaming_heads",
    "train_scorer",
    "transform",
]
