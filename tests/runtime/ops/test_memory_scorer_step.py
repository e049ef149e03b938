"""The Triton ``memory`` scorer step (memory update and the leaving token's score in one
launch) ≡ its reference, within the reference's own rounding.

Through the ``kvpop`` op, so the device dispatch is tested too. Hypothesis draws the sizes
(odd ones pad the kernel's blocks), and states whose normaliser is below 1 (the clamp) or
negative."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import (
    assert_as_accurate_as_reference,
    kernel_devices,
    kernel_dtypes,
    kernels_enabled,
)

from kvpop_compile.runtime import ops  # noqa: F401
from kvpop_compile.runtime.kernels import memory_scorer_step as memory_scorer_kernel
from kvpop_compile.runtime.reference.memory_scorer_step import memory_scorer_step_

pytestmark = pytest.mark.parametrize("device", kernel_devices())


def scorer_weights(heads, dim, key_dim, value_dim, hidden, g):
    """Weights of the shapes and scales :class:`~kvpop_compile.runtime.MemoryScorer` draws, the
    gate biases spread so that both gates vary."""
    shapes = [(heads, dim, key_dim), (heads, dim, value_dim), (heads, 2 * dim, key_dim),
              (heads, 2 * dim, 2), (heads, 2), (heads, 2 * dim + value_dim, hidden),
              (heads, hidden), (heads, hidden, 1), (heads, 1)]  # fmt: skip
    return [torch.randn(shape, generator=g) * shape[-2] ** -0.5 for shape in shapes]


def step_inputs(c, g):
    b, h, d, r, dv = c["batch"], c["heads"], c["dim"], c["key_dim"], c["value_dim"]
    state = torch.randn(b, h, dv + 1, r, generator=g)
    # The normaliser row: some entries inside (-1, 1), where the read's divisor clamps to 1.
    state[:, :, -1] *= 3 * torch.rand(b, h, 1, generator=g)
    tokens = [torch.randn(b, h, d, generator=g) * 4 for _ in range(4)]
    return state, tokens, scorer_weights(h, d, r, dv, c["hidden"], g)


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 2),
    heads=st.integers(1, 3),
    dim=st.sampled_from([1, 5, 16, 64]),
    key_dim=st.sampled_from([1, 3, 8, 32]),
    value_dim=st.sampled_from([1, 6, 32]),
    hidden=st.sampled_from([1, 7, 64]),
    seed=st.integers(0, 2**16),
)
def test_memory_scorer_kernel_matches_reference(device, **c):
    """Tokens in every dtype the device's kernels take (a bf16 model's keys and values are read
    as the reference reads them: float32 features of the same rounded numbers)."""
    for dtype in kernel_dtypes(device):
        state, tokens, weights = step_inputs(c, torch.Generator().manual_seed(c["seed"]))
        tokens = [t.to(dtype) for t in tokens]
        truth_state = state.double()
        truth = memory_scorer_step_(
            truth_state, *(t.double() for t in tokens), [w.double() for w in weights]
        )
        reference_state = state.clone()
        reference = memory_scorer_step_(reference_state, *tokens, weights)
        state = state.to(device)
        with kernels_enabled(device):
            got = torch.ops.kvpop.memory_scorer_step(
                state, *(t.to(device) for t in tokens), [w.to(device) for w in weights]
            )
        assert got.shape == (c["batch"], c["heads"]) and got.dtype == torch.float32
        for name, kernel, ref, true in (
            ("state", state, reference_state, truth_state),
            ("rhat", got, reference, truth),
        ):
            assert_as_accurate_as_reference(
                kernel.cpu(), ref, true, dtype=torch.float32, name=f"{name} ({dtype})"
            )


@pytest.mark.parametrize("bad", ["strided", "half"])
def test_memory_scorer_kernel_refuses_a_state_it_cannot_update_in_place(device, bad):
    c = dict(batch=1, heads=2, dim=4, key_dim=3, value_dim=2, hidden=5)
    state, tokens, weights = step_inputs(c, torch.Generator().manual_seed(0))
    state = state.transpose(-1, -2).contiguous().transpose(-1, -2) if bad == "strided" else state
    state = state.half() if bad == "half" else state
    message = "contiguous" if bad == "strided" else "float32"
    with pytest.raises(ValueError, match=message):
        memory_scorer_kernel(
            state.to(device), *(t.to(device) for t in tokens), [w.to(device) for w in weights]
        )


def test_memory_scorer_step_names_a_wrong_weight_count(device):
    c = dict(batch=1, heads=2, dim=4, key_dim=3, value_dim=2, hidden=5)
    state, tokens, weights = step_inputs(c, torch.Generator().manual_seed(0))
    message = r"takes 9 weights \(w_key, w_value, .*, b2\), got 8"
    with pytest.raises(ValueError, match=message):
        memory_scorer_step_(state.clone(), *tokens, weights[:-1])
    with pytest.raises(ValueError, match=message):
        memory_scorer_kernel(
            state.to(device), *(t.to(device) for t in tokens), [w.to(device) for w in weights[:-1]]
        )
