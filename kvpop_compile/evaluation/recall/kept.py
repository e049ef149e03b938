"""What a bounded cache holds of a recall item when it answers, per layer and KV head.

A layer's cached positions are ``(H, C)`` (-1 for an empty slot; ``LayerState.positions`` of
one sequence). A head can answer from a planted line only if it still holds some of it, and
can copy the asked value only if it holds every byte of it.
"""

from __future__ import annotations

import torch


def _in_span(positions: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """``(H, C)`` bool: which cached positions lie in ``[start, end)``."""
    return (positions >= start) & (positions < end)


def heads_holding_evidence(positions: torch.Tensor, evidence) -> torch.Tensor:
    """``(H,)`` bool: which heads hold some position of every evidence span.

    ``positions (H, C)`` are one layer's cached positions; ``evidence`` is the item's
    ``[start, end)`` byte spans (``RecallItem.evidence``)."""
    if not evidence:
        raise ValueError("evidence is empty: give at least one [start, end) span")
    held = [_in_span(positions, start, end).any(dim=-1) for start, end in evidence]
    return torch.stack(held).all(dim=0)


def heads_holding_span(positions: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """``(H,)`` bool: which heads hold every position of ``[start, end)`` (for example the
    asked value, ``RecallItem.value_span``) in ``positions (H, C)``. A head holds a position
    in one slot at most, so holding all of them is holding ``end - start`` of them."""
    if start < 0 or end <= start:
        raise ValueError(f"span [{start}, {end}) is not a span of positions: need 0 <= start < end")
    return _in_span(positions, start, end).sum(dim=-1) == end - start
