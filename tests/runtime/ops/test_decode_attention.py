"""The ``decode_attention`` op: the Triton kernel ≡ the reference, floats within a multiple of
the float32 reference's own error against a float64 truth."""

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
from kvpop_compile.runtime.kernels import decode_attention as decode_kernel
from kvpop_compile.runtime.reference.decode_attention import decode_attention

pytestmark = pytest.mark.parametrize("device", kernel_devices())


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
    reference = decode_attention(q, keys, values, positions, scale=scale)
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
