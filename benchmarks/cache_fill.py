"""Caches that hold N tokens without running N tokens through the model.

Filling a 32k-token cache by prefill costs O(N²) attention per layer, far more than the decode
steps being measured. A decode step's cost depends on the cache's shapes, not on the numbers
in it, so these functions write random keys and values where N tokens would have left them:
transformers' dynamic and static caches hold N tokens, and a KVpop cache holds what its policy
keeps after N tokens (sinks, a full pool of older tokens, the last ``window`` tokens) with
``seen = N``, so the next decode step evicts exactly as it would in a long generation.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedConfig
from transformers.cache_utils import DynamicCache, StaticCache

from kvpop_compile import KVpopConfig
from kvpop_compile.runtime import BoundedCacheState


def _kv_shape(config: PreTrainedConfig, n: int) -> tuple[int, int, int, int]:
    return (1, config.num_key_value_heads, n, config.head_dim)


def filled_dynamic_cache(
    config: PreTrainedConfig, n: int, generator: torch.Generator
) -> DynamicCache:
    """transformers' default cache holding ``n`` random tokens in every layer (batch 1)."""
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers):
        keys = torch.randn(_kv_shape(config, n), generator=generator)
        values = torch.randn(_kv_shape(config, n), generator=generator)
        cache.update(keys, values, layer)
    return cache


def filled_static_cache(
    config: PreTrainedConfig, n: int, max_cache_len: int, generator: torch.Generator
) -> StaticCache:
    """transformers' static cache of ``max_cache_len`` slots with the first ``n`` filled."""
    if not n < max_cache_len:
        raise ValueError(f"max_cache_len must exceed n to decode, got {max_cache_len} <= {n}")
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    cache.early_initialization(
        1, config.num_key_value_heads, config.head_dim, torch.float32, torch.device("cpu")
    )
    for layer in cache.layers:
        if not hasattr(layer, "cumulative_length"):
            raise RuntimeError(
                "this transformers version's StaticLayer has no cumulative_length; the "
                "benchmark needs one that tracks the written length in the cache"
            )
        layer.keys[:, :, :n].normal_(generator=generator)
        layer.values[:, :, :n].normal_(generator=generator)
        layer.cumulative_length.fill_(n)
    return cache


def _pool_positions(
    heads: tuple[int, int], older: int, kept: int, sinks: int, generator: torch.Generator
) -> torch.Tensor:
    """``(B, H, kept)`` distinct positions in ``[sinks, sinks + older)`` per head."""
    order = torch.rand(*heads, older, generator=generator).argsort(dim=-1)
    return order[..., :kept] + sinks


@torch.no_grad()
def fill_bounded_state(
    state: BoundedCacheState, config: KVpopConfig, n: int, generator: torch.Generator
) -> None:
    """Overwrite ``state`` (one layer) with what a KVpop cache holds after ``n`` tokens.

    Slot layout as in :mod:`kvpop_compile.runtime.cache`: position ``p < sinks`` in slot ``p``;
    the pool ``[S, S + K)`` holds ``min(K, n - W - S)`` distinct older positions (a random set:
    which tokens a scorer keeps does not change the step's cost) with random priorities; the
    window ring holds positions ``[max(S, n - W), n)`` in slot ``S + K + (p - S) % W``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    sinks, topk, window = config.sinks, config.topk, config.window
    batch, heads = state.keys.shape[:2]
    state.reset_()
    for tensor in (state.keys, state.values, state.window_keys):
        tensor.normal_(generator=generator)
    # The memory scorer's state is a gated running sum of positive features and a normaliser;
    # small positive values keep its read well conditioned, like a real state's.
    state.scorer_state.uniform_(0, 1, generator=generator)

    sink_positions = torch.arange(min(sinks, n))
    state.positions[..., sink_positions] = sink_positions
    recent = torch.arange(min(max(sinks, n - window), n), n)  # empty while n <= sinks
    state.positions[..., sinks + topk + (recent - sinks) % window] = recent

    older = max(0, n - window - sinks)  # tokens that have left the window
    kept = min(topk, older)
    if kept:
        pool = slice(sinks, sinks + kept)
        state.positions[..., pool] = _pool_positions((batch, heads), older, kept, sinks, generator)
        state.priorities[..., :kept] = torch.randn(batch, heads, kept, generator=generator)
    state.seen.fill_(n)
