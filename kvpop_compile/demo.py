"""``kvpop-compile demo``: a small Qwen3 generating with a full cache and with a KVpop cache.

The model is built from a config with seeded random weights (nothing is downloaded). It is
prompted with the bytes of a standard-library source file and generates greedily three times:
with transformers' full cache, with KVpop at a budget that holds every token (the tokens must
be the same), and with KVpop at a small budget. The report gives the cache's size as generation
goes on, agreement with the full-cache continuation, and tokens per second.
"""

from __future__ import annotations

import copy
import inspect
import json
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from .config import KVpopConfig
from .generation import new_cache
from .kv_cache import KVpopCache
from .transform import transform


def tiny_qwen3_config(**overrides) -> Qwen3Config:
    """A two-layer Qwen3 with a byte vocabulary: small enough for any CPU."""
    settings = {
        "vocab_size": 256,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 8192,
    }
    settings.update(overrides)
    return Qwen3Config(**settings)


def demo_prompt(length: int) -> torch.Tensor:
    """``(1, length)`` byte tokens of standard-library source (``json``'s encoder)."""
    data = inspect.getsource(json.encoder).encode()[:length]
    return torch.tensor(list(data)).unsqueeze(0)


def cache_bytes(cache) -> int:
    """Bytes of KV state a cache holds: a KVpopCache's fixed buffers, or a DynamicCache's keys
    and values."""
    if isinstance(cache, KVpopCache):
        return cache.nbytes
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


@dataclass
class GenerationRun:
    tokens: torch.Tensor  # (1, new_tokens) generated tokens
    cache_bytes: dict[int, int] = field(default_factory=dict)  # tokens in context -> bytes
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens.shape[1] / self.seconds


@torch.no_grad()
def greedy_run(model: nn.Module, prompt: torch.Tensor, new_tokens: int, cache, checkpoints):
    """Greedy generation token by token through ``model``'s forward with ``cache``."""
    start = time.perf_counter()
    logits = model(input_ids=prompt, cache=cache, use_cache=True).logits[:, -1]
    generated, sizes = [], {}
    for step in range(new_tokens):
        token = logits.argmax(dim=-1, keepdim=True)
        generated.append(token)
        position = torch.tensor([[prompt.shape[1] + step]])
        logits = model(input_ids=token, position_ids=position, cache=cache, use_cache=True).logits
        logits = logits[:, -1]
        if prompt.shape[1] + step + 1 in checkpoints:
            sizes[prompt.shape[1] + step + 1] = cache_bytes(cache)
    return GenerationRun(torch.cat(generated, dim=1), sizes, time.perf_counter() - start)


@dataclass
class DemoResult:
    config: KVpopConfig
    full: GenerationRun
    roomy: GenerationRun  # KVpop with capacity >= every token: must equal `full`
    bounded: GenerationRun

    def agreement(self, run: GenerationRun) -> float:
        return float((run.tokens == self.full.tokens).float().mean())

    def report(self) -> list[str]:
        c = self.config
        lines = [
            f"Small Qwen3 (random weights, 2 layers), greedy, {self.full.tokens.shape[1]} new "
            f"tokens after a prompt from json/encoder.py.",
            f"KVpop budget: {c.sinks} sinks + {c.window} window + {c.topk} pool = {c.capacity} "
            f"tokens per layer and KV head, scorer {c.scorer.value}.",
            "",
            "KV cache bytes with N tokens in context:",
        ]
        for n, full_bytes in self.full.cache_bytes.items():
            bounded = self.bounded.cache_bytes[n]
            lines.append(f"  N={n:>6}: full {full_bytes:>10,d} B   KVpop {bounded:>10,d} B")
        lines += [
            "",
            f"KVpop, budget >= all tokens: {self.agreement(self.roomy):.1%} of tokens equal "
            "to the full-cache continuation",
            f"KVpop, budget {c.capacity}: {self.agreement(self.bounded):.1%} equal (untrained "
            "policy on a random model: this shows the mechanism, not quality)",
            f"tokens/s: full {self.full.tokens_per_second:.0f}, "
            f"KVpop {self.bounded.tokens_per_second:.0f}",
        ]
        return lines


def run_demo(
    tokens: int = 1024, capacity: int = 128, scorer: str = "window", seed: int = 0
) -> DemoResult:
    """Generate ``tokens`` new tokens with a full cache and with KVpop at ``capacity``."""
    if tokens < 2:
        raise ValueError(f"tokens must be >= 2, got {tokens}")
    if capacity < 8:
        raise ValueError(f"capacity must be >= 8, got {capacity}")
    window = max(1, capacity // 4)
    sinks = min(4, capacity - window)
    config = KVpopConfig(sinks=sinks, window=window, topk=capacity - sinks - window, scorer=scorer)
    prompt = demo_prompt(64)
    total = prompt.shape[1] + tokens
    torch.manual_seed(seed)
    original = Qwen3ForCausalLM(tiny_qwen3_config(max_position_embeddings=max(8192, total)))
    original.eval()
    checkpoints = sorted({max(prompt.shape[1] + 1, total * k // 4) for k in (1, 2, 4)})
    full = greedy_run(original, prompt, tokens, DynamicCache(config=original.config), checkpoints)
    roomy_config = KVpopConfig(sinks=sinks, window=window, topk=total, scorer=scorer)
    roomy_model = transform(copy.deepcopy(original), roomy_config)
    roomy = greedy_run(roomy_model, prompt, tokens, new_cache(roomy_model), checkpoints)
    bounded_model = transform(original, config)
    bounded = greedy_run(bounded_model, prompt, tokens, new_cache(bounded_model), checkpoints)
    return DemoResult(config, full, roomy, bounded)
