"""Prefill attention under the eviction-step mask (DESIGN §2): query ``i`` sees key ``t`` iff
``t <= i < e_t``, flash-style, returning each query's log-sum-exp.

One program per (batch, query head, block of queries) streams key blocks with an online
softmax. Key blocks past the causal limit are never visited, and a key block is skipped when
every key in it is evicted before the block's first query (``max e_t <= first query``), which
for a bounded cache is most of the sequence — the attention costs O(N * capacity), not O(N^2).
Reference: :func:`kvpop_compile.runtime.attention.masked_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..attention import query_group
from .common import dot_precision, next_power_of_2

BLOCK_QUERIES = 32
BLOCK_KEYS = 32


@triton.jit
def _masked_attention_kernel(
    q, k, v, steps, out, lse, scale, n, dim, group,
    HAS_STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    # Inductor and AOTInductor pass a Python float as fp64: computing in it would turn the
    # float32 online-softmax state into fp64 inside the loop, which Triton refuses.
    scale = tl.cast(scale, tl.float32)
    q_head = tl.program_id(0).to(tl.int64)  # flat (batch, query head)
    kv_head = q_head // group
    queries = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    features = tl.arange(0, BLOCK_D)
    is_query = queries < n
    in_dim = features < dim
    query = tl.load(
        q + (q_head * n + queries[:, None]) * dim + features[None, :],
        mask=is_query[:, None] & in_dim[None, :], other=0.0,
    )  # fmt: skip
    first_query = tl.program_id(1) * BLOCK_M
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    last_key = tl.minimum(first_query + BLOCK_M, n)
    for start in range(0, last_key, BLOCK_N):
        keys_at = start + tl.arange(0, BLOCK_N)
        is_key = keys_at < last_key
        visible = (keys_at[None, :] <= queries[:, None]) & is_key[None, :]
        live = True
        if HAS_STEPS:
            step = tl.load(steps + kv_head * n + keys_at, mask=is_key, other=0)
            visible = visible & (queries[:, None] < step[None, :])
            live = tl.max(step, axis=0) > first_query
        if live:
            tile = (kv_head * n + keys_at[:, None]) * dim + features[None, :]
            tile_mask = is_key[:, None] & in_dim[None, :]
            key = tl.load(k + tile, mask=tile_mask, other=0.0).to(query.dtype)
            value = tl.load(v + tile, mask=tile_mask, other=0.0).to(query.dtype)
            score = tl.dot(query, tl.trans(key), input_precision=PRECISION) * scale
            score = tl.where(visible, score, float("-inf"))
            tile_max = tl.maximum(running_max, tl.max(score, axis=1))
            shift = tl.where(tile_max == float("-inf"), 0.0, tile_max)
            p = tl.exp(score - shift[:, None])
            rescale = tl.exp(running_max - shift)
            running_sum = running_sum * rescale + tl.sum(p, axis=1)
            acc = acc * rescale[:, None] + tl.dot(
                p.to(value.dtype), value, input_precision=PRECISION
            )
            running_max = tile_max
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
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, evict_step: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`kvpop_compile.runtime.attention.masked_attention`.

    Args:
        q: ``(B, Hq, N, D)``; k, v: ``(B, Hkv, N, D)``; evict_step: ``(B, Hkv, N)`` int64 or
            ``None`` (full causal attention).

    Returns:
        ``out (B, Hq, N, D)`` in ``q.dtype`` and ``lse (B, Hq, N)`` float32.
    """
    batch, q_heads, n, dim = q.shape
    kv_heads = k.shape[1]
    group = query_group(q_heads, kv_heads)
    compute = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, q_heads, n, device=q.device)
    if q.numel() == 0:
        return out, lse.fill_(float("-inf"))
    has_steps = evict_step is not None
    steps = evict_step.contiguous() if has_steps else torch.empty(0, device=q.device)
    grid = (batch * q_heads, triton.cdiv(n, BLOCK_QUERIES))
    wrap_triton(_masked_attention_kernel)[grid](
        q.to(compute).contiguous(), k.contiguous(), v.contiguous(), steps, out, lse,
        scale, n, dim, group,
        HAS_STEPS=has_steps, BLOCK_M=BLOCK_QUERIES, BLOCK_N=BLOCK_KEYS,
        BLOCK_D=next_power_of_2(dim, 16), PRECISION=dot_precision(compute),
    )  # fmt: skip
    return out, lse
