"""The KVpop eviction rule, streaming and parallel (design.md §2). Plain PyTorch, no Triton.

A token's priority is ``pi_t = rhat_t + lam * t`` (:func:`token_priority`, the one place it is
computed).

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

from dataclasses import dataclass

import torch

from ...config import require_int

# Position given to an empty pool slot when looking for the weakest entry: larger than any real
# position, so among entries of priority -inf an empty slot is the one chosen.
EMPTY_SLOT_POSITION = torch.iinfo(torch.int64).max


def token_priority(
    score: torch.Tensor, lam: float, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Priorities ``score + lam * position`` in float32, higher = kept (design.md §2).

    Args:
        score: ``(..., N)`` the scorer's ``rhat`` (or the target's log attention).
        lam: the temporal decay ``>= 0`` (``KVpopConfig.lam``).
        positions: token positions broadcastable to ``score`` (int64 or float); ``None``:
            ``0 .. N-1`` along the last dim (a sequence from its start).
    """
    if positions is None:
        positions = torch.arange(score.shape[-1], device=score.device, dtype=torch.float32)
    return score.float() + lam * positions.float()


def spread_scores(
    score: torch.Tensor, recent: torch.Tensor, positions: torch.Tensor, sinks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each leaving token's score raised to the highest among itself and the ``P`` pool-eligible
    tokens that left the window just before it (``KVpopConfig.priority_span``).

    A scorer rates bytes one at a time, and the bytes of one number or name rarely all clear the
    pool's bar, while an answer needs every one of them: spreading a high score over the tokens
    that follow keeps such a run together. Only earlier tokens count, so the streaming rule can
    apply it when a token leaves the window, and the parallel and chunked rules get the same
    priorities.

    Args:
        score: ``(B, H, L)`` scores of the tokens leaving the window at ``L`` consecutive steps.
        recent: ``(B, H, P)`` the scores of the ``P`` tokens that left before them, oldest first
            (``-inf`` where there was none).
        positions: ``(B, 1 or H, L)`` their positions; a sink or an empty slot (below ``sinks``)
            neither spreads nor receives a score.

    Returns:
        ``(B, H, L)`` the spread scores and ``(B, H, P)`` the ``recent`` of the next call.
    """
    span = recent.shape[-1]
    if span == 0:
        return score, recent
    eligible = positions >= sinks
    own = torch.where(eligible, score.float(), float("-inf"))
    history = torch.cat([recent, own], dim=-1)  # (B, H, P + L)
    length = score.shape[-1]
    # Static slices rather than a pooling op: every exporter and compiler takes them.
    spread = history[..., span:]
    for back in range(1, span + 1):
        spread = torch.maximum(spread, history[..., span - back : span - back + length])
    return torch.where(eligible, spread, score.float()), history[..., -span:]


def _check_budget(sinks: int, window: int, topk: int) -> None:
    for name, value, minimum in (("sinks", sinks, 0), ("window", window, 1), ("topk", topk, 0)):
        require_int(name, value, minimum)


def _check_priority(priority: torch.Tensor) -> None:
    if priority.dim() < 1:
        raise ValueError(f"priority must have shape (..., N), got a {priority.dim()}-d tensor")
    if not priority.is_floating_point():
        raise ValueError(f"priority must be a floating-point tensor, got {priority.dtype}")
    if torch.isnan(priority).any():
        raise ValueError("priority contains NaN; priorities must be ordered numbers")


def beats(
    priority_a: torch.Tensor,
    position_a: torch.Tensor,
    priority_b: torch.Tensor,
    position_b: torch.Tensor,
) -> torch.Tensor:
    """Whether token a beats token b: higher priority, or equal priority and older. Broadcasts."""
    return (priority_a > priority_b) | ((priority_a == priority_b) & (position_a < position_b))


def enters_pool(
    priority: torch.Tensor,
    position: torch.Tensor,
    slot_priority: torch.Tensor,
    slot_position: torch.Tensor,
) -> torch.Tensor:
    """Whether a token leaving the window (``position >= 0``) takes the pool's weakest slot: the
    slot is empty (``slot_position < 0``), or the token beats its entry. Broadcasts."""
    return (position >= 0) & (
        (slot_position < 0) | beats(priority, position, slot_priority, slot_position)
    )


def weakest_slot(priority: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Index of the weakest pool entry, shape ``(..., 1)``.

    Args:
        priority: ``(..., K)`` pool priorities, ``-inf`` in empty slots.
        position: ``(..., K)`` pool positions, ``-1`` in empty slots.

    The weakest entry has the lowest priority and, among equals, the newest position; an empty
    slot counts as newer than any token, so it is chosen before any real entry.
    """
    lowest = priority.amin(dim=-1, keepdim=True)
    effective_position = torch.where(
        position < 0, torch.full_like(position, EMPTY_SLOT_POSITION), position
    )
    candidates = torch.where(priority == lowest, effective_position, torch.full_like(position, -1))
    return candidates.argmax(dim=-1, keepdim=True)


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
    return _prefix_kth_smallest(values, k, bound)


def _prefix_kth_smallest(values: torch.Tensor, k: int, bound: int) -> torch.Tensor:
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


def _rank_order(priority: torch.Tensor) -> torch.Tensor:
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
    _check_budget(sinks, window, topk)
    _check_priority(priority)
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
    order = _rank_order(priority[..., first:])  # (..., M): rank -> local position
    # K-th oldest among the tokens that beat the token of rank r = the first r ranks.
    kth_oldest = _prefix_kth_smallest(order, topk - 1, m)[..., :m]
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
    _check_budget(sinks, window, topk)
    _check_priority(priority)
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


@dataclass
class BoundaryDecisions:
    """The keep-or-drop decision the policy takes at every query ``q`` (design.md §4).

    At query ``q`` the token ``new = q - window`` leaves the window and is compared with the
    weakest entry of the full pool, ``boundary`` (the K-th strongest of ``[sinks, new)``).
    All fields have shape ``(..., N)``, indexed by the query.
    """

    new: torch.Tensor  # int64 position of the token leaving the window (clamped to >= 0)
    boundary: torch.Tensor  # int64 position of the pool's weakest entry, 0 where invalid
    keep: torch.Tensor  # bool: the new token beats the boundary (it enters the pool)
    valid: torch.Tensor  # bool: a decision exists (the token is not a sink; the pool is full)


def running_topk_boundary(
    priority: torch.Tensor, *, sinks: int, window: int, topk: int
) -> BoundaryDecisions:
    """Boundary token and decision for every query under static ``priority`` ``(..., N)``.

    Queries whose leaving token finds a free pool slot (fewer than ``topk`` candidates before
    it) make no comparison and are marked invalid; with ``topk == 0`` none are valid.
    """
    _check_budget(sinks, window, topk)
    _check_priority(priority)
    return unchecked_running_topk_boundary(priority, sinks, window, topk)


def unchecked_running_topk_boundary(
    priority: torch.Tensor, sinks: int, window: int, topk: int
) -> BoundaryDecisions:
    """:func:`running_topk_boundary` without input checks (traceable), for the op."""
    *lead, n = priority.shape
    device = priority.device
    first = min(sinks, n)
    m = n - first
    query = torch.arange(n, device=device)
    new = (query - window).clamp(min=0).expand(*lead, n)
    invalid = BoundaryDecisions(
        new=new,
        boundary=torch.zeros(*lead, n, dtype=torch.int64, device=device),
        keep=torch.zeros(*lead, n, dtype=torch.bool, device=device),
        valid=torch.zeros(*lead, n, dtype=torch.bool, device=device),
    )
    if topk == 0 or m == 0 or priority.numel() == 0:
        return invalid
    order = _rank_order(priority[..., first:])
    rank = torch.empty_like(order).scatter_(
        -1, order, torch.arange(m, device=device).expand_as(order)
    )
    # Rank of the K-th strongest among the first r candidates, for r = 0..M.
    kth_rank = _prefix_kth_smallest(rank, topk - 1, m)
    candidates_before = (query - window - first).clamp(min=0, max=m)  # (N,)
    boundary_rank = kth_rank[..., candidates_before]  # (..., N)
    valid = (query - window >= first) & (boundary_rank >= 0)
    safe_rank = boundary_rank.clamp(min=0)
    boundary = order.gather(-1, safe_rank) + first
    new_local = (query - window - first).clamp(min=0, max=m - 1).expand(*lead, n)
    keep = rank.gather(-1, new_local) < boundary_rank
    zero = torch.zeros_like(boundary)
    return BoundaryDecisions(
        new=new, boundary=torch.where(valid, boundary, zero), keep=keep & valid, valid=valid
    )
