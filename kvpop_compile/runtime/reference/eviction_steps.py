"""The reference of the ``kvpop::eviction_steps`` op: the KVpop eviction rule, streaming and
parallel (design.md §2). Plain PyTorch, no Triton.

A token's priority is ``pi_t = rhat_t + lam * t``
(:func:`~kvpop_compile.runtime.policy.token_priority`, the one place it is computed).

Priorities are static, so the pool at step ``i`` is the running top-K of the tokens
``[sinks, i - window]`` that have left the window. A token once evicted never returns, so its
whole history is one integer, the eviction step ``e_t``: query ``i`` sees key ``t`` iff
``t <= i < e_t``.

``e_t`` needs the K-th oldest token among those that beat ``t``. Sorting tokens by priority turns
"the tokens that beat t" into a prefix of the sorted order, so every ``e_t`` is a *prefix order
statistic*: the K-th smallest position among the first ``r`` entries of a permutation. A wavelet
matrix answers that for all prefixes at once in ``log2 N`` vectorised passes, O(N log N) work per
row, with no Python loop over tokens (unlike a Fenwick sweep), so it runs batched on any device.

Order between tokens is strict: higher priority wins; on a tie the older (smaller position) wins.
"""

from __future__ import annotations

import torch

from ..policy import check_budget, check_priority, enters_pool, weakest_slot


