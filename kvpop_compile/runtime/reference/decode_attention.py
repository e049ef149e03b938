"""The reference of the ``kvpop::decode_attention`` op: one decode query per sequence against the
bounded cache, in plain PyTorch. GQA is handled by viewing the queries as
``(B, kv_heads, group, 1, D)``: the cache is never repeated per query head. Computation is
float32; outputs take the query's dtype.
"""

from __future__ import annotations

import torch

from ..policy import query_group


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    *,
    scale: float,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query token per sequence against the bounded cache.

    Args:
        q: ``(B, Hq, 1, D)`` the new token's queries (after RoPE).
        keys, values: ``(B, Hkv, C, D)`` cache slots ``[sinks | pool | window]``.
        positions: ``(B, Hkv, C)`` int64 token position per slot, ``-1`` for an empty slot.
        scale: softmax scale.
        rows: ``(B,)`` int64 or ``None``: the cache has ``P`` pages (``keys, values
            (P, Hkv, C, D)``, ``positions (P, Hkv, C)``) and query ``b`` reads page
            ``rows[b]``.

    Returns:
        ``out (B, Hq, 1, D)`` in ``q.dtype`` and ``probs (B, Hkv, group, C)`` float32, the
        attention of each query head to every slot (0 on empty slots), which the
        attention-fed scorers consume.
    """
    if rows is not None:
        keys, values, positions = (t.index_select(0, rows) for t in (keys, values, positions))
    batch, q_heads, _, dim = q.shape
    kv_heads = keys.shape[1]
    group = query_group(q_heads, kv_heads)
    qg = q.float().reshape(batch, kv_heads, group, dim)
    scores = torch.einsum("bhgd,bhcd->bhgc", qg, keys.float()) * scale
    scores = scores.masked_fill((positions < 0).unsqueeze(2), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgc,bhcd->bhgd", probs, values.float())
    return out.reshape(batch, q_heads, 1, dim).to(q.dtype), probs
