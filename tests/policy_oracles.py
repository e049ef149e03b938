"""Brute-force oracles for the policy, written for clarity, not speed (tests only)."""

from __future__ import annotations


def strongest_first(priority: list[float], positions) -> list[int]:
    """Positions sorted strongest first: higher priority, then older."""
    return sorted(positions, key=lambda t: (-priority[t], t))


def top_k_eligible(priority: list[float], *, step: int, sinks: int, window: int, topk: int):
    """The pool at query ``step``: the top-K of the tokens that have left the window."""
    eligible = range(sinks, max(sinks, step - window + 1))
    return set(strongest_first(priority, eligible)[:topk])


def boundary(priority: list[float], *, query: int, sinks: int, window: int, topk: int):
    """(boundary position, keep) of the decision at ``query``, or None when there is none."""
    new = query - window
    if new < sinks or topk == 0:
        return None
    before = strongest_first(priority, range(sinks, new))
    if len(before) < topk:
        return None
    weakest = before[topk - 1]
    keep = (priority[new], -new) > (priority[weakest], -weakest)
    return weakest, keep
