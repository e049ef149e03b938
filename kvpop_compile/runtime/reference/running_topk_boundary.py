"""The reference of the ``kvpop::running_topk_boundary`` op: the running top-k's keep-or-drop
decision at every query (design.md §4), from the same prefix order statistics as the eviction
steps (:mod:`.eviction_steps`). Plain PyTorch, no Triton.
"""

from __future__ import annotations

import torch

from ..policy import BoundaryDecisions, check_budget, check_priority
from .eviction_steps import rank_order, unchecked_prefix_kth_smallest


def running_topk_boundary(
    priority: torch.Tensor, *, sinks: int, window: int, topk: int
) -> BoundaryDecisions:
    """Boundary token and decision for every query under static ``priority`` ``(..., N)``.

    Queries whose leaving token finds a free pool slot (fewer than ``topk`` candidates before
    it) make no comparison and are marked invalid; with ``topk == 0`` none are valid.
    """
    check_budget(sinks, window, topk)
    check_priority(priority)
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
    order = rank_order(priority[..., first:])
    rank = torch.empty_like(order).scatter_(
        -1, order, torch.arange(m, device=device).expand_as(order)
    )
    # Rank of the K-th strongest among the first r candidates, for r = 0..M.
    kth_rank = unchecked_prefix_kth_smallest(rank, topk - 1, m)
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
