"""The ``eviction_steps`` op: the reference's parallel rule ≡ the streaming simulation
(invariant 4), the visible set is the sinks, the window and the running top-k (invariant 3), the
prefix order statistic under it; the Triton kernel ≡ the reference, exactly, ties and ``-inf``
priorities included."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import kernel_devices, kernels_enabled
from policy_oracles import top_k_eligible
from strategies import budgets, draw_priority, policies

from kvpop_compile.runtime import (
    eviction_steps,
    ops,  # noqa: F401
    prefix_kth_smallest,
    running_topk_boundary,
    streaming_eviction_steps,
)
from kvpop_compile.runtime.reference.eviction_steps import (
    eviction_steps as reference_eviction_steps,
)


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


@pytest.mark.parametrize("device", kernel_devices())
@settings(max_examples=30)
@given(case=policies())
def test_eviction_steps_kernel_matches_reference(device, case):
    priority, budget = case
    priority = priority.to(device)
    expected = reference_eviction_steps(priority, **budget)
    with kernels_enabled(device):
        got = torch.ops.kvpop.eviction_steps(
            priority, budget["sinks"], budget["window"], budget["topk"]
        )
    assert torch.equal(got, expected)
