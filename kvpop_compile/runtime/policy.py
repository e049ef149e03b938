"""The policy's arithmetic that every path shares (design.md §2): a token's priority, the spread
of scores over a span, the strict order between tokens and the pool's weakest slot, the ring slot
a new token takes, the query group of GQA, and the type of the running top-k's decisions.

Plain PyTorch with no data-dependent Python, so one traced step serves every step. The decode
and chunk steps, the training losses and the plain-PyTorch reference of every op import these;
the Triton kernels implement the same rules in their own code and are tested against the
reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import require_int

# Position given to an empty pool slot when looking for the weakest entry: larger than any real
# position, so among entries of priority -inf an empty slot is the one chosen.
EMPTY_SLOT_POSITION = torch.iinfo(torch.int64).max


def token_priority(
    score: torch.Tensor, lam: float, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Priorities ``score + lam * position`` in float32, higher = kept (design.md §2).

    Args:
        score: ``(..., N)`` the scorer's ``rhat`` (or the target's log attention).
        lam: the temporal decay ``>= 0`` (``KVpopConfig.lam``).
        positions: token positions broadcastable to ``score`` (int64 or float); ``None``:
            ``0 .. N-1`` along the last dim (a sequence from its start).
    """
    if positions is None:
        positions = torch.arange(score.shape[-1], device=score.device, dtype=torch.float32)
    return score.float() + lam * positions.float()


def spread_scores(
    score: torch.Tensor, recent: torch.Tensor, positions: torch.Tensor, sinks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each leaving token's score raised to the highest among itself and the ``P`` pool-eligible
    tokens that left the window just before it (``KVpopConfig.priority_span``).

    A scorer rates bytes one at a time, and the bytes of one number or name rarely all clear the
    pool's bar, while an answer needs every one of them: spreading a high score over the tokens
    that follow keeps such a run together. Only earlier tokens count, so the streaming rule can
    apply it when a token leaves the window, and the parallel and chunked rules get the same
    priorities.

    Args:
        score: ``(B, H, L)`` scores of the tokens leaving the window at ``L`` consecutive steps.
        recent: ``(B, H, P)`` the scores of the ``P`` tokens that left before them, oldest first
            (``-inf`` where there was none).
        positions: ``(B, 1 or H, L)`` their positions; a sink or an empty slot (below ``sinks``)
            neither spreads nor receives a score.

    Returns:
        ``(B, H, L)`` the spread scores and ``(B, H, P)`` the ``recent`` of the next call.
    """
    span = recent.shape[-1]
    if span == 0:
        return score, recent
    eligible = positions >= sinks
    own = torch.where(eligible, score.float(), float("-inf"))
    history = torch.cat([recent, own], dim=-1)  # (B, H, P + L)
    length = score.shape[-1]
    # Static slices rather than a pooling op: every exporter and compiler takes them.
    spread = history[..., span:]
    for back in range(1, span + 1):
        spread = torch.maximum(spread, history[..., span - back : span - back + length])
    return torch.where(eligible, spread, score.float()), history[..., -span:]


def check_budget(sinks: int, window: int, topk: int) -> None:
    for name, value, minimum in (("sinks", sinks, 0), ("window", window, 1), ("topk", topk, 0)):
        require_int(name, value, minimum)


def check_priority(priority: torch.Tensor) -> None:
    if priority.dim() < 1:
        raise ValueError(f"priority must have shape (..., N), got a {priority.dim()}-d tensor")
    if not priority.is_floating_point():
        raise ValueError(f"priority must be a floating-point tensor, got {priority.dtype}")
    if torch.isnan(priority).any():
        raise ValueError("priority contains NaN; priorities must be ordered numbers")


def beats(
    priority_a: torch.Tensor,
    position_a: torch.Tensor,
    priority_b: torch.Tensor,
    position_b: torch.Tensor,
) -> torch.Tensor:
    """Whether token a beats token b: higher priority, or equal priority and older. Broadcasts."""
    return (priority_a > priority_b) | ((priority_a == priority_b) & (position_a < position_b))


def enters_pool(
    priority: torch.Tensor,
    position: torch.Tensor,
    slot_priority: torch.Tensor,
    slot_position: torch.Tensor,
) -> torch.Tensor:
    """Whether a token leaving the window (``position >= 0``) takes the pool's weakest slot: the
    slot is empty (``slot_position < 0``), or the token beats its entry. Broadcasts."""
    return (position >= 0) & (
        (slot_position < 0) | beats(priority, position, slot_priority, slot_position)
    )


def weakest_slot(priority: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Index of the weakest pool entry, shape ``(..., 1)``.

    Args:
        priority: ``(..., K)`` pool priorities, ``-inf`` in empty slots.
        position: ``(..., K)`` pool positions, ``-1`` in empty slots.

    The weakest entry has the lowest priority and, among equals, the newest position; an empty
    slot counts as newer than any token, so it is chosen before any real entry.
    """
    lowest = priority.amin(dim=-1, keepdim=True)
    effective_position = torch.where(
        position < 0, torch.full_like(position, EMPTY_SLOT_POSITION), position
    )
    candidates = torch.where(priority == lowest, effective_position, torch.full_like(position, -1))
    return candidates.argmax(dim=-1, keepdim=True)


def query_group(num_query_heads: int, num_kv_heads: int) -> int:
    """Query heads per KV head; raises if the head counts do not divide."""
    if num_kv_heads < 1 or num_query_heads % num_kv_heads != 0:
        raise ValueError(
            f"query heads ({num_query_heads}) must be a positive multiple of KV heads "
            f"({num_kv_heads})"
        )
    return num_query_heads // num_kv_heads


def window_slot(seen: torch.Tensor, sinks: int, topk: int, window: int):
    """Ring index and cache slot of position ``seen`` in the window ring: int64 of ``seen``'s
    shape each (``(B,)`` for a cache's per-row positions)."""
    ring = torch.remainder(seen - sinks, window)
    return ring, sinks + topk + ring


@dataclass
class BoundaryDecisions:
    """The keep-or-drop decision the policy takes at every query ``q`` (design.md §4).

    At query ``q`` the token ``new = q - window`` leaves the window and is compared with the
    weakest entry of the full pool, ``boundary`` (the K-th strongest of ``[sinks, new)``).
    All fields have shape ``(..., N)``, indexed by the query.
    """

    new: torch.Tensor  # int64 position of the token leaving the window (clamped to >= 0)
    boundary: torch.Tensor  # int64 position of the pool's weakest entry, 0 where invalid
    keep: torch.Tensor  # bool: the new token beats the boundary (it enters the pool)
    valid: torch.Tensor  # bool: a decision exists (the token is not a sink; the pool is full)