def prefix_kth_smallest(values: torch.Tensor, k: int, *, bound: int | None = None) -> torch.Tensor:
    """For every prefix length ``r``, the k-th smallest (0-indexed) of ``values[..., :r]``.

    Args:
        values: ``(..., M)`` integers in ``[0, bound)``.
        k: which order statistic, ``>= 0``.
        bound: exclusive upper bound of the values, default ``M`` (a permutation's).

    Returns:
        ``(..., M + 1)`` int64; entry ``r`` is the k-th smallest of the first ``r`` values, or
        ``-1`` where ``r <= k`` (fewer than ``k + 1`` values).

    A wavelet matrix: level by level from the top bit, values are stably partitioned by that
    bit, and a prefix-count of zeros tells each query which half holds its answer. Each level is
    a cumsum, two gathers and a scatter over all rows and prefixes at once.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    bound = values.shape[-1] if bound is None else bound
    if values.numel() and (values.min() < 0 or values.max() >= bound):
        raise ValueError(f"prefix_kth_smallest needs values in [0, {bound})")
    return unchecked_prefix_kth_smallest(values, k, bound)


def unchecked_prefix_kth_smallest(values: torch.Tensor, k: int, bound: int) -> torch.Tensor:
    """:func:`prefix_kth_smallest` without input checks: no data-dependent Python, so it traces
    into one graph (the number of levels comes from ``bound``, not from the data)."""
    *lead, m = values.shape
    device = values.device
    if values.numel() == 0:
        return torch.full((*lead, m + 1), -1, dtype=torch.int64, device=device)
    rows = values.reshape(-1, m).to(torch.int64)
    num_rows = rows.shape[0]
    result = torch.zeros(num_rows, m + 1, dtype=torch.int64, device=device)
    levels = max(1, (bound - 1).bit_length())
    lo = torch.zeros(num_rows, m + 1, dtype=torch.int64, device=device)  # query range [lo, hi)
    hi = torch.arange(m + 1, device=device).expand(num_rows, m + 1).clone()
    remaining = torch.full((num_rows, m + 1), k, dtype=torch.int64, device=device)
    index = torch.arange(m, device=device).expand(num_rows, m)
    current = rows
    for level in reversed(range(levels)):
        bit = (current >> level) & 1
        zeros_before = torch.nn.functional.pad(torch.cumsum(1 - bit, dim=1), (1, 0))  # (R, M+1)
        total_zeros = zeros_before[:, -1:]
        zeros_lo = zeros_before.gather(1, lo)
        zeros_hi = zeros_before.gather(1, hi)
        zeros_in_range = zeros_hi - zeros_lo
        go_zero = remaining < zeros_in_range
        result |= (~go_zero).to(torch.int64) << level
        remaining = torch.where(go_zero, remaining, remaining - zeros_in_range)
        lo = torch.where(go_zero, zeros_lo, total_zeros + lo - zeros_lo)
        hi = torch.where(go_zero, zeros_hi, total_zeros + hi - zeros_hi)
        # Stable partition: zeros keep their order at the front, ones follow.
        zeros_prefix = zeros_before[:, :-1]
        destination = torch.where(bit == 0, zeros_prefix, total_zeros + index - zeros_prefix)
        current = torch.empty_like(current).scatter_(1, destination, current)
    prefix_length = torch.arange(m + 1, device=device)
    result = torch.where(prefix_length > k, result, torch.full_like(result, -1))
    return result.reshape(*lead, m + 1)


def rank_order(priority: torch.Tensor) -> torch.Tensor:
    """Positions sorted from strongest to weakest: ``(..., M)`` int64 (a stable sort keeps the
    older token first among equal priorities)."""
    return torch.sort(priority, dim=-1, descending=True, stable=True).indices


def eviction_steps(priority: torch.Tensor, *, sinks: int, window: int, topk: int) -> torch.Tensor:
    """The parallel rule: the step at which each token leaves the cache.

    Args:
        priority: ``(..., N)`` static priorities ``rhat_t + lam * t`` (no NaN).
        sinks, window, topk: the budget (design.md §2).

    Returns:
        ``(..., N)`` int64 ``e_t``: query ``i`` sees key ``t`` iff ``t <= i < e_t``; ``N`` for
        a token the cache still holds after the last step (sinks always).

    ``e_t = min{i >= t + W : #{u in [S, i - W], u != t, u beats t} >= K}``: with ``p_K`` the
    K-th oldest token that beats ``t``, ``e_t = max(t, p_K) + W``.
    """
    check_budget(sinks, window, topk)
    check_priority(priority)
    return unchecked_eviction_steps(priority, sinks, window, topk)


def unchecked_eviction_steps(
    priority: torch.Tensor, sinks: int, window: int, topk: int
) -> torch.Tensor:
    """:func:`eviction_steps` without input checks (traceable: no data-dependent Python), for
    the op and the kernel's closed forms, whose callers have checked the budget."""
    n = priority.shape[-1]
    steps = torch.full(priority.shape, n, dtype=torch.int64, device=priority.device)
    first = min(sinks, n)
    m = n - first
    if m == 0 or priority.numel() == 0:
        return steps
    local = torch.arange(m, device=priority.device)
    if topk == 0:
        # No pool: a token leaves the cache the moment it leaves the window.
        steps[..., first:] = (local + first + window).clamp(max=n)
        return steps
    order = rank_order(priority[..., first:])  # (..., M): rank -> local position
    # K-th oldest among the tokens that beat the token of rank r = the first r ranks.
    kth_oldest = unchecked_prefix_kth_smallest(order, topk - 1, m)[..., :m]
    evicted_after = torch.maximum(order, kth_oldest) + first + window
    by_rank = torch.where(kth_oldest >= 0, evicted_after.clamp(max=n), torch.full_like(order, n))
    steps[..., first:] = torch.empty_like(by_rank).scatter_(-1, order, by_rank)
    return steps


def streaming_eviction_steps(
    priority: torch.Tensor, *, sinks: int, window: int, topk: int
) -> torch.Tensor:
    """The streaming rule, one token at a time through a fixed pool of ``topk`` slots, exactly as
    decode runs it. Same contract as :func:`eviction_steps`; O(N K) and a Python loop over N —
    this is the oracle, not the fast path."""
    check_budget(sinks, window, topk)
    check_priority(priority)
    *lead, n = priority.shape
    device = priority.device
    if priority.numel() == 0:
        return torch.full(priority.shape, n, dtype=torch.int64, device=device)
    rows = priority.reshape(-1, n)
    num_rows = rows.shape[0]
    steps = torch.full((num_rows, n), n, dtype=torch.int64, device=device)
    pool_priority = torch.full((num_rows, topk), float("-inf"), dtype=rows.dtype, device=device)
    pool_position = torch.full((num_rows, topk), -1, dtype=torch.int64, device=device)
    row_index = torch.arange(num_rows, device=device)
    for step in range(n):
        leaving = step - window
        if leaving < sinks:
            continue
        if topk == 0:
            steps[:, leaving] = step
            continue
        new_priority = rows[:, leaving]
        new_position = torch.full((num_rows,), leaving, dtype=torch.int64, device=device)
        slot = weakest_slot(pool_priority, pool_position).squeeze(-1)
        old_priority = pool_priority[row_index, slot]
        old_position = pool_position[row_index, slot]
        wins = enters_pool(new_priority, new_position, old_priority, old_position)
        loser = torch.where(wins, old_position, new_position)
        has_loser = loser >= 0
        steps[row_index[has_loser], loser[has_loser]] = step
        pool_priority[row_index, slot] = torch.where(wins, new_priority, old_priority)
        pool_position[row_index, slot] = torch.where(wins, new_position, old_position)
    return steps.reshape(*lead, n)
