"""The eviction rule: parallel ≡ streaming (invariant 4), running top-k (invariant 3), the
prefix order statistic under it, and the boundary decisions of the loss."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from policy_oracles import boundary, top_k_eligible

from kvpop_compile.runtime import (
    eviction_steps,
    prefix_kth_smallest,
    running_topk_boundary,
    spread_scores,
    streaming_eviction_steps,
    weakest_slot,
)

budgets = st.fixed_dictionaries(
    {
        "sinks": st.integers(0, 4),
        "window": st.integers(1, 6),
        "topk": st.integers(0, 8),
    }
)


def draw_priority(seed: int, rows: int, n: int, distinct: int | None) -> torch.Tensor:
    """Priorities from a seed: continuous (``distinct=None``), or ``distinct`` values only to
    force ties, the lowest of them ``-inf`` (a score a user may give to never keep a token)."""
    generator = torch.Generator().manual_seed(seed)
    if distinct is None:
        return torch.randn(rows, n, generator=generator)
    levels = torch.randint(0, distinct, (rows, n), generator=generator).float()
    return levels.masked_fill(levels == 0, float("-inf")) if distinct > 1 else levels


@given(
    values=st.lists(st.integers(0, 40), max_size=30),
    k=st.integers(0, 6),
)
def test_prefix_kth_smallest_matches_sorting(values, k):
    result = prefix_kth_smallest(torch.tensor(values, dtype=torch.int64), k, bound=41).tolist()
    expected = [sorted(values[:r])[k] if r > k else -1 for r in range(len(values) + 1)]
    assert result == expected


@given(
    budget=budgets,
    n=st.integers(1, 48),
    rows=st.integers(1, 3),
    distinct=st.sampled_from([None, 1, 2, 3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_parallel_rule_equals_streaming_simulation(budget, n, rows, distinct, seed):
    priority = draw_priority(seed, rows, n, distinct)
    assert torch.equal(
        eviction_steps(priority, **budget), streaming_eviction_steps(priority, **budget)
    )


@given(
    budget=budgets,
    n=st.integers(1, 40),
    distinct=st.sampled_from([None, 2, 3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_visible_set_is_sinks_window_and_running_top_k(budget, n, distinct, seed):
    priority = draw_priority(seed, 1, n, distinct)
    steps = eviction_steps(priority, **budget)[0].tolist()
    values = priority[0].tolist()
    sinks, window = budget["sinks"], budget["window"]
    for query in range(n):
        visible = {t for t in range(query + 1) if query < steps[t]}
        expected = set(range(min(sinks, query + 1)))
        expected |= set(range(max(sinks, query - window + 1), query + 1))
        expected |= top_k_eligible(values, step=query, **budget)
        assert visible == expected


def test_eviction_steps_batch_dims_and_never_evicted_tokens():
    priority = torch.randn(2, 3, 20)
    steps = eviction_steps(priority, sinks=2, window=3, topk=100)
    assert steps.shape == (2, 3, 20)
    assert (steps == 20).all()  # the pool never fills: nothing is evicted


def test_without_pool_tokens_leave_with_the_window():
    steps = eviction_steps(torch.zeros(1, 10), sinks=2, window=3, topk=0)
    assert steps.tolist() == [[10, 10, 5, 6, 7, 8, 9, 10, 10, 10]]


def test_free_pool_slot_is_taken_even_by_minus_infinity():
    never = torch.full((1, 6), float("-inf"))
    expected = [[6, 6, 3, 4, 5, 6]]  # two pool slots: tokens 0 and 1 fill them and stay
    assert eviction_steps(never, sinks=0, window=1, topk=2).tolist() == expected
    assert streaming_eviction_steps(never, sinks=0, window=1, topk=2).tolist() == expected


@pytest.mark.parametrize("shape", [(2, 0), (0, 5), (0,)])
def test_empty_inputs(shape):
    priority = torch.zeros(shape)
    n = shape[-1]
    for function in (eviction_steps, streaming_eviction_steps):
        steps = function(priority, sinks=1, window=1, topk=1)
        assert steps.shape == shape and (steps == n).all()
    assert not running_topk_boundary(priority, sinks=1, window=1, topk=1).valid.any()
    assert prefix_kth_smallest(priority.long(), 0).shape == (*shape[:-1], n + 1)


def test_weakest_slot_prefers_empty_then_lowest_then_newest():
    priority = torch.tensor([[1.0, 0.5, 0.5, float("-inf")], [1.0, 0.5, 0.5, 2.0]])
    position = torch.tensor([[3, 7, 9, -1], [3, 7, 9, 1]])
    assert weakest_slot(priority, position).tolist() == [[3], [2]]


@given(
    budget=budgets,
    n=st.integers(1, 40),
    distinct=st.sampled_from([None, 2, 3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_boundary_decisions_match_brute_force(budget, n, distinct, seed):
    priority = draw_priority(seed, 2, n, distinct)
    decisions = running_topk_boundary(priority, **budget)
    for row in range(2):
        values = priority[row].tolist()
        for query in range(n):
            expected = boundary(values, query=query, **budget)
            assert bool(decisions.valid[row, query]) == (expected is not None)
            if expected is not None:
                assert int(decisions.boundary[row, query]) == expected[0]
                assert bool(decisions.keep[row, query]) == expected[1]
                assert int(decisions.new[row, query]) == query - budget["window"]


@pytest.mark.parametrize(
    "function", [eviction_steps, streaming_eviction_steps, running_topk_boundary]
)
def test_bad_inputs_raise(function):
    with pytest.raises(ValueError, match="priority contains NaN"):
        function(torch.tensor([1.0, float("nan")]), sinks=0, window=1, topk=1)
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        function(torch.zeros(4), sinks=0, window=0, topk=1)
    with pytest.raises(ValueError, match="topk must be an integer >= 0, got -1"):
        function(torch.zeros(4), sinks=0, window=1, topk=-1)
    with pytest.raises(ValueError, match="priority must be a floating-point tensor"):
        function(torch.zeros(4, dtype=torch.int64), sinks=0, window=1, topk=1)
    with pytest.raises(ValueError, match="priority must have shape"):
        function(torch.tensor(1.0), sinks=0, window=1, topk=1)


def test_prefix_kth_smallest_rejects_bad_arguments():
    with pytest.raises(ValueError, match="k must be >= 0, got -1"):
        prefix_kth_smallest(torch.tensor([1, 2]), -1)
    with pytest.raises(ValueError, match=r"needs values in \[0, 2\)"):
        prefix_kth_smallest(torch.tensor([1, -2]), 0)
    with pytest.raises(ValueError, match=r"needs values in \[0, 5\)"):
        prefix_kth_smallest(torch.tensor([1, 5]), 0, bound=5)


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
