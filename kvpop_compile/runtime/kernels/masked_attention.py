"""Prefill attention under the eviction-step mask (design.md §2): the query at position ``i`` sees
the key at position ``t`` iff ``t <= i < e_t``, flash-style, returning each query's log-sum-exp.
The keys may begin with a held cache (a chunk of a long prompt continuing it): then every key
carries its position, and the queries' own keys are the last ones.

One program per (batch, query head, block of queries) streams key blocks with an online
softmax. Key blocks past the causal limit are never visited, and a key block is skipped when
every key in it is evicted before the block's first query (``max e_t <= first query``), which
for a bounded cache is most of the sequence — the attention costs O(N * capacity), not O(N^2).
Reference: :func:`kvpop_compile.runtime.reference.masked_attention.masked_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..policy import query_group
from .common import INT64_MAX, dot_precision, next_power_of_2, online_logsumexp

BLOCK_QUERIES = 32
BLOCK_KEYS = 32


@triton.jit
def _masked_attention_kernel(
    q, k, v, steps, positions, out, lse, scale, n, total, dim, group,
    HAS_STEPS: tl.constexpr, HAS_POSITIONS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    # Inductor and AOTInductor pass a Python float as fp64: computing in it would turn the
    # float32 online-softmax state into fp64 inside the loop, which Triton refuses.
    scale = tl.cast(scale, tl.float32)
    q_head = tl.program_id(0).to(tl.int64)  # flat (batch, query head)
    kv_head = q_head // group
    first_local = tl.program_id(1) * BLOCK_M
    queries = first_local + tl.arange(0, BLOCK_M)  # query rows, 0..n-1
    features = tl.arange(0, BLOCK_D)
    is_query = queries < n
    in_dim = features < dim
    past = total - n  # keys held before the queries' own, which are the last n
    if HAS_POSITIONS:
        query_pos = tl.load(positions + kv_head * total + past + queries, mask=is_query, other=0)
    else:
        query_pos = queries.to(tl.int64)
    first_query = tl.min(tl.where(is_query, query_pos, INT64_MAX), axis=0)
    query = tl.load(
        q + (q_head * n + queries[:, None]) * dim + features[None, :],
        mask=is_query[:, None] & in_dim[None, :], other=0.0,
    )  # fmt: skip
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Keys after the block's last query are never seen.
    last_key = tl.minimum(past + first_local + BLOCK_M, total)
    for start in range(0, last_key, BLOCK_N):
        keys_at = start + tl.arange(0, BLOCK_N)
        is_key = keys_at < last_key
        if HAS_POSITIONS:
            key_pos = tl.load(positions + kv_head * total + keys_at, mask=is_key, other=0)
        else:
            key_pos = keys_at.to(tl.int64)
        visible = (key_pos[None, :] <= query_pos[:, None]) & is_key[None, :]
        live = True
        if HAS_STEPS:
            step = tl.load(steps + kv_head * total + keys_at, mask=is_key, other=0)
            visible = visible & (query_pos[:, None] < step[None, :])
            live = tl.max(step, axis=0) > first_query
        if live:
            tile = (kv_head * total + keys_at[:, None]) * dim + features[None, :]
            tile_mask = is_key[:, None] & in_dim[None, :]
            key = tl.load(k + tile, mask=tile_mask, other=0.0).to(query.dtype)
            value = tl.load(v + tile, mask=tile_mask, other=0.0).to(query.dtype)
            score = tl.dot(query, tl.trans(key), input_precision=PRECISION) * scale
            score = tl.where(visible, score, float("-inf"))
            running_max, running_sum, p, rescale = online_logsumexp(score, running_max, running_sum)
            acc = acc * rescale[:, None] + tl.dot(
                p.to(value.dtype), value, input_precision=PRECISION
            )
    # Padding rows past N saw nothing; give them a harmless sum (their stores are masked).
    running_sum = tl.where(is_query, running_sum, 1.0)
    result = acc / running_sum[:, None]
    tl.store(
        out + (q_head * n + queries[:, None]) * dim + features[None, :],
        result.to(out.dtype.element_ty),
        mask=is_query[:, None] & in_dim[None, :],
    )  # fmt: skip
    tl.store(lse + q_head * n + queries, running_max + tl.log(running_sum), mask=is_query)


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    evict_step: torch.Tensor | None,
    scale: float,
    key_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`kvpop_compile.runtime.reference.masked_attention.masked_attention`.

    Args:
        q: ``(B, Hq, L, D)``; k, v: ``(B, Hkv, T, D)``, the last ``L`` keys the queries' own;
            evict_step: ``(B, Hkv, T)`` int64 or ``None`` (full causal attention);
            key_positions: ``(B, Hkv, T)`` int64 or ``None`` (key ``t`` at position ``t``).

    Returns:
        ``out (B, Hq, L, D)`` in ``q.dtype`` and ``lse (B, Hq, L)`` float32.
    """
    batch, q_heads, n, dim = q.shape
    kv_heads, total = k.shape[1], k.shape[2]
    group = query_group(q_heads, kv_heads)
    compute = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, q_heads, n, device=q.device)
    if q.numel() == 0:
        return out, lse.fill_(float("-inf"))
    has_steps, has_positions = evict_step is not None, key_positions is not None
    empty = torch.empty(0, dtype=torch.int64, device=q.device)
    steps = evict_step.contiguous() if has_steps else empty
    positions = key_positions.contiguous() if has_positions else empty
    grid = (batch * q_heads, triton.cdiv(n, BLOCK_QUERIES))
    wrap_triton(_masked_attention_kernel)[grid](
        q.to(compute).contiguous(), k.contiguous(), v.contiguous(), steps, positions, out, lse,
        scale, n, total, dim, group,
        HAS_STEPS=has_steps, HAS_POSITIONS=has_positions, BLOCK_M=BLOCK_QUERIES,
        BLOCK_N=BLOCK_KEYS, BLOCK_D=next_power_of_2(dim, 16), PRECISION=dot_precision(compute),
    )  # fmt: skip
    return out, lse
