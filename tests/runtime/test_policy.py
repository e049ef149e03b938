"""The policy's shared arithmetic: the pool's weakest slot, and the spread of scores over a span."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from kvpop_compile.runtime import (
    spread_scores,
    weakest_slot,
)


def test_weakest_slot_prefers_empty_then_lowest_then_newest():
    priority = torch.tensor([[1.0, 0.5, 0.5, float("-inf")], [1.0, 0.5, 0.5, 2.0]])
    position = torch.tensor([[3, 7, 9, -1], [3, 7, 9, 1]])
    assert weakest_slot(priority, position).tolist() == [[3], [2]]


@given(
    n=st.integers(1, 30),
    start=st.integers(-6, 6),
    sinks=st.integers(0, 4),
    span=st.integers(0, 4),
    cuts=st.lists(st.integers(1, 29), max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_spread_scores_is_the_max_over_the_span_before_each_pool_token(
    n, start, sinks, span, cuts, seed
):
    """Scores of tokens leaving at positions ``start .. start + n - 1``, in chunks: each pool
    token (position >= sinks) gets the highest score among itself and the ``span`` pool tokens
    just before it; a sink or empty slot keeps its own and spreads nothing. Chunked as any
    caller does, carrying ``recent``."""
    score = torch.randn(2, 3, n, generator=torch.Generator().manual_seed(seed))
    positions = torch.arange(start, start + n).view(1, 1, n)
    recent = torch.full((2, 3, span), float("-inf"))
    edges = [0, *sorted({c for c in cuts if c < n}), n]
    parts = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=False):
        spread, recent = spread_scores(score[..., lo:hi], recent, positions[..., lo:hi], sinks)
        parts.append(spread)
    spread = torch.cat(parts, dim=-1)
    for j in range(n):
        position = start + j
        earlier = [i for i in range(max(0, j - span), j + 1) if start + i >= sinks]
        expected = score[..., earlier].amax(-1) if position >= sinks else score[..., j]
        torch.testing.assert_close(spread[..., j], expected, rtol=0, atol=0)
