"""Transposed-attention training target (design.md §4): for every key ``t``,
``log sum over d >= t + W of exp(q_d . k_t * scale - lse_d)`` — keys as queries — then the max
over the query heads of the group, minus ``log N_t`` (or, for ``aggregate="max"``, a running max
of ``q_d . k_t * scale - lse_d``: the largest attention one future query pays the key; for
``aggregate="power_mean"``, the same log-sum-exp of ``power`` times it, then minus ``log N_t``
over ``power``). O(N * D) memory, no N x N map.

One program per (batch, KV head, block of keys) holds its key tile and, for each query head of
the group, streams the query blocks ``d >= t + W`` with an online log-sum-exp. It does one
``q . k`` product per pair and no value product, so it costs about half an attention forward.
Reference: :func:`kvpop_compile.runtime.reference.future_attention_target.future_attention_target`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..policy import query_group
from ..reference.future_attention_target import check_aggregate, target_from_received
from .common import dot_precision, next_power_of_2, online_logsumexp

BLOCK_KEYS = 32
BLOCK_QUERIES = 32


@triton.jit
def _future_attention_target_kernel(
    q, k, lse, target, scale, power, n, dim, group, window,
    BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr, MAX: tl.constexpr,
):  # fmt: skip
    # Inductor and AOTInductor pass a Python float as fp64: computing in it would turn the
    # float32 online-softmax state into fp64 inside the loop, which Triton refuses.
    scale = tl.cast(scale, tl.float32)
    power = tl.cast(power, tl.float32)
    kv_head = tl.program_id(0).to(tl.int64)  # flat (batch, kv head)
    keys_at = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    features = tl.arange(0, BLOCK_D)
    is_key = keys_at < n
    in_dim = features < dim
    key = tl.load(
        k + (kv_head * n + keys_at[:, None]) * dim + features[None, :],
        mask=is_key[:, None] & in_dim[None, :], other=0.0,
    )  # fmt: skip
    best = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
    first_query = tl.program_id(1) * BLOCK_T + window  # the block's first key's first query
    for member in range(group):
        q_head = kv_head * group + member
        running_max = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
        running_sum = tl.zeros([BLOCK_T], dtype=tl.float32)
        for start in range(first_query, n, BLOCK_Q):
            queries = start + tl.arange(0, BLOCK_Q)
            is_query = queries < n
            query = tl.load(
                q + (q_head * n + queries[:, None]) * dim + features[None, :],
                mask=is_query[:, None] & in_dim[None, :], other=0.0,
            ).to(key.dtype)  # fmt: skip
            query_lse = tl.load(lse + q_head * n + queries, mask=is_query, other=0.0)
            log_p = tl.dot(key, tl.trans(query), input_precision=PRECISION) * scale
            log_p = log_p - query_lse[None, :]
            future = (queries[None, :] >= keys_at[:, None] + window) & is_query[None, :]
            log_p = tl.where(future, log_p * power, float("-inf"))
            if MAX:
                running_max = tl.maximum(running_max, tl.max(log_p, axis=1))
            else:
                running_max, running_sum, _, _ = online_logsumexp(log_p, running_max, running_sum)
        if MAX:
            received = running_max
        else:
            seen = running_sum > 0  # keys with no query d >= t + W receive nothing
            received = tl.where(
                seen, running_max + tl.log(tl.where(seen, running_sum, 1.0)), float("-inf")
            )
        best = tl.maximum(best, received)
    tl.store(target + kv_head * n + keys_at, best, mask=is_key)


def future_attention_target(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    window: int,
    scale: float,
    aggregate: str = "mean",
    power: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of
    :func:`kvpop_compile.runtime.reference.future_attention_target.future_attention_target`.

    Args:
        q: ``(B, Hq, N, D)``; k: ``(B, Hkv, N, D)``; lse: ``(B, Hq, N)`` the forward's per-query
            log-sum-exp; window: the delay W; aggregate: ``"mean"``, ``"max"`` or
            ``"power_mean"`` (with ``power``) over the future queries.

    Returns:
        ``log_target (B, Hkv, N)`` float32 (0 where invalid) and ``valid (N,)`` bool.
    """
    check_aggregate(aggregate, power)
    batch, q_heads, n, dim = q.shape
    kv_heads = k.shape[1]
    group = query_group(q_heads, kv_heads)
    compute = torch.promote_types(q.dtype, k.dtype)
    received = torch.empty(batch, kv_heads, n, device=q.device)
    if received.numel():
        grid = (batch * kv_heads, triton.cdiv(n, BLOCK_KEYS))
        wrap_triton(_future_attention_target_kernel)[grid](
            q.contiguous(), k.to(compute).contiguous(), lse.float().contiguous(), received,
            scale, float(power), n, dim, group, window,
            BLOCK_T=BLOCK_KEYS, BLOCK_Q=BLOCK_QUERIES, BLOCK_D=next_power_of_2(dim, 16),
            PRECISION=dot_precision(compute), MAX=aggregate == "max",
        )  # fmt: skip
    return target_from_received(received, n, window, aggregate, power)
