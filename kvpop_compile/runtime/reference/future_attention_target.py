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

``aggregate="power_mean"`` with ``power = a > 1`` lies between the two: the power mean
``m^g_t = (mean over d in [t + W, N) of (p^g_{d->t})^a)^(1/a)``, which is the mean at ``a = 1``
and tends to the maximum as ``a`` grows. A token one query attends to with ``p`` scores
``p * N_t^(-1/a)``, so a single strong attention still outranks many faint ones, while a token
several later queries attend to strongly ranks above one that a single query does.

The transposed form never builds the N x N map: given each query's log-sum-exp ``lse_d`` from
the forward pass, ``log p_{d->t} = q_d . k_t * scale - lse_d``, so for every key ``t`` a running
log-sum-exp over blocks of queries ``d >= t + W`` gives ``log sum_d p_{d->t}`` (of
``a * log p_{d->t}`` for the power mean).
"""

from __future__ import annotations

import math

import torch

from ..policy import query_group

AGGREGATES = ("mean", "max", "power_mean")
# Beyond it the power mean is within log(N_t) / 1000 of the max, and a power times a float32
# log-probability can leave float32's range: the max target is then the one to ask for.
MAX_POWER = 1000.0


def check_power(name: str, power, context: str) -> float:
    """``power`` as a float if it is a number in ``(1, MAX_POWER]``; else a ValueError naming
    ``name``, the value and ``context`` (what the power belongs to)."""
    allowed = f"a number in (1, {MAX_POWER:g}] for {context} (1 is the mean; for more, the max)"
    if isinstance(power, bool) or not isinstance(power, (int, float)):
        raise ValueError(f"{name} must be {allowed}, got {power!r}")
    if not 1 < power <= MAX_POWER:  # NaN fails too
        raise ValueError(f"{name} must be {allowed}, got {power}")
    return float(power)


def check_aggregate(aggregate: str, power: float = 1.0) -> None:
    """Raise unless ``aggregate`` is one of :data:`AGGREGATES` and ``power`` fits it: a number
    in ``(1, MAX_POWER]`` for ``"power_mean"``, exactly 1 (the default, unused) for the
    others."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}; got {aggregate!r}")
    if aggregate == "power_mean":
        check_power("power", power, "aggregate 'power_mean'")
    elif isinstance(power, bool) or power != 1:
        raise ValueError(
            f"power applies to aggregate 'power_mean' only; got power {power} with {aggregate!r}"
        )


def log_future_counts(n: int, window: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``log N_t`` (0 where undefined) and the validity mask ``N_t > 0``, each ``(N,)``:
    ``N_t = N - t - W`` queries attend to token ``t`` after it leaves the window."""
    future = n - window - torch.arange(n, device=device)
    valid = future > 0
    return torch.log(future.clamp(min=1).float()), valid


def future_attention_target_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    window: int,
    scale: float,
    aggregate: str = "mean",
    power: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference that materialises the ``(B, Hq, N, N)`` attention map — small N only.

    Args:
        q: ``(B, Hq, N, D)`` queries after RoPE; k: ``(B, Hkv, N, D)`` keys after RoPE.
        aggregate: ``"mean"``, ``"max"`` or ``"power_mean"`` (with ``power``) over the future
            queries.

    Returns:
        ``log_target (B, Hkv, N)`` float32 (0 where invalid) and ``valid (N,)`` bool.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    check_aggregate(aggregate, power)
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
    scores = scores.masked_fill(~causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    query = torch.arange(n, device=q.device)
    future = query[:, None] >= query[None, :] + window  # (d, t)
    log_count, valid = log_future_counts(n, window, q.device)
    if aggregate == "max":
        received = (probs * future).amax(dim=-2)  # (B, Hkv, G, N)
        log_target = torch.log(received.amax(dim=2))
    elif aggregate == "power_mean":
        # In log space: p ** a underflows float32 for the faint attention most tokens receive.
        log_probs = torch.log_softmax(scores, dim=-1).masked_fill(~future, -math.inf)
        received = torch.logsumexp(log_probs * power, dim=-2)
        log_target = (received.amax(dim=2) - log_count) / power
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
    power: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Transposed-attention target, ``O(N * (D + block))`` memory per head.

    Args:
        q: ``(B, Hq, N, D)`` queries after RoPE; k: ``(B, Hkv, N, D)`` keys after RoPE.
        lse: ``(B, Hq, N)`` each query's log-sum-exp of its scaled causal scores (the forward
            attention's, e.g. from :func:`.attention.masked_attention`).
        window: the delay W: only queries ``d >= t + W`` count for key ``t``.
        block: queries per block.
        aggregate: ``"mean"`` (a running log-sum-exp), ``"max"`` (a running max) or
            ``"power_mean"`` (a running log-sum-exp of ``power * log p``) over the future
            queries.

    Returns:
        ``log_target (B, Hkv, N)`` float32 (0 where invalid) and ``valid (N,)`` bool.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    check_aggregate(aggregate, power)
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
        log_p = log_p.masked_fill(~future, -math.inf) * power
        seen = received[..., :keys_seen]
        if aggregate == "max":
            received[..., :keys_seen] = torch.maximum(seen, log_p.amax(dim=-1))
        else:
            received[..., :keys_seen] = torch.logaddexp(seen, torch.logsumexp(log_p, dim=-1))
    return target_from_received(received.amax(dim=2), n, window, aggregate, power)


def target_from_received(
    received: torch.Tensor, n: int, window: int, aggregate: str, power: float = 1.0
):
    """``log_target`` from the group's best ``log`` received attention ``(B, Hkv, N)`` (the log
    of a sum of ``p ** power``: minus ``log N_t``, over ``power``, makes it a power mean; for
    ``"max"`` the log of the largest ``p``) and ``valid (N,)``; 0 where invalid."""
    log_count, valid = log_future_counts(n, window, received.device)
    log_target = received if aggregate == "max" else (received - log_count) / power
    return torch.where(valid, log_target, torch.zeros_like(log_target)), valid
