"""KVpop Qwen3 and Qwen3-MoE for vLLM: vLLM's own models with every attention layer's paged
attention replaced by :class:`~.layer.KVpopStateLayer`.

Qwen3's attention in vLLM rotates the keys before its attention layer; the scorers read the key
before RoPE (after ``k_norm``), so each attention module's forward is replaced by one that
keeps that key and hands both to the state layer. Everything else (projections, MLPs or
experts, norms, embeddings, the weight loader) is vLLM's.
"""

from __future__ import annotations

import types

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.interfaces import HasInnerState, IsAttentionFree
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

from ..runtime.scorers.registry import build_scorer
from ..scorer_io import check_shape, load_layers, read_tensors, saved_shape
from .layer import KVpopStateLayer
from .settings import ServeSettings


def _attention_forward(self, positions: torch.Tensor, hidden_states: torch.Tensor):
    """Qwen3's attention with the key before RoPE handed on: ``hidden_states (T, hidden)`` →
    ``(T, hidden)``."""
    qkv, _ = self.qkv_proj(hidden_states)
    q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
    q = self.q_norm(q.view(*q.shape[:-1], -1, self.head_dim)).view(q.shape)
    raw_k = self.k_norm(k.view(*k.shape[:-1], -1, self.head_dim)).view(k.shape)
    q, k = self.rotary_emb(positions, q, raw_k.clone())
    output = torch.empty_like(q)
    self.attn(q, k, raw_k, v, output)
    return self.o_proj(output)[0]


def _scorer(settings: ServeSettings, kv_heads: int, head_dim: int, layer: int):
    """A layer's scorer in float32 whatever the model's dtype, built as ``kc.transform`` builds
    it (the same seeded initialisation, so an untrained or random scorer is the same one)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        return build_scorer(settings.config, kv_heads, head_dim, layer)
    finally:
        torch.set_default_dtype(default)


class _BoundedModel:
    """What the KVpop models add to vLLM's: bounded attention layers and the scorer weights."""

    def _bound_attention(self, vllm_config: VllmConfig) -> None:
        settings = ServeSettings.from_hf_config(vllm_config.model_config.hf_config)
        context = vllm_config.compilation_config.static_forward_context
        dtype = vllm_config.model_config.dtype
        self.kvpop_settings = settings
        self.kvpop_layers: list[KVpopStateLayer] = []
        for index, layer in enumerate(self.model.layers):
            attention = getattr(layer, "self_attn", None)
            if attention is None:  # a layer another pipeline stage holds
                continue
            prefix = attention.attn.layer_name
            # vLLM's paged attention registered itself under this name; the state layer takes
            # its place, so no paged KV cache is allocated for it.
            del context[prefix]
            scorer = _scorer(settings, attention.num_kv_heads, attention.head_dim, index)
            attention.attn = KVpopStateLayer(
                settings.config, scorer.to(attention.qkv_proj.weight.device),
                num_heads=attention.num_heads, num_kv_heads=attention.num_kv_heads,
                head_dim=attention.head_dim, scale=attention.scaling, dtype=dtype, prefix=prefix,
            )  # fmt: skip
            attention.forward = types.MethodType(_attention_forward, attention)
            self.kvpop_layers.append(attention.attn)

    def _load_scorer(self) -> set[str]:
        """Load the trained scorer, with :mod:`kvpop_compile.scorer_io`'s checks; the names of
        the parameters it filled."""
        path = self.kvpop_settings.scorer_path
        names = {name for name, _ in self.named_parameters() if ".attn.scorer." in name}
        if path is None:
            return names
        first = self.kvpop_layers[0]
        have = {
            "num_layers": len(self.kvpop_layers),
            "num_kv_heads": first.num_kv_heads,
            "head_dim": first.head_dim,
        }
        check_shape(saved_shape(path), have, f"scorer {path} does not fit this model")
        load_layers([layer.scorer for layer in self.kvpop_layers], read_tensors(path))
        return names

    def load_weights(self, weights) -> set[str]:
        loaded = super().load_weights(weights)
        return set(loaded) | self._load_scorer()


class KVpopQwen3ForCausalLM(_BoundedModel, Qwen3ForCausalLM, HasInnerState, IsAttentionFree):
    """Qwen3 with a bounded KV cache per request (``hf_config.kvpop``)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._bound_attention(vllm_config)


class KVpopQwen3MoeForCausalLM(_BoundedModel, Qwen3MoeForCausalLM, HasInnerState, IsAttentionFree):
    """Qwen3-MoE with a bounded KV cache per request (``hf_config.kvpop``)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._bound_attention(vllm_config)
