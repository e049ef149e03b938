"""The Triton cache-update kernel (fused evict, then the new token's write, in one launch) ≡ its
reference, exactly.

Through the ``kvpop`` ops, so the device dispatch is tested too. Hypothesis draws shapes, ties,
empty slots, ``-inf`` priorities and tokens that are not there (position -1)."""

import importlib
import inspect
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import kernel_devices, kernels_enabled

from kvpop_compile.runtime import ops  # noqa: F401
from kvpop_compile.runtime.reference.update_cache import update_cache_

pytestmark = pytest.mark.parametrize("device", kernel_devices())

# The launcher's module (the package exports the launcher under the same name), whose pool
# chunk the test shrinks.
update_cache_kernel = importlib.import_module("kvpop_compile.runtime.kernels.update_cache")


@st.composite
def caches(draw):
    batch, heads = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    sinks, topk, window = draw(st.integers(0, 3)), draw(st.integers(0, 9)), draw(st.integers(1, 4))
    dim = draw(st.sampled_from([1, 5, 16, 64]))
    capacity = sinks + topk + window
    seed = draw(st.integers(0, 2**16))
    return dict(batch=batch, heads=heads, sinks=sinks, topk=topk, window=window, dim=dim,
                capacity=capacity, seed=seed, statistic=draw(st.booleans()))  # fmt: skip


def cache_tensors(c, device):
    g = torch.Generator().manual_seed(c["seed"])
    b, h, cap, d, k = c["batch"], c["heads"], c["capacity"], c["dim"], c["topk"]
    keys, values = torch.randn(b, h, cap, d, generator=g), torch.randn(b, h, cap, d, generator=g)
    # Distinct positions per row, some slots empty; small integer priorities make ties common.
    positions = torch.stack([torch.randperm(60, generator=g)[:cap] for _ in range(b * h)])
    positions = positions.reshape(b, h, cap)
    positions = torch.where(torch.rand(b, h, cap, generator=g) < 0.25, -1, positions)
    priorities = torch.randint(0, 3, (b, h, k), generator=g).float()
    priorities = torch.where(torch.rand(b, h, k, generator=g) < 0.2, float("-inf"), priorities)
    pool_empty = positions[..., c["sinks"] : c["sinks"] + k] < 0
    priorities = priorities.masked_fill(pool_empty, float("-inf"))
    statistic = torch.rand(b, h, cap if c["statistic"] else 0, generator=g)
    return [t.to(device) for t in (keys, values, positions, priorities, statistic)], g


@settings(max_examples=40)
@given(
    c=caches(),
    seen=st.integers(0, 40),
    pool_chunk=st.sampled_from([2, 4, update_cache_kernel.POOL_CHUNK]),
)
def test_update_cache_kernel_matches_reference(device, c, seen, pool_chunk):
    """``pool_chunk`` < topk makes the weakest-entry search run over several chunks; ``seen``
    below ``sinks`` writes a sink slot, above it a ring slot."""
    cache, g = cache_tensors(c, device)
    keys, values, positions, priorities, statistic = cache
    b, h, d, w = c["batch"], c["heads"], c["dim"], c["window"]
    window_keys = torch.randn(b, h, w, d, generator=g)
    leaving_position = torch.randint(60, 80, (b, h), generator=g)
    leaving_position = torch.where(torch.rand(b, h, generator=g) < 0.2, -1, leaving_position)
    leaving = [torch.randn(b, h, d, generator=g), torch.randn(b, h, d, generator=g),
               leaving_position, torch.rand(b, h, generator=g),
               torch.randint(0, 3, (b, h), generator=g).float()]  # fmt: skip
    token = [torch.randn(b, h, 1, d, generator=g) for _ in range(3)]
    seen_t = torch.full((b,), seen) + torch.arange(b)  # rows at their own positions
    inputs = [t.to(device) for t in (*leaving, seen_t, *token)]
    state = [keys, values, positions, priorities, window_keys.to(device), statistic]
    expected = [t.clone() for t in state]
    update_cache_(*expected, *inputs, c["sinks"], c["topk"], w)
    with kernels_enabled(device), mock.patch.object(update_cache_kernel, "POOL_CHUNK", pool_chunk):
        torch.ops.kvpop.update_cache(*state, *inputs, c["sinks"], c["topk"], w)
    names = ("keys", "values", "positions", "priorities", "window_keys", "statistic")
    for name, got, want in zip(names, state, expected, strict=True):
        assert torch.equal(got, want), name


def test_update_cache_kernel_refuses_a_strided_cache(device):
    keys = torch.zeros(1, 1, 8, 4, device=device).transpose(2, 3)  # (1, 1, 4, 8), strided
    values = torch.zeros(1, 1, 4, 8, device=device)
    positions = torch.full((1, 1, 4), -1, device=device)
    priorities = torch.full((1, 1, 2), float("-inf"), device=device)
    window_keys = torch.zeros(1, 1, 1, 8, device=device)
    statistic = torch.zeros(1, 1, 0, device=device)
    leaving = [torch.zeros(1, 1, 8, device=device), torch.zeros(1, 1, 8, device=device),
               torch.zeros(1, 1, dtype=torch.int64, device=device),
               torch.zeros(1, 1, device=device), torch.zeros(1, 1, device=device)]  # fmt: skip
    token = [torch.zeros(1, 1, 1, 8, device=device) for _ in range(3)]
    seen = torch.zeros(1, dtype=torch.int64, device=device)
    with kernels_enabled(device), pytest.raises(ValueError, match="keys must be contiguous"):
        torch.ops.kvpop.update_cache(
            keys, values, positions, priorities, window_keys, statistic, *leaving, seen, *token,
            1, 2, 1,
        )  # fmt: skip


def test_the_op_its_reference_and_its_kernel_take_one_argument_order(device):
    # The op's schema is the one place the 19 arguments are ordered; the reference and the
    # kernel must take them in that order, since the op passes them on by position.
    del device  # the order is the same on every device
    schema = [argument.name for argument in torch.ops.kvpop.update_cache.default._schema.arguments]
    assert list(inspect.signature(update_cache_).parameters) == schema
    assert list(inspect.signature(update_cache_kernel.update_cache).parameters) == schema
