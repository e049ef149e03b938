"""The ``memory`` scorer's per-token arithmetic (design.md §3) on bare tensors, and
:func:`memory_scorer_step_`, the reference (and CPU implementation) of the
``kvpop::memory_scorer_step`` op: a decode step's memory update and the leaving token's score,
which the Triton kernel in :mod:`kvpop_compile.runtime.kernels.memory_scorer_step` does in one
launch.

Per KV head, with ``x = [k ; v]`` RMS-normalised (:func:`.scorer_layers.token_features`):

    phi_k = elu(x_k W_key) + 1        (r)       the key the memory stores under
    phi_v = x_v W_value               (dv)      the value it stores, with a 1 appended
    f, g  = sigmoid(x W_gates + b)              forget and input gates
    S    <- f S + g [phi_v ; 1] phi_k^T         S: (dv + 1, r), the last row the normaliser
    read  = S (elu(x_t W_query) + 1)            the leaving token t's read
    rhat  = MLP([x_t ; read[:dv] / max(|read[dv]|, 1)])

The op takes the weights as one list, in the order of :data:`MEMORY_WEIGHTS`: ``w_key (H, D,
r)``, ``w_value (H, D, dv)``, ``w_query (H, 2D, r)``, ``w_gates (H, 2D, 2)``, ``b_gates (H,
2)``, ``w1 (H, 2D + dv, hidden)``, ``b1 (H, hidden)``, ``w2 (H, hidden, 1)``, ``b2 (H, 1)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .scorer_layers import per_head_linear, per_head_mlp, token_features

MEMORY_WEIGHTS = ("w_key", "w_value", "w_query", "w_gates", "b_gates", "w1", "b1", "w2", "b2")


def memory_weights(weights) -> tuple[torch.Tensor, ...]:
    """The op's ``weights`` as the tuple of :data:`MEMORY_WEIGHTS`, or a ValueError naming the
    count."""
    if len(weights) != len(MEMORY_WEIGHTS):
        raise ValueError(
            f"the memory scorer step takes {len(MEMORY_WEIGHTS)} weights "
            f"({', '.join(MEMORY_WEIGHTS)}), got {len(weights)}"
        )
    return tuple(weights)


def memory_projections(
    x: torch.Tensor,
    w_key: torch.Tensor,
    w_value: torch.Tensor,
    w_gates: torch.Tensor,
    b_gates: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features ``x (B, H, ..., 2D)`` → what the memory stores: ``phi_k (..., r)``, ``[phi_v ;
    1] (..., dv + 1)``, ``log f (...)`` and ``g (...)``."""
    d = w_key.shape[1]
    phi_k = F.elu(per_head_linear(x[..., :d], w_key, None)) + 1
    phi_v = per_head_linear(x[..., d:], w_value, None)
    values = torch.cat([phi_v, torch.ones_like(phi_v[..., :1])], dim=-1)
    gates = per_head_linear(x, w_gates, b_gates)
    return phi_k, values, F.logsigmoid(gates[..., 0]), torch.sigmoid(gates[..., 1])


def memory_query(x: torch.Tensor, w_query: torch.Tensor) -> torch.Tensor:
    """The read query ``(..., r)`` of features ``x (B, H, ..., 2D)``."""
    return F.elu(per_head_linear(x, w_query, None)) + 1


def memory_readout(
    x: torch.Tensor,
    read: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
) -> torch.Tensor:
    """Features ``x (B, H, ..., 2D)`` and the raw read ``(..., dv + 1)`` → ``rhat (B, H, ...)``:
    the read is divided by its normaliser (at least 1, so an empty memory reads 0)."""
    normalised = read[..., :-1] / read[..., -1:].abs().clamp(min=1.0)
    return per_head_mlp(torch.cat([x, normalised], dim=-1), w1, b1, w2, b2)


def memory_update(
    state: torch.Tensor, x: torch.Tensor, w_key, w_value, w_gates, b_gates
) -> torch.Tensor:
    """``state (B, H, dv + 1, r)`` after the token of features ``x (B, H, 2D)``."""
    phi_k, values, log_forget, gate = memory_projections(x, w_key, w_value, w_gates, b_gates)
    forget = log_forget.exp()[..., None, None]
    return forget * state + gate[..., None, None] * values.unsqueeze(-1) * phi_k.unsqueeze(-2)


def memory_read(state: torch.Tensor, x: torch.Tensor, w_query: torch.Tensor) -> torch.Tensor:
    """The raw read ``(B, H, dv + 1)`` of ``state (B, H, dv + 1, r)`` by the token of features
    ``x (B, H, 2D)``."""
    return (state @ memory_query(x, w_query).unsqueeze(-1)).squeeze(-1)


def memory_scorer_step_(
    state: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    leaving_key: torch.Tensor,
    leaving_value: torch.Tensor,
    weights: list[torch.Tensor],
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step of the ``memory`` scorer, in place: the new token ``key, value (B, H,
    D)`` (pre-RoPE key) updates ``state (B, H, dv + 1, r)`` float32, then the token leaving the
    window, ``leaving_key, leaving_value (B, H, D)``, is read against the updated state.
    ``weights``: the scorer's, as :data:`MEMORY_WEIGHTS` orders them. With ``rows (B,)`` int64
    the state has ``P`` pages, ``(P, H, dv + 1, r)``, and token ``b`` updates page ``rows[b]``.

    Returns:
        ``rhat (B, H)`` float32, the leaving token's score.
    """
    w_key, w_value, w_query, w_gates, b_gates, w1, b1, w2, b2 = memory_weights(weights)
    x = token_features(key, value)
    current = state if rows is None else state.index_select(0, rows)
    updated = memory_update(current, x, w_key, w_value, w_gates, b_gates)
    if rows is None:
        state.copy_(updated)
        updated = state
    else:
        state.index_copy_(0, rows, updated)
    leaving = token_features(leaving_key, leaving_value)
    return memory_readout(leaving, memory_read(updated, leaving, w_query), w1, b1, w2, b2)
