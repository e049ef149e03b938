"""The future-attention training target (design.md §4), dense and transposed.

For KV head ``h`` and a query head ``g`` of its group, with ``p^g_{d->t}`` the full causal
attention from query ``d`` to key ``t``:

    m^g_t = mean over d in [t + W, N) of p^g_{d->t}        r_t = log max_g m^g_t

— the attention a token will receive after it leaves the window. Tokens with no such query
(``t + W >= N``) have no target.

``aggregate="max"`` replaces the mean over future queries by the maximum,
``m^g_t = max over d in [t + W, N) of p^g_{d->t}``: the strongest attention any one later query
pays the token. A mean ranks a token that one later question needs (a definition recalled once,
far ahead) below tokens that every query glances at, and a policy that imitates it drops the
definition; the maximum ranks it near the top.

The transposed form never builds the N x N map: given each query's log-sum-exp ``lse_d`` from
the forward pass, ``log p_{d->t} = q_d . k_t * scale - lse_d``, so for every key ``t`` a running
log-sum-exp over blocks of queries ``d >= t + W`` gives ``log sum_d p_{d->t}``.
"""

from __future__ import annotations

import math

import torch

from ..policy import query_group

AGGREGATES = ("mean", "max")


def check_aggregate(aggregate: str) -> None:
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}; got {aggregate!r}")


def log_future_counts(n: int, window: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``log N_t`` (0 where undefined) and the validity mask ``N_t > 0``, each ``(N,)``:
    ``N_t = N - t - W`` queries attend to token ``t`` after it leaves the window."""
    future = n - window - torch.arange(n, device=device)
    valid = future > 0
    return torch.log(future.clamp(min=1).float()), valid


def future_attention_target_dense(
    q: torch.Tensor, k: torch.Tensor, *, window: int, scale: float, aggregate: str = "mean"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference that materialises the ``(B, Hq, N, N)`` attention map — small N only.

    Args:
        q: ``(B, Hq, N, D)`` queries after RoPE; k: ``(B, Hkv, N, D)`` keys after RoPE.
        aggregate: ``"mean"`` or ``"max"`` over the future queries.

    Returns:
        ``log_target (B, Hkv, N)`` float32 (0 where invalid) and ``valid (N,)`` bool.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    check_aggregate(aggregate)
    batch, q_heads, n, dim = q.shape
    kv_heads = k.shape[1]
    group = query_group(q_heads, kv_heads)
    scores = (
        torch.einsum(
            "bhgqd,bhkd->bhgqk", q.float().reshape(batch, kv_heads, group, n, dim), k.float()
        )
        * scale
    )
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    query = torch.arange(n, device=q.device)
    future = query[:, None] >= query[None, :] + window  # (d, t)
    log_count, valid = log_future_counts(n, window, q.device)
    if aggregate == "max":
        received = (probs * future).amax(dim=-2)  # (B, Hkv, G, N)
        log_count = torch.zeros_like(log_count)
    else:
        received = (probs * future).sum(dim=-2)
    log_target = torch.log(received.amax(dim=2)) - log_count
    return torch.where(valid, log_target, torch.zeros_like(log_target)), valid


def future_attention_target(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    *,
    window: int,
    scale: float,
    block: int = 64,
    aggregate: str = "mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Transposed-attention target, ``O(N * (D + block))`` memory per head.

    Args:
        q: ``(B, Hq, N, D)`` queries after RoPE; k: ``(B, Hkv, N, D)`` keys after RoPE.
        lse: ``(B, Hq, N)`` each query's log-sum-exp of its scaled causal scores (the forward
            attention's, e.g. from :func:`.attention.masked_attention`).
        window: the delay W: only queries ``d >= t + W`` count for key ``t``.
        block: queries per block.
        aggregate: ``"mean"`` (a running log-sum-exp) or ``"max"`` (a running max) over the
            future queries.

    Returns:
        ``log_target (B, Hkv, N)`` float32 (0 where invalid) and ``valid (N,)`` bool.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    check_aggregate(aggregate)
    batch, q_heads, n, dim = q.shape
    kv_heads = k.shape[1]
    group = query_group(q_heads, kv_heads)
    if lse.shape != (batch, q_heads, n):
        raise ValueError(f"lse must have shape {(batch, q_heads, n)}, got {tuple(lse.shape)}")
    qg = q.float().reshape(batch, kv_heads, group, n, dim)
    lse_g = lse.float().reshape(batch, kv_heads, group, n)
    kf = k.float()
    received = torch.full((batch, kv_heads, group, n), -math.inf, device=q.device)
    key_pos = torch.arange(n, device=q.device)
    for start in range(window, n, block):
        end = min(start + block, n)
        keys_seen = end - window  # keys t <= d - W for some d in the block
        # Keys as queries: (B, Hkv, G, T, block) log-probabilities log p_{d->t}.
        log_p = torch.einsum("bhgqd,bhkd->bhgkq", qg[:, :, :, start:end], kf[:, :, :keys_seen])
        log_p = log_p * scale - lse_g[:, :, :, None, start:end]
        query_pos = torch.arange(start, end, device=q.device)
        future = query_pos[None, :] >= key_pos[:keys_seen, None] + window  # (T, block)
        log_p = log_p.masked_fill(~future, -math.inf)
        seen = received[..., :keys_seen]
        if aggregate == "max":
            received[..., :keys_seen] = torch.maximum(seen, log_p.amax(dim=-1))
        else:
            received[..., :keys_seen] = torch.logaddexp(seen, torch.logsumexp(log_p, dim=-1))
    return target_from_received(received.amax(dim=2), n, window, aggregate)


def target_from_received(received: torch.Tensor, n: int, window: int, aggregate: str):
    """``log_target`` from the group's best ``log`` received attention ``(B, Hkv, N)`` (a sum:
    minus ``log N_t`` makes it a mean) and ``valid (N,)``; 0 where invalid."""
    log_count, valid = log_future_counts(n, window, received.device)
    log_target = received if aggregate == "max" else received - log_count
    return torch.where(valid, log_target, torch.zeros_like(log_target)), valid
