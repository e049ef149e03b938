"""The Triton kernel of the ``kvpop::running_topk_boundary`` op (design.md §4).

The pool before query ``q`` decides is ``{u in [S, q - W) : e_u >= q}``; the boundary token is
its weakest member (lowest priority, then newest), the decision is valid when the pool is full
(K members), and the token leaving the window is kept iff ``e_{q - W} > q``. One program per
block of queries sweeps the candidate blocks with a running (count, weakest) per query.

Reference:
:func:`kvpop_compile.runtime.reference.running_topk_boundary.running_topk_boundary`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..policy import BoundaryDecisions
from .common import priority_rows
from .eviction_steps import BLOCK_CANDIDATES, BLOCK_TOKENS, eviction_steps


@triton.jit
def _running_topk_boundary_kernel(
    priority, steps, boundary, keep, valid, n, first, window, topk,
    BLOCK_Q: tl.constexpr, BLOCK_U: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    queries = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    is_query = queries < n
    leaving = queries - window  # the token each query's step moves out of the window
    members = tl.zeros([BLOCK_Q], dtype=tl.int32)
    weakest_priority = tl.full([BLOCK_Q], float("inf"), dtype=priority.dtype.element_ty)
    weakest = tl.full([BLOCK_Q], -1, dtype=tl.int64)
    last_leaving = tl.max(tl.where(is_query, leaving, first), axis=0)
    for start in range(first, last_leaving, BLOCK_U):
        candidates = start + tl.arange(0, BLOCK_U)
        is_candidate = candidates < n
        candidate_priority = tl.load(priority + row * n + candidates, mask=is_candidate)
        candidate_step = tl.load(steps + row * n + candidates, mask=is_candidate, other=0)
        # In the pool when query q decides: left the window before, not evicted before q.
        member = (
            is_candidate[None, :]
            & (candidates[None, :] < leaving[:, None])
            & (candidate_step[None, :] >= queries[:, None])
        )
        members += tl.sum(member.to(tl.int32), axis=1)
        lowest = tl.min(tl.where(member, candidate_priority[None, :], float("inf")), axis=1)
        at_lowest = member & (candidate_priority[None, :] == lowest[:, None])
        newest = tl.max(tl.where(at_lowest, candidates[None, :], -1), axis=1).to(tl.int64)
        # Candidate blocks come in position order, so on equal priority the later is newer.
        better = (newest >= 0) & (lowest <= weakest_priority)
        weakest_priority = tl.where(better, lowest, weakest_priority)
        weakest = tl.where(better, newest, weakest)
    decided = is_query & (leaving >= first) & (members == topk)
    leaving_step = tl.load(steps + row * n + leaving, mask=decided, other=0)
    tl.store(boundary + row * n + queries, tl.where(decided, weakest, 0), mask=is_query)
    tl.store(
        keep + row * n + queries, (decided & (leaving_step > queries)).to(tl.int8), mask=is_query
    )
    tl.store(valid + row * n + queries, decided.to(tl.int8), mask=is_query)


def running_topk_boundary(
    priority: torch.Tensor, sinks: int, window: int, topk: int
) -> BoundaryDecisions:
    """Triton version of
    :func:`kvpop_compile.runtime.reference.running_topk_boundary.running_topk_boundary` (inputs
    already checked): ``priority (..., N)`` -> decisions with fields of shape ``(..., N)``."""
    *lead, n = priority.shape
    device = priority.device
    query = torch.arange(n, device=device)
    new = (query - window).clamp(min=0).expand(*lead, n)
    shape = priority.shape
    boundary = torch.zeros(shape, dtype=torch.int64, device=device)
    keep = torch.zeros(shape, dtype=torch.int8, device=device)
    valid = torch.zeros(shape, dtype=torch.int8, device=device)
    first = min(sinks, n)
    if topk > 0 and n > first and priority.numel() > 0:
        rows = priority_rows(priority)
        steps = eviction_steps(rows, sinks, window, topk)
        grid = (rows.shape[0], triton.cdiv(n, BLOCK_TOKENS))
        wrap_triton(_running_topk_boundary_kernel)[grid](
            rows, steps, boundary, keep, valid, n, first, window, topk,
            BLOCK_Q=BLOCK_TOKENS, BLOCK_U=BLOCK_CANDIDATES,
        )  # fmt: skip
    return BoundaryDecisions(new=new, boundary=boundary, keep=keep.bool(), valid=valid.bool())
