"""Triton running top-k kernels (eviction steps, boundary decisions) ≡ their references,
exactly, ties and ``-inf`` priorities included; through the op and the loss's dispatch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import kernel_devices, kernels_enabled

from kvpop_compile.runtime import ops  # noqa: F401
from kvpop_compile.runtime.reference import eviction
from kvpop_compile.training.losses import boundary_decisions

pytestmark = pytest.mark.parametrize("device", kernel_devices())


@st.composite
def policies(draw):
    n = draw(st.integers(0, 80))
    ties = draw(st.booleans())
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), n)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    if ties:  # small integers: many equal priorities, resolved by age
        priority = torch.randint(0, 4, shape, generator=g).to(dtype)
    else:
        priority = torch.randn(shape, generator=g, dtype=dtype)
    if draw(st.booleans()):
        priority = torch.where(torch.rand(shape, generator=g) < 0.2, float("-inf"), priority)
    budget = dict(sinks=draw(st.integers(0, 4)), window=draw(st.integers(1, 6)),
                  topk=draw(st.integers(0, 12)))  # fmt: skip
    return priority, budget


@settings(max_examples=30)
@given(case=policies())
def test_eviction_steps_kernel_matches_reference(device, case):
    priority, budget = case
    priority = priority.to(device)
    expected = eviction.eviction_steps(priority, **budget)
    with kernels_enabled(device):
        got = torch.ops.kvpop.eviction_steps(
            priority, budget["sinks"], budget["window"], budget["topk"]
        )
    assert torch.equal(got, expected)


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
