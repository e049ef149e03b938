"""Bounded decode attention (design.md §5): one query token per sequence against the cache slots
``[sinks | pool | window]``, empty slots (position -1) masked.

GQA lives inside the kernel: a program owns one KV head and the whole group of query heads that
share it, so each K/V tile is loaded once per group (the group is padded to 16 rows for
``tl.dot``). Split-K: the slots are cut into ``splits`` chunks, each program producing a
partial (max, sum, weighted values) for its chunk, and a second kernel combines the chunks, one
program per query row — with batch 1 and 8 KV heads there would otherwise be 8 programs on a
GPU of 100+ SMs. When asked, it also returns each query head's attention to every slot (the
attention-fed scorers' input): the first kernel writes raw scores, and a third kernel, over the
same chunks, normalises them with each row's log-sum-exp. With a state-index indirection
(``HAS_ROWS``) query row ``b`` reads page ``rows[b]`` of the cache, found by the page stride.
Reference: :func:`kvpop_compile.runtime.reference.decode_attention.decode_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..policy import query_group
from .common import (
    dot_precision,
    next_power_of_2,
    online_logsumexp,
    page_index,
    pages_contiguous,
)

BLOCK_SLOTS = 64
MIN_CHUNK_TILES = 2


@triton.jit
def _partial_kernel(
    q, keys, values, positions, scores_out, part_max, part_sum, part_acc, rows,
    # Elements between consecutive pages (batch rows) of the cache tensors.
    page_keys, page_values, page_positions,
    scale, kv_heads, capacity, dim, group, chunk, splits,
    BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
    WRITE_SCORES: tl.constexpr, PRECISION: tl.constexpr, HAS_ROWS: tl.constexpr,
):  # fmt: skip
    # Inductor and AOTInductor pass a Python float as fp64: computing in it would turn the
    # float32 online-softmax state into fp64 inside the loop, which Triton refuses.
    scale = tl.cast(scale, tl.float32)
    head = tl.program_id(0).to(tl.int64)  # flat (batch, kv head) of the queries
    page = page_index(rows, head // kv_heads, HAS_ROWS)
    kv_head = head % kv_heads
    keys += page * page_keys + kv_head * capacity * dim
    values += page * page_values + kv_head * capacity * dim
    positions += page * page_positions + kv_head * capacity
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_G)
    features = tl.arange(0, BLOCK_D)
    in_group = rows < group
    in_dim = features < dim
    query = tl.load(
        q + (head * group + rows[:, None]) * dim + features[None, :],
        mask=in_group[:, None] & in_dim[None, :], other=0.0,
    )  # fmt: skip
    running_max = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    begin = split * chunk
    end = tl.minimum(begin + chunk, capacity)
    for start in range(begin, end, BLOCK_C):
        slots = start + tl.arange(0, BLOCK_C)
        in_chunk = slots < end
        tile = slots[:, None] * dim + features[None, :]
        tile_mask = in_chunk[:, None] & in_dim[None, :]
        key = tl.load(keys + tile, mask=tile_mask, other=0.0).to(query.dtype)
        value = tl.load(values + tile, mask=tile_mask, other=0.0).to(query.dtype)
        position = tl.load(positions + slots, mask=in_chunk, other=-1)
        score = tl.dot(query, tl.trans(key), input_precision=PRECISION) * scale
        score = tl.where((position >= 0)[None, :], score, float("-inf"))
        if WRITE_SCORES:
            tl.store(
                scores_out + (head * group + rows[:, None]) * capacity + slots[None, :], score,
                mask=in_group[:, None] & in_chunk[None, :],
            )  # fmt: skip
        running_max, running_sum, p, rescale = online_logsumexp(score, running_max, running_sum)
        acc = acc * rescale[:, None] + tl.dot(p.to(value.dtype), value, input_precision=PRECISION)
    # Partials are laid out (head, group row, split) so a combine program reads one row's
    # splits as a single vector; the padding rows of the group are not stored.
    part = (head * group + rows) * splits + split
    tl.store(part_max + part, running_max, mask=in_group)
    tl.store(part_sum + part, running_sum, mask=in_group)
    tl.store(
        part_acc + part[:, None] * dim + features[None, :], acc,
        mask=in_group[:, None] & in_dim[None, :],
    )  # fmt: skip


@triton.jit
def _combine_kernel(
    out, row_lse, part_max, part_sum, part_acc, dim, splits,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    query_row = tl.program_id(0).to(tl.int64)  # flat (batch, kv head, group member)
    chunks = tl.arange(0, BLOCK_S)
    features = tl.arange(0, BLOCK_D)
    is_chunk = chunks < splits
    part = query_row * splits + chunks
    chunk_max = tl.load(part_max + part, mask=is_chunk, other=float("-inf"))
    total_max = tl.max(chunk_max, axis=0)
    shift = tl.where(total_max == float("-inf"), 0.0, total_max)
    weight = tl.where(is_chunk, tl.exp(chunk_max - shift), 0.0)
    total_sum = tl.sum(weight * tl.load(part_sum + part, mask=is_chunk, other=0.0), axis=0)
    partial = tl.load(
        part_acc + part[:, None] * dim + features[None, :],
        mask=is_chunk[:, None] & (features < dim)[None, :], other=0.0,
    )  # fmt: skip
    result = tl.sum(weight[:, None] * partial, axis=0) / total_sum
    tl.store(out + query_row * dim + features, result.to(out.dtype.element_ty), mask=features < dim)
    tl.store(row_lse + query_row, shift + tl.log(total_sum))


@triton.jit
def _normalize_kernel(
    probs, row_lse, capacity, group, chunk,
    BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Raw scores -> probabilities, one (KV head, chunk of slots) per program."""
    head = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_G)
    in_group = rows < group
    lse = tl.load(row_lse + head * group + rows, mask=in_group, other=0.0)
    begin = tl.program_id(1) * chunk
    end = tl.minimum(begin + chunk, capacity)
    for start in range(begin, end, BLOCK_C):
        slots = start + tl.arange(0, BLOCK_C)
        where = (head * group + rows[:, None]) * capacity + slots[None, :]
        mask = in_group[:, None] & (slots < end)[None, :]
        score = tl.load(probs + where, mask=mask, other=float("-inf"))
        tl.store(probs + where, tl.exp(score - lse[:, None]), mask=mask)


