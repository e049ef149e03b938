"""The ``masked_attention`` op: the Triton kernel ≡ the reference under eviction steps, floats
within a multiple of the float32 reference's own error against a float64 truth; only dead key
blocks are skipped."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import (
    assert_as_accurate_as_reference,
    attention_truth,
    kernel_devices,
    kernels_enabled,
)
from strategies import draw_dtype, heads

from kvpop_compile.runtime import ops  # noqa: F401
from kvpop_compile.runtime.reference.eviction_steps import (
    eviction_steps as reference_eviction_steps,
)
from kvpop_compile.runtime.reference.masked_attention import masked_attention

pytestmark = pytest.mark.parametrize("device", kernel_devices())


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
        steps = reference_eviction_steps(priority, sinks=sinks, window=window, topk=topk)
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


@pytest.mark.parametrize("window", [1, 2, 3])
def test_masked_attention_kernel_skips_only_dead_key_blocks(device, window):
    """No pool: key ``t`` lives until ``t + window``, so the last keys of a block are still
    seen by the first queries of the next block — the edge of the block-skipping rule."""
    from kvpop_compile.runtime.kernels.masked_attention import BLOCK_KEYS, BLOCK_QUERIES

    n = 3 * max(BLOCK_KEYS, BLOCK_QUERIES)
    q, k, v = (torch.randn(1, 2, n, 16, device=device) for _ in range(3))
    steps = reference_eviction_steps(torch.randn(1, 2, n, device=device), sinks=0, window=window,
                                    topk=0)  # fmt: skip
    reference = masked_attention(q, k, v, steps, scale=0.25)
    with kernels_enabled(device):
        out, lse = torch.ops.kvpop.masked_attention(q, k, v, steps, 0.25, 16)
    position = torch.arange(n, device=device)
    visible = (position[None, :] <= position[:, None]) & (position[:, None] < steps[:, :, None])
    truth_out, truth_lse, _ = attention_truth(q.unsqueeze(2), k, v, visible[:, :, None], 0.25)
    for got, want, truth in ((out, reference[0], truth_out), (lse, reference[1], truth_lse)):
        assert_as_accurate_as_reference(got, want, truth.reshape(got.shape), dtype=torch.float32)
