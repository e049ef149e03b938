"""The ``kvpop`` custom ops that a transformed graph carries.

Each op is a ``torch.library.triton_op``: its body is traceable PyTorch, so Inductor and
AOTInductor inline and lower it (an exported package then needs no Python definition of the
op), and a fake implementation is derived from it. The body runs the plain-PyTorch reference
on every device; a Triton kernel takes the CUDA path inside the same body.

Importing this module registers the ops; ``torch.ops.kvpop.<name>`` calls them.
"""

from __future__ import annotations

import torch
from torch.library import triton_op

from . import attention, cache_update, eviction, target


@triton_op("kvpop::eviction_steps", mutates_args=())
def eviction_steps(priority: torch.Tensor, sinks: int, window: int, topk: int) -> torch.Tensor:
    """Parallel eviction steps ``(..., N)`` int64 of static ``priority (..., N)``."""
    return eviction._eviction_steps(priority, sinks, window, topk)


@triton_op("kvpop::masked_attention", mutates_args=())
def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    evict_step: torch.Tensor | None,
    scale: float,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill attention under eviction steps: ``out (B, Hq, N, D)``, ``lse (B, Hq, N)``."""
    return attention.masked_attention(q, k, v, evict_step, scale=scale, block=block)


@triton_op("kvpop::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query per sequence against the bounded cache: ``out (B, Hq, 1, D)``, ``probs``."""
    return attention.bounded_decode_attention(q, keys, values, positions, scale=scale)


@triton_op("kvpop::evict", mutates_args=("keys", "values", "positions", "priorities", "statistic"))
def evict(
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    priorities: torch.Tensor,
    statistic: torch.Tensor,
    leaving_key: torch.Tensor,
    leaving_value: torch.Tensor,
    leaving_position: torch.Tensor,
    leaving_statistic: torch.Tensor,
    priority: torch.Tensor,
    sinks: int,
    topk: int,
) -> None:
    """Fused evict: argmin over the pool, compare, conditional overwrite (in place)."""
    cache_update.evict_into_pool_(
        keys, values, positions, priorities, statistic, leaving_key, leaving_value,
        leaving_position, leaving_statistic, priority, sinks, topk,
    )  # fmt: skip


@triton_op(
    "kvpop::write_token", mutates_args=("keys", "values", "positions", "window_keys", "statistic")
)
def write_token(
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    window_keys: torch.Tensor,
    statistic: torch.Tensor,
    seen: torch.Tensor,
    key: torch.Tensor,
    raw_key: torch.Tensor,
    value: torch.Tensor,
    sinks: int,
    topk: int,
    window: int,
) -> None:
    """Write the token at position ``seen`` into its sink or window-ring slot (in place)."""
    cache_update.write_new_token_(
        keys, values, positions, window_keys, statistic, seen, key, raw_key, value,
        sinks, topk, window,
    )  # fmt: skip


@triton_op("kvpop::future_attention_target", mutates_args=())
def future_attention_target(
    q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, window: int, scale: float, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Transposed-attention log target ``(B, Hkv, N)`` and its validity ``(N,)``."""
    return target.future_attention_target(q, k, lse, window=window, scale=scale, block=block)
