"""The ``running_topk_boundary`` op: the reference's decisions ≡ a brute-force running top-k;
the Triton kernel ≡ the reference, exactly, through the op and the loss's dispatch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import kernel_devices, kernels_enabled
from policy_oracles import boundary
from strategies import budgets, draw_priority, policies

from kvpop_compile.runtime import (
    ops,  # noqa: F401
    running_topk_boundary,
)
from kvpop_compile.training.losses import boundary_decisions


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


@pytest.mark.parametrize("device", kernel_devices())
@settings(max_examples=30)
@given(case=policies(), lam=st.sampled_from([0.0, 0.25]))
def test_boundary_kernel_matches_reference(device, case, lam):
    log_target, budget = case
    log_target = log_target.float().to(device)
    expected = boundary_decisions(log_target, lam=lam, **budget)
    with kernels_enabled(device):
        got = boundary_decisions(log_target, lam=lam, **budget)
    for field in ("new", "boundary", "keep", "valid"):
        assert torch.equal(getattr(got, field), getattr(expected, field)), field
