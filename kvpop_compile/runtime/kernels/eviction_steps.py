"""Running top-k for prefill and training (design.md §2, §4): eviction steps and boundary tokens.

``eviction_steps``: with ``p_K(t)`` the K-th oldest token that beats ``t``,
``e_t = max(t, p_K(t)) + W``. One program takes a block of tokens and sweeps the sequence in
blocks of candidates, counting per token how many candidates beat it; in the block where the
count reaches K, a prefix sum along the block finds ``p_K`` exactly. A token stops needing work
once found, and the sweep stops when the whole block is found. Work is O(N^2) comparisons per
row in the worst case (a strong token scans the whole sequence) — one comparison per pair where
the attention this mask feeds does ``D`` multiply-adds per pair — with O(N) memory and full
parallelism, where a Fenwick sweep is O(N log N) but sequential in N.

``running_topk_boundary``: the pool before query ``q`` decides is
``{u in [S, q - W) : e_u >= q}``; the boundary token is its weakest member (lowest priority,
then newest), the decision is valid when the pool is full (K members), and the token leaving
the window is kept iff ``e_{q - W} > q``. One program per block of queries sweeps the candidate
blocks with a running (count, weakest) per query.

References: :func:`kvpop_compile.runtime.reference.eviction.eviction_steps` and
:func:`~kvpop_compile.runtime.reference.eviction.running_topk_boundary`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..reference.eviction import BoundaryDecisions, unchecked_eviction_steps

BLOCK_TOKENS = 32
BLOCK_CANDIDATES = 32


@triton.jit
def _eviction_steps_kernel(
    priority, steps, n, first, window, topk,
    BLOCK_T: tl.constexpr, BLOCK_U: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    tokens = first + tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    is_token = tokens < n
    token_priority = tl.load(priority + row * n + tokens, mask=is_token, other=0.0)
    beaten = tl.zeros([BLOCK_T], dtype=tl.int32)  # candidates so far that beat the token
    kth = tl.full([BLOCK_T], -1, dtype=tl.int64)  # position of the K-th oldest beater
    pending = tl.sum((is_token & (kth < 0)).to(tl.int32), axis=0)
    start = first
    while (start < n) & (pending > 0):
        candidates = start + tl.arange(0, BLOCK_U)
        is_candidate = candidates < n
        candidate_priority = tl.load(
            priority + row * n + candidates, mask=is_candidate, other=float("-inf")
        )
        wins = (candidate_priority[None, :] > token_priority[:, None]) | (
            (candidate_priority[None, :] == token_priority[:, None])
            & (candidates[None, :] < tokens[:, None])
        )
        wins = (wins & is_candidate[None, :]).to(tl.int32)
        running = beaten[:, None] + tl.cumsum(wins, axis=1)  # (T, U) beaters up to each u
        reached = tl.min(tl.where(running >= topk, candidates[None, :], n), axis=1).to(tl.int64)
        kth = tl.where((kth < 0) & (reached < n), reached, kth)
        beaten += tl.sum(wins, axis=1)
        pending = tl.sum((is_token & (kth < 0)).to(tl.int32), axis=0)
        start += BLOCK_U
    evicted = tl.minimum(tl.maximum(tokens.to(tl.int64), kth) + window, n)
    result = tl.where(kth >= 0, evicted, n)
    tl.store(steps + row * n + tokens, result, mask=is_token)


@triton.jit
def _boundary_kernel(
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


def _rows(priority: torch.Tensor) -> torch.Tensor:
    """``(rows, N)`` contiguous priorities. 16-bit floats are widened to float32 (exactly, so
    the order is kept): the kernels carry a running priority, whose type must not change."""
    rows = priority.reshape(-1, priority.shape[-1])
    if rows.dtype in (torch.float16, torch.bfloat16):
        rows = rows.float()
    return rows.contiguous()


def eviction_steps(priority: torch.Tensor, sinks: int, window: int, topk: int) -> torch.Tensor:
    """Triton version of :func:`kvpop_compile.runtime.reference.eviction.eviction_steps`
    (inputs already checked): ``priority (..., N)`` float -> ``(..., N)`` int64 eviction
    steps."""
    n = priority.shape[-1]
    first = min(sinks, n)
    if topk == 0 or n == first or priority.numel() == 0:
        # No pool or nothing past the sinks: closed forms, no sweep to run.
        return unchecked_eviction_steps(priority, sinks, window, topk)
    steps = torch.full(priority.shape, n, dtype=torch.int64, device=priority.device)
    rows = _rows(priority)
    grid = (rows.shape[0], triton.cdiv(n - first, BLOCK_TOKENS))
    wrap_triton(_eviction_steps_kernel)[grid](
        rows, steps, n, first, window, topk, BLOCK_T=BLOCK_TOKENS, BLOCK_U=BLOCK_CANDIDATES
    )
    return steps


def running_topk_boundary(
    priority: torch.Tensor, sinks: int, window: int, topk: int
) -> BoundaryDecisions:
    """Triton version of
    :func:`kvpop_compile.runtime.reference.eviction.running_topk_boundary` (inputs already
    checked): ``priority (..., N)`` -> decisions with fields of shape ``(..., N)``."""
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
        rows = _rows(priority)
        steps = eviction_steps(rows, sinks, window, topk)
        grid = (rows.shape[0], triton.cdiv(n, BLOCK_TOKENS))
        wrap_triton(_boundary_kernel)[grid](
            rows, steps, boundary, keep, valid, n, first, window, topk,
            BLOCK_Q=BLOCK_TOKENS, BLOCK_U=BLOCK_CANDIDATES,
        )  # fmt: skip
    return BoundaryDecisions(new=new, boundary=boundary, keep=keep.bool(), valid=valid.bool())
