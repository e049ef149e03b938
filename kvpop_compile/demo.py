"""A short demonstration of the bounded cache on a small Qwen3 built from a config.

It takes the first attention layer of a randomly initialised Qwen3, feeds it the bytes of a
standard-library source file one token at a time, and runs that layer's attention twice: over the
full causal history, and through the KVpop bounded cache under several policies. It reports the
cache's size as generation goes on (flat for KVpop, linear for a full cache) and how far each
policy's attention output is from full attention.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from .config import KVpopConfig
from .runtime import BoundedCacheState, build_scorer, decode_step, masked_attention


def tiny_qwen3_config(**overrides) -> Qwen3Config:
    """A few-layer Qwen3 with a byte vocabulary: small enough for any CPU."""
    settings = {
        "vocab_size": 256,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
    }
    settings.update(overrides)
    return Qwen3Config(**settings)


@dataclass
class LayerInputs:
    """What the first attention layer computes before attending, for N tokens."""

    q: torch.Tensor  # (1, Hq, N, D) after RoPE
    k: torch.Tensor  # (1, Hkv, N, D) after RoPE
    raw_k: torch.Tensor  # (1, Hkv, N, D) after k_norm, before RoPE
    v: torch.Tensor  # (1, Hkv, N, D)
    scale: float


@torch.no_grad()
def first_layer_inputs(model: Qwen3ForCausalLM, token_ids: torch.Tensor) -> LayerInputs:
    """Project ``token_ids (1, N)`` to the first layer's q, k, v exactly as Qwen3 does."""
    inner = model.model
    attention = inner.layers[0].self_attn
    hidden = inner.layers[0].input_layernorm(inner.embed_tokens(token_ids))
    shape = (*hidden.shape[:-1], -1, attention.head_dim)
    q = attention.q_norm(attention.q_proj(hidden).view(shape)).transpose(1, 2)
    raw_k = attention.k_norm(attention.k_proj(hidden).view(shape)).transpose(1, 2)
    v = attention.v_proj(hidden).view(shape).transpose(1, 2)
    positions = torch.arange(token_ids.shape[1]).unsqueeze(0)
    cos, sin = inner.rotary_emb(hidden, positions)
    q, k = apply_rotary_pos_emb(q, raw_k, cos, sin)
    return LayerInputs(q=q, k=k, raw_k=raw_k, v=v, scale=attention.scaling)


def demo_text_tokens(length: int) -> torch.Tensor:
    """``(1, length)`` byte tokens of standard-library source (``json``'s encoder)."""
    data = inspect.getsource(json.encoder).encode()
    while len(data) < length:
        data += data
    return torch.tensor(list(data[:length])).unsqueeze(0)


@torch.no_grad()
def run_policy(inputs: LayerInputs, config: KVpopConfig, checkpoints: list[int]):
    """Decode every token through a bounded cache. Returns the outputs ``(1, Hq, N, D)`` and the
    cache bytes after each checkpoint step."""
    scorer = build_scorer(config, inputs.k.shape[1], inputs.k.shape[3])
    state = BoundedCacheState.empty(config, scorer, batch=1, head_dim=inputs.k.shape[3])
    outputs, sizes = [], {}
    for step in range(inputs.q.shape[2]):
        token = slice(step, step + 1)
        outputs.append(
            decode_step(
                state,
                inputs.q[:, :, token],
                inputs.k[:, :, token],
                inputs.raw_k[:, :, token],
                inputs.v[:, :, token],
                scorer=scorer,
                config=config,
                scale=inputs.scale,
            )
        )
        if step + 1 in checkpoints:
            sizes[step + 1] = state.nbytes
    return torch.cat(outputs, dim=2), sizes


def relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    return float((output - reference).norm() / reference.norm())


def run_demo(tokens: int = 1024, capacity: int = 128, seed: int = 0) -> list[str]:
    """Run the demonstration; returns the report lines."""
    if tokens < 2:
        raise ValueError(f"tokens must be >= 2, got {tokens}")
    if capacity < 8:
        raise ValueError(f"capacity must be >= 8, got {capacity}")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_qwen3_config(max_position_embeddings=max(4096, tokens))).eval()
    inputs = first_layer_inputs(model, demo_text_tokens(tokens))
    full, _ = masked_attention(inputs.q, inputs.k, inputs.v, None, scale=inputs.scale)
    heads, head_dim = inputs.k.shape[1], inputs.k.shape[3]
    checkpoints = sorted({min(tokens, c) for c in (tokens // 4, tokens // 2, tokens)})
    element = inputs.k.element_size()
    lines = [
        f"Qwen3 layer 0 (random weights), {heads} KV heads x head_dim {head_dim}, "
        f"{tokens} byte tokens of json/encoder.py, decoded one at a time.",
        "",
        "KV bytes held after N tokens (full cache vs KVpop at capacity "
        f"{capacity}, scorer state included):",
    ]
    window = max(1, capacity // 4)
    sinks = min(4, capacity - window)
    policies = {
        "window (StreamingLLM)": "window",
        "h2o": "h2o",
        "knorm": "knorm",
        "memory (untrained)": "memory",
    }
    results = {}
    for label, kind in policies.items():
        config = KVpopConfig(
            sinks=sinks, window=window, topk=capacity - sinks - window, scorer=kind
        )
        results[label] = run_policy(inputs, config, checkpoints)
    _, sizes = results["window (StreamingLLM)"]
    for n in checkpoints:
        full_bytes = 2 * heads * n * head_dim * element
        lines.append(f"  N={n:>6}: full {full_bytes:>9,d} B   KVpop {sizes[n]:>9,d} B")
    lines += ["", "Attention output vs full attention (relative L2 error over all tokens):"]
    exact_config = KVpopConfig(sinks=sinks, window=window, topk=tokens, scorer="memory")
    exact, _ = run_policy(inputs, exact_config, [])
    lines.append(f"  capacity >= N (no eviction)     {relative_error(exact, full):.2e}")
    for label, (output, _) in results.items():
        lines.append(f"  {label:<30}  {relative_error(output, full):.2e}")
    lines.append("")
    lines.append(
        "The memory scorer is randomly initialised: its error is that of an untrained policy."
    )
    return lines
