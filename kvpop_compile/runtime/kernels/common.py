"""Helpers shared by the Triton kernels and their launchers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# A module-level constant is visible inside @triton.jit only when it is a constexpr.
INT64_MAX = tl.constexpr(torch.iinfo(torch.int64).max)


@triton.jit
def online_logsumexp(score, running_max, running_sum):
    """Fold a tile of scores ``(rows, cols)`` into each row's running log-sum-exp, kept as a
    running max and the sum of ``exp(score - max)``.

    Returns the new max and sum ``(rows,)``, the tile's ``exp(score - max)`` ``(rows, cols)``
    and the factor ``(rows,)`` that rescales whatever was accumulated against the old max (an
    attention's weighted values). A row that has seen only ``-inf`` keeps max ``-inf`` and is
    shifted by 0, not by ``-inf`` (``inf - inf`` is NaN)."""
    tile_max = tl.maximum(running_max, tl.max(score, axis=1))
    shift = tl.where(tile_max == float("-inf"), 0.0, tile_max)
    p = tl.exp(score - shift[:, None])
    rescale = tl.exp(running_max - shift)
    return tile_max, running_sum * rescale + tl.sum(p, axis=1), p, rescale


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


def pages_contiguous(tensor: torch.Tensor) -> bool:
    """Whether each page ``tensor[p]`` of a ``(P, ...)`` tensor is contiguous, whatever the
    stride between pages (``Tensor.is_contiguous`` of one page, read from the strides alone)."""
    if tensor.numel() == 0:  # nothing to address (a scorer without a per-slot statistic)
        return True
    expected = 1
    for size, stride in zip(reversed(tensor.shape[1:]), reversed(tensor.stride()[1:]), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def require_contiguous_pages(**tensors: torch.Tensor) -> None:
    """A kernel with a state-index indirection addresses page ``rows[b]`` of a ``(P, ...)``
    tensor by the page stride and everything inside the page by flat offsets: pages may lie
    anywhere apart (views of a server's pool), but each must be contiguous."""
    for name, tensor in tensors.items():
        if not pages_contiguous(tensor):
            raise ValueError(
                f"each page of {name} must be contiguous for the Triton kernel, got shape "
                f"{tuple(tensor.shape)} with strides {tuple(tensor.stride())}"
            )


@triton.jit
def page_index(rows, batch, HAS_ROWS: tl.constexpr):
    """The page that batch row ``batch`` (int64) reads and writes: ``rows[batch]`` under a
    state-index indirection, otherwise the row itself."""
    page = batch
    if HAS_ROWS:
        page = tl.load(rows + batch)
    return page


def priority_rows(priority: torch.Tensor) -> torch.Tensor:
    """``(rows, N)`` contiguous priorities. 16-bit floats are widened to float32 (exactly, so
    the order is kept): the kernels carry a running priority, whose type must not change."""
    rows = priority.reshape(-1, priority.shape[-1])
    if rows.dtype in (torch.float16, torch.bfloat16):
        rows = rows.float()
    return rows.contiguous()
