"""In-place updates of a bounded cache's tensors for one decode step: the fused evict and the
new token's write (design.md §5). Plain PyTorch, no Triton: :func:`update_cache_` is the
reference (and CPU implementation) of the ``kvpop::update_cache`` op, whose Triton kernel, one
launch for both, is in :mod:`kvpop_compile.runtime.kernels.update_cache`.

Written on bare tensors so that an op schema can carry them, with no ``.item()`` and no Python
branch on data: one traced step serves every step.
"""

from __future__ import annotations

import torch

from ..policy import enters_pool, weakest_slot, window_slot


def _rows(
    cache: torch.Tensor, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Index tensors ``(B, 1)`` and ``(1, H)`` that address one row per (batch, head) of a
    ``(B, H, ...)`` cache tensor, or of pages ``rows (B,)`` of a ``(P, H, ...)`` one. Updates
    go through ``index_put_`` with them, which Inductor performs in place on the cache; a
    ``scatter_`` or ``index_copy_`` into the cache is compiled as a copy of the whole cache
    every step."""
    batch, heads = cache.shape[:2]
    pages = torch.arange(batch, device=cache.device) if rows is None else rows
    return pages[:, None], torch.arange(heads, device=cache.device)[None, :]


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
    rows: torch.Tensor | None = None,
) -> None:
    """Move the token leaving the window into the pool if it enters it, in place.

    Args:
        keys, values: ``(B, H, C, D)`` cache slots; positions ``(B, H, C)`` int64 (-1 empty);
            priorities ``(B, H, K)`` pool priorities; statistic ``(B, H, C)`` or ``(B, H, 0)``.
        leaving_key, leaving_value: ``(B, H, D)``; leaving_position ``(B, H)`` (-1: no token);
            leaving_statistic ``(B, H)``; priority ``(B, H)`` its priority.
        rows: ``(B,)`` int64 or ``None``: the cache tensors have ``P`` pages and row ``b``'s
            token goes into page ``rows[b]``.

    Argmin over the pool, compare, conditional overwrite of key, value, position, priority (and
    attention statistic), per (batch, head). A free slot is always taken; a token that loses is
    dropped (the new token overwrites its ring slot next).
    """
    if topk == 0:
        return
    pool_positions = positions[..., sinks : sinks + topk]
    pool_priorities = priorities
    if rows is not None:
        pool_positions, pool_priorities = pool_positions[rows], priorities[rows]
    weakest = weakest_slot(pool_priorities, pool_positions)  # (B, H, 1)
    old_priority = pool_priorities.gather(2, weakest)
    old_position = pool_positions.gather(2, weakest)
    new_priority = priority.unsqueeze(-1).to(priorities.dtype)
    new_position = leaving_position.unsqueeze(-1)
    wins = enters_pool(new_priority, new_position, old_priority, old_position)  # (B, H, 1)
    rows = _rows(keys, rows)
    at_slot = (*rows, (weakest + sinks).squeeze(-1))  # (B, H) indices of the weakest slot
    keep = wins.squeeze(-1)  # (B, H)

    def overwrite(tensor: torch.Tensor, new: torch.Tensor, index=at_slot) -> None:
        old = tensor[index]  # (B, H) or (B, H, D)
        condition = keep if old.dim() == 2 else keep.unsqueeze(-1)
        tensor.index_put_(index, torch.where(condition, new.to(tensor.dtype), old))

    overwrite(keys, leaving_key)
    overwrite(values, leaving_value)
    overwrite(positions, leaving_position)
    if statistic.shape[-1]:
        overwrite(statistic, leaving_statistic)
    overwrite(priorities, priority, index=(*rows, weakest.squeeze(-1)))


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
    rows: torch.Tensor | None = None,
) -> None:
    """Write each row's token at its position ``seen (B,)`` (``key, raw_key, value
    (B, H, 1, D)``), in place: into sink slot ``seen`` while ``seen < sinks``, otherwise into
    its window ring slot; with ``rows (B,)``, into page ``rows[b]`` of ``P``-page cache
    tensors."""
    ring, ring_slot = window_slot(seen, sinks, topk, window)
    slot = torch.where(seen < sinks, seen, ring_slot)
    rows = _rows(keys, rows)
    at_slot, at_ring = (*rows, slot.view(-1, 1)), (*rows, ring.view(-1, 1))  # (B, H) each
    keys.index_put_(at_slot, key[:, :, 0].to(keys.dtype))
    values.index_put_(at_slot, value[:, :, 0].to(values.dtype))
    positions.index_put_(at_slot, seen.view(-1, 1).expand(rows[0].shape[0], positions.shape[1]))
    window_keys.index_put_(at_ring, raw_key[:, :, 0].to(window_keys.dtype))
    if statistic.shape[-1]:
        statistic.index_put_(at_slot, torch.zeros((), dtype=statistic.dtype, device=keys.device))


def update_cache_(
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    priorities: torch.Tensor,
    window_keys: torch.Tensor,
    statistic: torch.Tensor,
    leaving_key: torch.Tensor,
    leaving_value: torch.Tensor,
    leaving_position: torch.Tensor,
    leaving_statistic: torch.Tensor,
    priority: torch.Tensor,
    seen: torch.Tensor,
    key: torch.Tensor,
    raw_key: torch.Tensor,
    value: torch.Tensor,
    sinks: int,
    topk: int,
    window: int,
    rows: torch.Tensor | None = None,
) -> None:
    """One decode step's cache update, in place: :func:`evict_into_pool_` of the leaving token,
    then :func:`write_new_token_` of the new one into the ring slot it vacated (shapes as
    there; with ``rows (B,)`` the cache tensors have ``P`` pages and row ``b`` updates page
    ``rows[b]``). The two touch different slots, so the order only matters for the leaving
    token's copies, which the caller has already read."""
    evict_into_pool_(
        keys, values, positions, priorities, statistic, leaving_key, leaving_value,
        leaving_position, leaving_statistic, priority, sinks, topk, rows,
    )  # fmt: skip
    write_new_token_(
        keys, values, positions, window_keys, statistic, seen, key, raw_key, value,
        sinks, topk, window, rows,
    )  # fmt: skip
