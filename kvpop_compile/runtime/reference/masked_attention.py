"""The reference of the ``kvpop::masked_attention`` op: prefill attention under eviction steps, in
plain PyTorch. GQA is handled by viewing the queries as ``(B, kv_heads, group, ..., D)``: the
cache is never repeated per query head (under compilation ``repeat_kv`` copies the whole cache
every step). Computation is float32; outputs take the query's dtype.
"""

from __future__ import annotations

import torch

from ..policy import query_group


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    evict_step: torch.Tensor | None,
    *,
    scale: float,
    block: int = 128,
    key_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention in which a query at position ``i`` sees the key at position ``t`` iff
    ``t <= i < evict_step[t]``.

    Args:
        q: ``(B, Hq, L, D)`` queries (after RoPE).
        k, v: ``(B, Hkv, T, D)`` keys (after RoPE) and values, ``T >= L``. The last ``L`` keys
            are the queries' own tokens; the ``T - L`` before them are keys held from earlier
            (a cache the prompt's chunk continues).
        evict_step: ``(B, Hkv, T)`` int64 eviction steps, or ``None`` for full causal attention.
        scale: softmax scale.
        block: query rows per block; scratch memory is ``O(block * T)`` per head, never L x T.
        key_positions: ``(B, Hkv, T)`` int64 token position of every key (``-1``: no key; pair
            it with an eviction step <= 0 so that no query sees it); the queries' positions are
            those of their own keys. ``None``: key ``t`` is at position ``t`` and ``T == L``.

    Returns:
        ``out (B, Hq, L, D)`` in ``q.dtype`` and ``lse (B, Hq, L)`` float32, each query's
        log-sum-exp of its scaled scores over the keys it sees.
    """
    batch, q_heads, n, dim = q.shape
    kv_heads, total = k.shape[1], k.shape[2]
    group = query_group(q_heads, kv_heads)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if key_positions is None and total != n:
        raise ValueError(f"without key_positions, k must have the queries' length {n}, got {total}")
    past = total - n
    if key_positions is None:
        key_positions = torch.arange(total, device=q.device).expand(batch, kv_heads, total)
    qg = q.float().reshape(batch, kv_heads, group, n, dim)
    kf, vf = k.float(), v.float()
    out = torch.empty(batch, kv_heads, group, n, dim, device=q.device)
    lse = torch.empty(batch, kv_heads, group, n, device=q.device)
    for start in range(0, n, block):
        end = min(start + block, n)
        # Keys after the block's last query are never seen: slice them off.
        seen = past + end
        query_pos = key_positions[:, :, past + start : seen, None]  # (B, Hkv, Q, 1)
        visible = key_positions[:, :, None, :seen] <= query_pos  # (B, Hkv, Q, T)
        if evict_step is not None:
            visible &= query_pos < evict_step[:, :, None, :seen]
        out[:, :, :, start:end], lse[:, :, :, start:end] = _attend(
            qg[:, :, :, start:end], kf[:, :, :seen], vf[:, :, :seen], visible, scale
        )
    return out.reshape(batch, q_heads, n, dim).to(q.dtype), lse.reshape(batch, q_heads, n)


def _attend(q, k, v, visible, scale):
    """Softmax attention of ``q (B, Hkv, G, Q, D)`` over ``k, v (B, Hkv, T, D)`` where
    ``visible (B, Hkv, Q, T)``, float32: ``out (B, Hkv, G, Q, D)``, ``lse (B, Hkv, G, Q)``.

    On the CPU, PyTorch's fused flash-attention kernel (the one ``scaled_dot_product_attention``
    runs, here called for its log-sum-exp too) does it in tiles, several times faster than the
    unfused form below, with the group's queries as extra rows of their KV head."""
    batch, kv_heads, group, length, dim = q.shape
    if q.device.type == "cpu":
        bias = torch.zeros(visible.shape, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill_(~visible, float("-inf")).unsqueeze(2)
        bias = bias.expand(-1, -1, group, -1, -1).reshape(batch, kv_heads, group * length, -1)
        rows = q.reshape(batch, kv_heads, group * length, dim)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            rows, k, v, attn_mask=bias, scale=scale
        )
        return out.reshape(q.shape), lse.reshape(batch, kv_heads, group, length)
    scores = torch.einsum("bhgqd,bhkd->bhgqk", q, k) * scale
    scores = scores.masked_fill(~visible.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = (scores - lse.unsqueeze(-1)).exp()
    return torch.einsum("bhgqk,bhkd->bhgqd", probs, v), lse
