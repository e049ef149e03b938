"""The decode step's cache update (design.md §5) in one launch per layer, covering every
(batch, KV head) at once: the token leaving the window moves into the pool if it beats the
pool's weakest entry (the fused evict), then the new token is written into its sink or
window-ring slot. Two launches cost a decode step twice the launch latency at batch 1, where a
step is launch-bound; one program does both for its row, since the two touch different slots
(a pool slot, and a sink or ring slot).

One program per (batch, head): load the pool's priorities and positions, find the weakest slot
(lowest priority; among equals the newest position; an empty slot before any token), compare the
leaving token with it, and overwrite key, value, position, priority (and the attention statistic)
in place when the token wins; then write the new token. No host synchronisation, no
data-dependent launch. ``EVICT=False`` is the write alone (a cache without a pool). With a
state-index indirection (``HAS_ROWS``) the program of batch row ``b`` updates page ``rows[b]``
of the cache tensors, found by each tensor's page stride.
Reference: :func:`kvpop_compile.runtime.reference.update_cache.update_cache_`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from .common import (
    INT64_MAX,
    next_power_of_2,
    page_index,
    require_contiguous,
    require_contiguous_pages,
)

# Pool slots scanned per iteration of the weakest-entry search: 1024 keeps the scan in
# registers at 4 warps (a whole pool of ~8000 slots in one block spills).
POOL_CHUNK = 1024


@triton.jit
def _evict_row(
    row, keys, values, positions, priorities, statistic,
    leaving_key, leaving_value, leaving_position, leaving_statistic, priority,
    sinks, topk, dim,
    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, HAS_STATISTIC: tl.constexpr,
):  # fmt: skip
    # The cache pointers are this (page, head)'s own rows; ``row`` indexes the step's inputs.
    # Weakest entry: lowest priority, then the newest position (an empty slot, -1, counts as
    # newer than any token), then the first slot — exactly the reference's order. The pool is
    # scanned in chunks of BLOCK_K with a running best, so a large pool does not spill registers.
    old_priority = tl.full([], float("inf"), dtype=priorities.dtype.element_ty)
    newest = tl.full([], -1, dtype=tl.int64)
    # int64 whatever width the caller passes `topk` in (Inductor may pass int64): the
    # loop-carried type must not change.
    weakest = tl.full([], 0, dtype=tl.int64)
    for start in range(0, topk, BLOCK_K):
        slots = start + tl.arange(0, BLOCK_K)
        in_pool = slots < topk
        pool_priority = tl.load(priorities + slots, mask=in_pool, other=float("inf"))
        pool_position = tl.load(positions + sinks + slots, mask=in_pool, other=0)
        lowest = tl.min(pool_priority, axis=0)
        effective = tl.where(pool_position < 0, INT64_MAX, pool_position)
        candidate = in_pool & (pool_priority == lowest)
        chunk_newest = tl.max(tl.where(candidate, effective, -1), axis=0)
        chunk_weakest = tl.min(
            tl.where(candidate & (effective == chunk_newest), slots, topk), 0
        ).to(tl.int64)
        # Chunks come in slot order: on a full tie the earlier chunk's slot stays.
        better = (lowest < old_priority) | ((lowest == old_priority) & (chunk_newest > newest))
        old_priority = tl.where(better, lowest, old_priority)
        newest = tl.where(better, chunk_newest, newest)
        weakest = tl.where(better, chunk_weakest, weakest)
    old_position = tl.where(newest == INT64_MAX, -1, newest)

    new_priority = tl.load(priority + row)
    new_position = tl.load(leaving_position + row)
    beats = (new_priority > old_priority) | (
        (new_priority == old_priority) & (new_position < old_position)
    )
    wins = (new_position >= 0) & ((old_position < 0) | beats)

    slot = sinks + weakest
    features = tl.arange(0, BLOCK_D)
    in_row = features < dim
    # Broadcast through int32: Triton's interpreter cannot AND a scalar bool into a vector.
    write = in_row & ((features * 0 + wins.to(tl.int32)) > 0)
    source = row * dim + features
    target = slot * dim + features
    tl.store(keys + target, tl.load(leaving_key + source, mask=in_row), mask=write)
    tl.store(values + target, tl.load(leaving_value + source, mask=in_row), mask=write)
    tl.store(positions + slot, new_position, mask=wins)
    tl.store(priorities + weakest, new_priority, mask=wins)
    if HAS_STATISTIC:
        tl.store(statistic + slot, tl.load(leaving_statistic + row), mask=wins)


@triton.jit
def _write_row(
    row, keys, values, positions, window_keys, statistic, seen, key, raw_key, value,
    heads, sinks, topk, window, dim,
    BLOCK_D: tl.constexpr, HAS_STATISTIC: tl.constexpr,
):  # fmt: skip
    position = tl.load(seen + row // heads)  # the row's batch entry
    ring = (position - sinks) % window
    ring = tl.where(ring < 0, ring + window, ring)  # the sign of % follows C for negatives
    slot = tl.where(position < sinks, position, sinks + topk + ring)
    features = tl.arange(0, BLOCK_D)
    in_row = features < dim
    source = row * dim + features
    target = slot * dim + features
    tl.store(keys + target, tl.load(key + source, mask=in_row), mask=in_row)
    tl.store(values + target, tl.load(value + source, mask=in_row), mask=in_row)
    tl.store(
        window_keys + ring * dim + features, tl.load(raw_key + source, mask=in_row), mask=in_row
    )
    tl.store(positions + slot, position)
    if HAS_STATISTIC:
        tl.store(statistic + slot, 0.0)


@triton.jit
def _update_cache_kernel(
    keys, values, positions, priorities, window_keys, statistic,
    leaving_key, leaving_value, leaving_position, leaving_statistic, priority,
    seen, key, raw_key, value, rows,
    # Elements between consecutive pages (batch rows) of each cache tensor.
    page_keys, page_values, page_positions, page_priorities, page_window_keys, page_statistic,
    heads, sinks, topk, window, capacity, dim,
    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, HAS_STATISTIC: tl.constexpr,
    EVICT: tl.constexpr, HAS_ROWS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # flat (batch, kv head) of the step's inputs
    page = page_index(rows, row // heads, HAS_ROWS)
    head = row % heads
    keys += page * page_keys + head * capacity * dim
    values += page * page_values + head * capacity * dim
    positions += page * page_positions + head * capacity
    priorities += page * page_priorities + head * topk
    window_keys += page * page_window_keys + head * window * dim
    statistic += page * page_statistic + head * capacity
    if EVICT:
        _evict_row(
            row, keys, values, positions, priorities, statistic,
            leaving_key, leaving_value, leaving_position, leaving_statistic, priority,
            sinks, topk, dim, BLOCK_K, BLOCK_D, HAS_STATISTIC,
        )  # fmt: skip
    _write_row(
        row, keys, values, positions, window_keys, statistic, seen, key, raw_key, value,
        heads, sinks, topk, window, dim, BLOCK_D, HAS_STATISTIC,
    )  # fmt: skip


def update_cache(
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
    """Triton version of :func:`~kvpop_compile.runtime.reference.update_cache.update_cache_`, same
    arguments and shapes: cache ``keys, values (B, H, C, D)``, ``positions (B, H, C)`` int64,
    ``priorities (B, H, K)``, ``window_keys (B, H, W, D)``, ``statistic (B, H, C)`` or
    ``(B, H, 0)`` (all contiguous, updated in place); the leaving token's ``key, value
    (B, H, D)``, ``position, statistic, priority (B, H)``; the new token's position ``seen
    (B,)`` int64 and ``key, raw_key, value (B, H, 1, D)``. With ``rows (B,)`` int64 the cache
    tensors have ``P`` pages, each contiguous, at any page stride (views of a pool), and row
    ``b`` updates page ``rows[b]``."""
    cache = dict(keys=keys, values=values, positions=positions, priorities=priorities,
                 window_keys=window_keys, statistic=statistic)  # fmt: skip
    if rows is None:
        require_contiguous(**cache)
    else:
        require_contiguous_pages(**cache)
    batch, (heads, capacity, dim) = key.shape[0], keys.shape[1:]
    seen = seen.to(torch.int64).expand(batch).contiguous()
    wrap_triton(_update_cache_kernel)[(batch * heads,)](
        keys, values, positions, priorities, window_keys, statistic,
        leaving_key.to(keys.dtype).contiguous(),
        leaving_value.to(values.dtype).contiguous(),
        leaving_position.to(torch.int64).contiguous(),
        leaving_statistic.to(statistic.dtype).contiguous(),
        priority.to(priorities.dtype).contiguous(),
        seen, key.to(keys.dtype).contiguous(), raw_key.to(window_keys.dtype).contiguous(),
        value.to(values.dtype).contiguous(),
        seen if rows is None else rows.contiguous(),  # read only with HAS_ROWS
        *(t.stride(0) for t in cache.values()),
        heads, sinks, topk, window, capacity, dim,
        BLOCK_K=min(next_power_of_2(topk), POOL_CHUNK), BLOCK_D=next_power_of_2(dim),
        HAS_STATISTIC=statistic.shape[-1] > 0, EVICT=topk > 0, HAS_ROWS=rows is not None,
    )  # fmt: skip
