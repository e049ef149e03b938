"""The Triton kernel of the ``kvpop::eviction_steps`` op: the running top-k's eviction step of
every token, for prefill and training (design.md §2).

``eviction_steps``: with ``p_K(t)`` the K-th oldest token that beats ``t``,
``e_t = max(t, p_K(t)) + W``. One program takes a block of tokens and sweeps the sequence in
blocks of candidates, counting per token how many candidates beat it; in the block where the
count reaches K, a prefix sum along the block finds ``p_K`` exactly. A token stops needing work
once found, and the sweep stops when the whole block is found. Work is O(N^2) comparisons per
row in the worst case (a strong token scans the whole sequence) — one comparison per pair where
the attention this mask feeds does ``D`` multiply-adds per pair — with O(N) memory and full
parallelism, where a Fenwick sweep is O(N log N) but sequential in N.

Reference: :func:`kvpop_compile.runtime.reference.eviction_steps.eviction_steps`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..reference.eviction_steps import unchecked_eviction_steps
from .common import priority_rows

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


def eviction_steps(priority: torch.Tensor, sinks: int, window: int, topk: int) -> torch.Tensor:
    """Triton version of :func:`kvpop_compile.runtime.reference.eviction_steps.eviction_steps`
    (inputs already checked): ``priority (..., N)`` float -> ``(..., N)`` int64 eviction
    steps."""
    n = priority.shape[-1]
    first = min(sinks, n)
    if topk == 0 or n == first or priority.numel() == 0:
        # No pool or nothing past the sinks: closed forms, no sweep to run.
        return unchecked_eviction_steps(priority, sinks, window, topk)
    steps = torch.full(priority.shape, n, dtype=torch.int64, device=priority.device)
    rows = priority_rows(priority)
    grid = (rows.shape[0], triton.cdiv(n - first, BLOCK_TOKENS))
    wrap_triton(_eviction_steps_kernel)[grid](
        rows, steps, n, first, window, topk, BLOCK_T=BLOCK_TOKENS, BLOCK_U=BLOCK_CANDIDATES
    )
    return steps
