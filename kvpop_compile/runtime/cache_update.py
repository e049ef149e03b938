"""In-place updates of a bounded cache's tensors for one decode step: the fused evict and the
new token's write (DESIGN §5). Plain PyTorch, no Triton: the reference (and CPU implementation)
of the ``kvpop::evict`` and ``kvpop::write_token`` ops.

Written on bare tensors so that an op schema can carry them, with no ``.item()`` and no Python
branch on data: one traced step serves every step.
"""

from __future__ import annotations

import torch

from .eviction import enters_pool, weakest_slot


def evict_into_pool_(
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
    """Move the token leaving the window into the pool if it enters it, in place.

    Args:
        keys, values: ``(B, H, C, D)`` cache slots; positions ``(B, H, C)`` int64 (-1 empty);
            priorities ``(B, H, K)`` pool priorities; statistic ``(B, H, C)`` or ``(B, H, 0)``.
        leaving_key, leaving_value: ``(B, H, D)``; leaving_position ``(B, H)`` (-1: no token);
            leaving_statistic ``(B, H)``; priority ``(B, H)`` its priority.

    Argmin over the pool, compare, conditional overwrite of key, value, position, priority (and
    attention statistic), per (batch, head). A free slot is always taken; a token that loses is
    dropped (the new token overwrites its ring slot next).
    """
    if topk == 0:
        return
    pool_positions = positions[..., sinks : sinks + topk]
    weakest = weakest_slot(priorities, pool_positions)  # (B, H, 1)
    old_priority = priorities.gather(2, weakest)
    old_position = pool_positions.gather(2, weakest)
    new_priority = priority.unsqueeze(-1).to(priorities.dtype)
    new_position = leaving_position.unsqueeze(-1)
    wins = enters_pool(new_priority, new_position, old_priority, old_position)
    slot = weakest + sinks  # (B, H, 1) cache slot of the weakest pool entry

    def overwrite(tensor: torch.Tensor, new: torch.Tensor) -> None:
        per_slot = tensor.dim() == 3
        index = slot if per_slot else slot.unsqueeze(-1).expand(-1, -1, -1, tensor.shape[-1])
        keep = wins if per_slot else wins.unsqueeze(-1)
        tensor.scatter_(2, index, torch.where(keep, new.to(tensor.dtype), tensor.gather(2, index)))

    overwrite(keys, leaving_key.unsqueeze(2))
    overwrite(values, leaving_value.unsqueeze(2))
    overwrite(positions, new_position)
    if statistic.shape[-1]:
        overwrite(statistic, leaving_statistic.unsqueeze(-1))
    priorities.scatter_(2, weakest, torch.where(wins, new_priority, old_priority))


def window_slot(seen: torch.Tensor, sinks: int, topk: int, window: int):
    """Ring index and cache slot of position ``seen`` in the window ring: ``() int64`` each."""
    ring = torch.remainder(seen - sinks, window)
    return ring, sinks + topk + ring


def write_new_token_(
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
    """Write the token at position ``seen`` (``key, raw_key, value (B, H, 1, D)``), in place:
    into sink slot ``seen`` while ``seen < sinks``, otherwise into its window ring slot."""
    ring, ring_slot = window_slot(seen, sinks, topk, window)
    slot = torch.where(seen < sinks, seen, ring_slot).view(1)
    keys.index_copy_(2, slot, key.to(keys.dtype))
    values.index_copy_(2, slot, value.to(values.dtype))
    positions.index_copy_(2, slot, seen.expand(*positions.shape[:2], 1))
    window_keys.index_copy_(2, ring.view(1), raw_key.to(window_keys.dtype))
    if statistic.shape[-1]:
        statistic.index_fill_(2, slot, 0.0)