def _default_splits(heads: int, capacity: int, device: torch.device) -> int:
    """Enough chunks for about three programs per SM on a GPU (a decode step reads the whole
    cache once, so the grid must cover every SM to reach full bandwidth), each at least
    ``MIN_CHUNK_TILES`` tiles long; one chunk on the CPU interpreter."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    longest = triton.cdiv(capacity, MIN_CHUNK_TILES * BLOCK_SLOTS)
    return max(1, min(triton.cdiv(3 * sms, heads), longest))


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    with_probs: bool = True,
    splits: int | None = None,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`kvpop_compile.runtime.reference.decode_attention.decode_attention`.

    Args:
        q: ``(B, Hq, 1, D)``; keys, values: ``(B, Hkv, C, D)``; positions: ``(B, Hkv, C)``.
        with_probs: also return the attention probabilities (else an empty ``(B, Hkv, G, 0)``).
        splits: number of slot chunks (split-K); default from the GPU's SM count.
        rows: ``(B,)`` int64 or ``None``: the cache has ``P`` pages and query ``b`` reads page
            ``rows[b]``. Pages may lie at any stride (views of a pool); a page that is not
            contiguous is copied.

    Returns:
        ``out (B, Hq, 1, D)`` in ``q.dtype``, ``probs (B, Hkv, G, C)`` float32.
    """
    batch, q_heads, _, dim = q.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    group = query_group(q_heads, kv_heads)
    heads = batch * kv_heads
    if splits is None:
        splits = _default_splits(heads, capacity, q.device)
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    chunk = triton.cdiv(capacity, splits)
    chunk = triton.cdiv(chunk, BLOCK_SLOTS) * BLOCK_SLOTS  # whole tiles per chunk
    splits = max(1, triton.cdiv(capacity, chunk))
    block_g, block_d = next_power_of_2(group, 16), next_power_of_2(dim, 16)
    device = q.device
    # Pages are addressed by their stride, so only a page that is strided inside needs a copy.
    keys, values, positions = (
        t if pages_contiguous(t) else t.contiguous() for t in (keys, values, positions)
    )
    # The cache is read in its own dtype and converted per tile, never copied.
    compute = torch.promote_types(torch.promote_types(q.dtype, keys.dtype), values.dtype)
    q_rows = q.to(compute).contiguous()
    part_max = torch.empty(heads, group, splits, device=device)
    part_sum = torch.empty(heads, group, splits, device=device)
    part_acc = torch.empty(heads, group, splits, dim, device=device)
    row_lse = torch.empty(heads, group, device=device)
    probs_len = capacity if with_probs else 0
    probs = torch.empty(batch, kv_heads, group, probs_len, device=device)
    out = torch.empty(batch, q_heads, 1, dim, dtype=q.dtype, device=device)
    precision = dot_precision(compute)
    wrap_triton(_partial_kernel)[(heads, splits)](
        q_rows, keys, values, positions, probs, part_max, part_sum, part_acc,
        positions if rows is None else rows.contiguous(),  # read only with HAS_ROWS
        keys.stride(0), values.stride(0), positions.stride(0),
        scale, kv_heads, capacity, dim, group, chunk, splits,
        BLOCK_G=block_g, BLOCK_C=BLOCK_SLOTS, BLOCK_D=block_d,
        WRITE_SCORES=with_probs, PRECISION=precision, HAS_ROWS=rows is not None,
    )  # fmt: skip
    wrap_triton(_combine_kernel)[(heads * group,)](
        out, row_lse, part_max, part_sum, part_acc, dim, splits,
        BLOCK_S=next_power_of_2(splits), BLOCK_D=block_d,
    )  # fmt: skip
    if with_probs:
        wrap_triton(_normalize_kernel)[(heads, splits)](
            probs, row_lse, capacity, group, chunk, BLOCK_G=block_g, BLOCK_C=BLOCK_SLOTS
        )
    return out, probs
