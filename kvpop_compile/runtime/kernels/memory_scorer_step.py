"""The ``memory`` scorer's decode step in one launch per layer: the new token updates the
matrix memory and the token leaving the window is scored against it (design.md §3, §5).

In PyTorch the step is some thirty small ops (two RMS norms, five per-head matmuls, the gates,
the rank-one update, the read, a two-layer MLP); at batch 1 each is a launch of a few
microseconds that moves a few kilobytes, so the step costs its launches. One program per
(batch, KV head) does all of it in registers: every vector-matrix product is a broadcast
multiply and a reduction (a token is one row, too few for ``tl.dot``), and the state ``(dv + 1,
r)`` is read once and written once.
Reference: :func:`kvpop_compile.runtime.reference.memory_scorer_step.memory_scorer_step_`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from ..reference.memory_scorer_step import memory_weights
from .common import next_power_of_2, page_index, require_contiguous, require_contiguous_pages

# The reference's RMS-norm epsilon (:func:`~..reference.scorer_layers.rms_normalize`).
RMS_EPS = 1e-6


@triton.jit
def _rms_features(tensor, row, dim, eps, BLOCK_D: tl.constexpr):
    """Row ``row`` of ``tensor (rows, dim)`` RMS-normalised in float32: ``(BLOCK_D,)``, zero
    past ``dim``."""
    features = tl.arange(0, BLOCK_D)
    x = tl.load(tensor + row * dim + features, mask=features < dim, other=0.0).to(tl.float32)
    return x / tl.sqrt(tl.sum(x * x, axis=0) / dim + eps)


@triton.jit
def _times_rows(x, weight, first, rows, cols, BLOCK_IN: tl.constexpr, BLOCK_OUT: tl.constexpr):
    """``x (BLOCK_IN,) @ weight[first : first + rows, :cols]`` of a row-major ``weight`` with
    ``cols`` columns: ``(BLOCK_OUT,)`` float32, zero past ``cols``."""
    i = tl.arange(0, BLOCK_IN)
    j = tl.arange(0, BLOCK_OUT)
    mask = (i[:, None] < rows) & (j[None, :] < cols)
    w = tl.load(weight + (first + i)[:, None] * cols + j[None, :], mask=mask, other=0.0)
    return tl.sum(x[:, None] * w.to(tl.float32), axis=0)


@triton.jit
def _elu_plus_one(x):
    """``elu(x) + 1``: ``x + 1`` above 0, ``exp(x)`` below."""
    return tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))


@triton.jit
def _memory_scorer_step_kernel(
    state, key, value, leaving_key, leaving_value,
    w_key, w_value, w_query, w_gates, b_gates, w1, b1, w2, b2, rhat, rows, page_stride,
    heads, dim, key_dim, value_dim, hidden, eps,
    BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_HIDDEN: tl.constexpr, HAS_ROWS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # flat (batch, kv head) of the step's inputs
    head = row % heads
    # This (page, head)'s state: page ``rows[b]`` under a state-index indirection.
    state += (
        page_index(rows, row // heads, HAS_ROWS) * page_stride + head * (value_dim + 1) * key_dim
    )
    r = tl.arange(0, BLOCK_R)
    v = tl.arange(0, BLOCK_V)  # memory rows: dv values, then the normaliser
    j = tl.arange(0, 2)

    # What the new token stores: its key phi_k, its value [phi_v; 1], and the two gates.
    k_new = _rms_features(key, row, dim, eps, BLOCK_D)
    v_new = _rms_features(value, row, dim, eps, BLOCK_D)
    phi_k = _times_rows(k_new, w_key + head * dim * key_dim, 0, dim, key_dim, BLOCK_D, BLOCK_R)
    phi_k = tl.where(r < key_dim, _elu_plus_one(phi_k), 0.0)
    phi_v = _times_rows(
        v_new, w_value + head * dim * value_dim, 0, dim, value_dim, BLOCK_D, BLOCK_V
    )
    stored = tl.where(v < value_dim, phi_v, tl.where(v == value_dim, 1.0, 0.0))
    gate_weights = w_gates + head * 2 * dim * 2
    gates = (
        _times_rows(k_new, gate_weights, 0, dim, 2, BLOCK_D, 2)
        + _times_rows(v_new, gate_weights, dim, dim, 2, BLOCK_D, 2)
        + tl.load(b_gates + head * 2 + j).to(tl.float32)
    )
    forget = tl.sum(tl.where(j == 0, tl.sigmoid(gates), 0.0), axis=0)
    gate = tl.sum(tl.where(j == 1, tl.sigmoid(gates), 0.0), axis=0)

    # The rank-one update of the state (dv + 1, r), read and written once.
    cells = v[:, None] * key_dim + r[None, :]
    in_state = (v[:, None] < value_dim + 1) & (r[None, :] < key_dim)
    memory = tl.load(state + cells, mask=in_state, other=0.0)
    memory = forget * memory + gate * stored[:, None] * phi_k[None, :]
    tl.store(state + cells, memory, mask=in_state)

    # The leaving token's read of the updated memory, divided by the normaliser (at least 1).
    k_out = _rms_features(leaving_key, row, dim, eps, BLOCK_D)
    v_out = _rms_features(leaving_value, row, dim, eps, BLOCK_D)
    query_weights = w_query + head * 2 * dim * key_dim
    query = _times_rows(k_out, query_weights, 0, dim, key_dim, BLOCK_D, BLOCK_R) + _times_rows(
        v_out, query_weights, dim, dim, key_dim, BLOCK_D, BLOCK_R
    )
    query = tl.where(r < key_dim, _elu_plus_one(query), 0.0)
    read = tl.sum(memory * query[None, :], axis=1)
    normaliser = tl.maximum(tl.abs(tl.sum(tl.where(v == value_dim, read, 0.0), axis=0)), 1.0)
    normalised = tl.where(v < value_dim, read / normaliser, 0.0)

    # The readout MLP on [k ; v ; normalised read].
    inputs = 2 * dim + value_dim
    first = w1 + head * inputs * hidden
    hidden_in = (
        _times_rows(k_out, first, 0, dim, hidden, BLOCK_D, BLOCK_HIDDEN)
        + _times_rows(v_out, first, dim, dim, hidden, BLOCK_D, BLOCK_HIDDEN)
        + _times_rows(normalised, first, 2 * dim, value_dim, hidden, BLOCK_V, BLOCK_HIDDEN)
    )
    units = tl.arange(0, BLOCK_HIDDEN)
    in_hidden = units < hidden
    hidden_in += tl.load(b1 + head * hidden + units, mask=in_hidden, other=0.0).to(tl.float32)
    activation = hidden_in * tl.sigmoid(hidden_in)
    second = tl.load(w2 + head * hidden + units, mask=in_hidden, other=0.0).to(tl.float32)
    score = tl.sum(activation * second, axis=0) + tl.load(b2 + head).to(tl.float32)
    tl.store(rhat + row, score)


def memory_scorer_step(
    state: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    leaving_key: torch.Tensor,
    leaving_value: torch.Tensor,
    weights: list[torch.Tensor],
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of
    :func:`~kvpop_compile.runtime.reference.memory_scorer_step.memory_scorer_step_`, same arguments
    and shapes: ``state (B, H, dv + 1, r)`` float32 (contiguous, updated in place), the new and
    the leaving token's ``key, value (B, H, D)``, the ``weights`` list of
    :mod:`~kvpop_compile.runtime.reference.memory_scorer_step`. Returns ``rhat (B, H)`` float32.
    With ``rows (B,)`` int64 the state has ``P`` pages, each contiguous, at any page stride,
    and token ``b`` updates page ``rows[b]``."""
    if rows is None:
        require_contiguous(state=state)
    else:
        require_contiguous_pages(state=state)
    if state.dtype != torch.float32:
        raise ValueError(f"the memory scorer's state must be float32, got {state.dtype}")
    weights = [w.contiguous() for w in memory_weights(weights)]
    (heads, cells, key_dim), batch = state.shape[1:], key.shape[0]
    dim, value_dim, hidden = key.shape[-1], cells - 1, weights[5].shape[-1]  # w1: (H, in, hidden)
    rhat = torch.empty(batch, heads, device=state.device, dtype=torch.float32)
    wrap_triton(_memory_scorer_step_kernel)[(batch * heads,)](
        state, key.contiguous(), value.contiguous(), leaving_key.contiguous(),
        leaving_value.contiguous(), *weights, rhat,
        rhat if rows is None else rows.contiguous(), state.stride(0),  # rows: read with HAS_ROWS
        heads, dim, key_dim, value_dim, hidden, RMS_EPS,
        BLOCK_D=next_power_of_2(dim), BLOCK_R=next_power_of_2(key_dim),
        BLOCK_V=next_power_of_2(cells), BLOCK_HIDDEN=next_power_of_2(hidden),
        HAS_ROWS=rows is not None,
    )  # fmt: skip
    return rhat
