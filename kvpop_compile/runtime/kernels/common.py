"""Helpers shared by the Triton kernel launchers."""

from __future__ import annotations

import torch
import triton.language as tl

# A module-level constant is visible inside @triton.jit only when it is a constexpr.
INT64_MAX = tl.constexpr(torch.iinfo(torch.int64).max)


def next_power_of_2(n: int, minimum: int = 1) -> int:
    """The smallest power of two ``>= max(n, minimum)``: Triton block sizes must be powers of
    two, so an odd size is padded to one and its tail masked."""
    n = max(n, minimum)
    return 1 << (n - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact IEEE products for float32 (the default TF32 rounds
    inputs to 10 mantissa bits, far beyond the reference's rounding); bf16/fp16 products are
    exact in the float32 accumulator anyway."""
    return "ieee" if dtype == torch.float32 else "tf32"


def require_contiguous(**tensors: torch.Tensor) -> None:
    """Kernels address tensors by flat offsets; a mutated tensor cannot be copied to fix its
    layout, so a strided one is refused."""
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous for the Triton kernel, got strides "
                f"{tuple(tensor.stride())}"
            )
