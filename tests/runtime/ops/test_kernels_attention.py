"""Triton attention kernels (bounded decode, prefill under eviction steps, transposed target)
≡ their references: floats within a multiple of the float32 reference's own error against a
float64 truth, index outputs exactly. Through the ``kvpop`` ops."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import (
    assert_as_accurate_as_reference,
    attention_truth,
    kernel_devices,
    kernel_dtypes,
    kernels_enabled,
)

from kvpop_compile.runtime import ops  # noqa: F401
from kvpop_compile.runtime.kernels import bounded_decode_attention as decode_kernel
from kvpop_compile.runtime.reference import eviction
from kvpop_compile.runtime.reference.attention import bounded_decode_attention, masked_attention
from kvpop_compile.runtime.reference.target import future_attention_target

pytestmark = pytest.mark.parametrize("device", kernel_devices())

HEAD_DIMS = [8, 24, 64, 128]  # 24: not a power of two, padded to 32 and masked


@st.composite
def heads(draw):
    """(batch, kv_heads, group, head_dim, seed, dtype index)."""
    return (draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 5)),
            draw(st.sampled_from(HEAD_DIMS)), draw(st.integers(0, 2**16)),
            draw(st.integers(0, 2)))  # fmt: skip


def draw_dtype(device, index):
    dtypes = kernel_dtypes(device)
    return dtypes[index % len(dtypes)]


@settings(max_examples=20)
@given(shape=heads(), capacity=st.integers(1, 150), splits=st.integers(1, 3),
       empty=st.floats(0.0, 0.6), with_probs=st.booleans())  # fmt: skip
def test_decode_attention_kernel_matches_reference(device, shape, capacity, splits, empty,
                                                   with_probs):  # fmt: skip
    batch, kv_heads, group, dim, seed, dtype_index = shape
    dtype = draw_dtype(device, dtype_index)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, 1, dim, generator=g).to(device, dtype)
    keys = torch.randn(batch, kv_heads, capacity, dim, generator=g).to(device, dtype)
    values = torch.randn(batch, kv_heads, capacity, dim, generator=g).to(device, dtype)
    positions = torch.randint(0, 500, (batch, kv_heads, capacity), generator=g)
    positions = torch.where(torch.rand(positions.shape, generator=g) < empty, -1, positions)
    positions[..., -1] = 499  # the new token's slot is never empty
    positions = positions.to(device)
    scale = dim**-0.5
    reference = bounded_decode_attention(q, keys, values, positions, scale=scale)
    with kernels_enabled(device):
        if splits == 1:
            got = torch.ops.kvpop.decode_attention(q, keys, values, positions, scale, with_probs)
        else:
            got = decode_kernel(q, keys, values, positions, scale, with_probs, splits)
    visible = (positions >= 0)[:, :, None, None, :]
    qg = q.reshape(batch, kv_heads, group, 1, dim)
    out, _, probs = attention_truth(qg, keys, values, visible, scale)
    out = out.reshape(batch, kv_heads * group, 1, dim)
    assert got[0].dtype == dtype
    assert_as_accurate_as_reference(got[0], reference[0], out, dtype=dtype, name="out")
    if with_probs:
        assert_as_accurate_as_reference(
            got[1], reference[1], probs[..., 0, :], dtype=torch.float32, name="probs"
        )
    else:
        assert got[1].shape == (batch, kv_heads, group, 0)


@settings(max_examples=15)
@given(shape=heads(), n=st.integers(1, 90), evicting=st.booleans(),
       budget=st.tuples(st.integers(0, 3), st.integers(1, 8), st.integers(0, 10)))  # fmt: skip
def test_masked_attention_kernel_matches_reference(device, shape, n, evicting, budget):
    batch, kv_heads, group, dim, seed, dtype_index = shape
    dtype = draw_dtype(device, dtype_index)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, n, dim, generator=g).to(device, dtype)
    k = torch.randn(batch, kv_heads, n, dim, generator=g).to(device, dtype)
    v = torch.randn(batch, kv_heads, n, dim, generator=g).to(device, dtype)
    steps = None
    if evicting:
        sinks, window, topk = budget
        priority = torch.randn(batch, kv_heads, n, generator=g).to(device)
        steps = eviction.eviction_steps(priority, sinks=sinks, window=window, topk=topk)
    scale = dim**-0.5
    reference = masked_attention(q, k, v, steps, scale=scale, block=16)
    with kernels_enabled(device):
        got = torch.ops.kvpop.masked_attention(q, k, v, steps, scale, 16)
    position = torch.arange(n, device=device)
    visible = position[None, :] <= position[:, None]  # (query, key)
    if steps is not None:
        visible = visible & (position[:, None] < steps[:, :, None, :])
        visible = visible[:, :, None]
    qg = q.reshape(batch, kv_heads, group, n, dim)
    out, lse, _ = attention_truth(qg, k, v, visible, scale)
    out = out.reshape(q.shape)
    lse = lse.reshape(batch, kv_heads * group, n)
    assert_as_accurate_as_reference(got[0], reference[0], out, dtype=dtype, name="out")
    assert_as_accurate_as_reference(got[1], reference[1], lse, dtype=torch.float32, name="lse")


def target_truth(q, k, window, scale, aggregate="mean"):
    """Dense float64 future-attention target: ``log max_g mean_{d >= t + W} p_{d->t}`` (or the
    max over ``d`` for ``aggregate="max"``)."""
    batch, q_heads, n, dim = q.shape
    kv_heads = k.shape[1]
    qg = q.reshape(batch, kv_heads, q_heads // kv_heads, n, dim)
    position = torch.arange(n, device=q.device)
    _, _, probs = attention_truth(qg, k, k, position[None, :] <= position[:, None], scale)
    future = position[:, None] >= position[None, :] + window  # (d, t)
    if aggregate == "max":
        received = (probs * future).amax(dim=-2).amax(dim=2)  # (B, Hkv, N)
        count = torch.ones(n, dtype=torch.float64, device=q.device)
    else:
        received = (probs * future).sum(dim=-2).amax(dim=2)
        count = (n - window - position).clamp(min=1).double()
    valid = n - window - position > 0
    return torch.where(valid, received.log() - count.log(), torch.zeros_like(received)), valid


@settings(max_examples=15)
@given(shape=heads(), n=st.integers(1, 90), window=st.integers(1, 12))
def test_target_kernel_matches_reference(device, shape, n, window):
    _check_target_kernel(device, shape, n, window, "mean")


@settings(max_examples=8)
@given(shape=heads(), n=st.integers(1, 60), window=st.integers(1, 8))
def test_max_target_kernel_matches_reference(device, shape, n, window):
    _check_target_kernel(device, shape, n, window, "max")


def _check_target_kernel(device, shape, n, window, aggregate):
    batch, kv_heads, group, dim, seed, dtype_index = shape
    dtype = draw_dtype(device, dtype_index)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, n, dim, generator=g).to(device, dtype)
    k = torch.randn(batch, kv_heads, n, dim, generator=g).to(device, dtype)
    scale = dim**-0.5
    _, lse = masked_attention(q, k, k, None, scale=scale)
    reference = future_attention_target(q, k, lse, window=window, scale=scale, block=16,
                                        aggregate=aggregate)  # fmt: skip
    with kernels_enabled(device):
        got = torch.ops.kvpop.future_attention_target(q, k, lse, window, scale, 16, aggregate)
    truth, valid = target_truth(q, k, window, scale, aggregate)
    assert torch.equal(got[1], valid) and torch.equal(reference[1], valid)
    # The truth uses the exact lse; both implementations share the float32 lse given to them,
    # whose own rounding is part of the reference's error.
    assert_as_accurate_as_reference(got[0], reference[0], truth, dtype=torch.float32)
    assert math.isfinite(got[0].abs().max().item() if got[0].numel() else 0.0)


@pytest.mark.parametrize("window", [1, 2, 3])
def test_masked_attention_kernel_skips_only_dead_key_blocks(device, window):
    """No pool: key ``t`` lives until ``t + window``, so the last keys of a block are still
    seen by the first queries of the next block — the edge of the block-skipping rule."""
    from kvpop_compile.runtime.kernels.masked_attention import BLOCK_KEYS, BLOCK_QUERIES

    n = 3 * max(BLOCK_KEYS, BLOCK_QUERIES)
    q, k, v = (torch.randn(1, 2, n, 16, device=device) for _ in range(3))
    steps = eviction.eviction_steps(torch.randn(1, 2, n, device=device), sinks=0, window=window,
                                    topk=0)  # fmt: skip
    reference = masked_attention(q, k, v, steps, scale=0.25)
    with kernels_enabled(device):
        out, lse = torch.ops.kvpop.masked_attention(q, k, v, steps, 0.25, 16)
    position = torch.arange(n, device=device)
    visible = (position[None, :] <= position[:, None]) & (position[:, None] < steps[:, :, None])
    truth_out, truth_lse, _ = attention_truth(q.unsqueeze(2), k, v, visible[:, :, None], 0.25)
    for got, want, truth in ((out, reference[0], truth_out), (lse, reference[1], truth_lse)):
        assert_as_accurate_as_reference(got, want, truth.reshape(got.shape), dtype=torch.float32)
