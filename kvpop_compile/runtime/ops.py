"""Floor 3 of the runtime: the ``kvpop`` custom ops that a transformed graph carries.

Each op is a ``torch.library.triton_op`` whose body branches on the device: CUDA tensors run
the op's Triton kernel (launched through ``wrap_triton``, so Inductor sees the kernel and
``torch.compile`` keeps one graph), CPU tensors run the plain-PyTorch reference, which Inductor
and AOTInductor inline and lower (an exported CPU package then needs no Python definition of
the op). A fake implementation is derived from the body.

Importing this module registers the ops; ``torch.ops.kvpop.<name>`` calls them. Code above
this floor calls the ops, never a kernel or a reference op directly.
"""

from __future__ import annotations

import torch
from torch.library import triton_op

from .dispatch import use_triton
from .reference.decode_attention import decode_attention as decode_attention_reference
from .reference.eviction_steps import unchecked_eviction_steps
from .reference.future_attention_target import (
    future_attention_target as future_attention_target_reference,
)
from .reference.masked_attention import masked_attention as masked_attention_reference
from .reference.memory_scorer_step import memory_scorer_step_
from .reference.running_topk_boundary import unchecked_running_topk_boundary
from .reference.update_cache import update_cache_


def check_rows(rows: torch.Tensor | None, batch: int, device: torch.device) -> None:
    """Validate a state-index indirection: ``rows (B,)`` int64 on the state's ``device``, one
    page per batch row (``None``: the state is dense, row ``b`` is page ``b``).

    Which pages ``rows`` names cannot be checked here without a host synchronisation on the
    decode path: that the values are distinct and within the state's pages is the caller's
    contract (duplicates or out-of-range values are undefined on the Triton path)."""
    if rows is None:
        return
    if not isinstance(rows, torch.Tensor):
        raise TypeError(f"rows must be a tensor of page indices or None, got {type(rows)}")
    if rows.dtype != torch.int64:
        raise ValueError(f"rows must be int64 page indices, got {rows.dtype}")
    if rows.dim() != 1 or rows.shape[0] != batch:
        raise ValueError(
            f"rows must be 1-D with one page per batch row, (B,) = ({batch},); got shape "
            f"{tuple(rows.shape)}"
        )
    if rows.device != device:
        raise ValueError(f"rows must be on the state's device {device}, got {rows.device}")


def _kernels():
    """The Triton launchers; imported on first use so that the CPU path never imports triton."""
    from . import kernels

    return kernels


@triton_op("kvpop::eviction_steps", mutates_args=())
def eviction_steps(priority: torch.Tensor, sinks: int, window: int, topk: int) -> torch.Tensor:
    """Parallel eviction steps ``(..., N)`` int64 of static ``priority (..., N)``."""
    if use_triton(priority):
        return _kernels().eviction_steps(priority, sinks, window, topk)
    return unchecked_eviction_steps(priority, sinks, window, topk)


@triton_op("kvpop::running_topk_boundary", mutates_args=())
def running_topk_boundary(
    priority: torch.Tensor, sinks: int, window: int, topk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The running top-k's keep-or-drop decision at every query of static ``priority (..., N)``:
    the fields of :class:`~.policy.BoundaryDecisions` (``new``, ``boundary``,
    ``keep``, ``valid``), each ``(..., N)``."""
    if use_triton(priority):
        decisions = _kernels().running_topk_boundary(priority, sinks, window, topk)
    else:
        decisions = unchecked_running_topk_boundary(priority, sinks, window, topk)
    # `new` is a broadcast view; an op's outputs are tensors of their own.
    return decisions.new.contiguous(), decisions.boundary, decisions.keep, decisions.valid


@triton_op("kvpop::masked_attention", mutates_args=())
def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    evict_step: torch.Tensor | None,
    scale: float,
    block: int,
    key_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill attention under eviction steps: ``out (B, Hq, L, D)``, ``lse (B, Hq, L)``; keys
    ``(B, Hkv, T, D)`` at ``key_positions (B, Hkv, T)`` (default: ``0..T-1`` with ``T == L``).
    ``block`` sizes the reference's query blocks; the kernel tiles on its own."""
    if use_triton(q):
        return _kernels().masked_attention(q, k, v, evict_step, scale, key_positions)
    return masked_attention_reference(
        q, k, v, evict_step, scale=scale, block=block, key_positions=key_positions
    )


@triton_op("kvpop::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    with_probs: bool = True,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query per sequence against the bounded cache: ``out (B, Hq, 1, D)`` and ``probs
    (B, Hkv, G, C)``, the attention to every slot, or ``(B, Hkv, G, 0)`` unless ``with_probs``
    (only the attention-fed scorers read it). With ``rows (B,)`` the cache has ``P`` pages,
    ``keys, values (P, Hkv, C, D)``, and query ``b`` reads page ``rows[b]``."""
    check_rows(rows, q.shape[0], keys.device)
    if use_triton(q):
        return _kernels().decode_attention(q, keys, values, positions, scale, with_probs, rows=rows)
    out, probs = decode_attention_reference(q, keys, values, positions, scale=scale, rows=rows)
    return out, probs if with_probs else probs[..., :0].clone()


@triton_op(
    "kvpop::update_cache",
    mutates_args=("keys", "values", "positions", "priorities", "window_keys", "statistic"),
)
def update_cache(
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    priorities: torch.Tensor,
    window_keys: torch.Tensor,
    statistic: torch.Tensor,
    leaving_key: torch.Tensor,
    leaving_value: torch.Tensor,
    leaving_position: torch.Tensor,
    leaving_statistic: torch.Tensor,
    priority: torch.Tensor,
    seen: torch.Tensor,
    key: torch.Tensor,
    raw_key: torch.Tensor,
    value: torch.Tensor,
    sinks: int,
    topk: int,
    window: int,
    rows: torch.Tensor | None = None,
) -> None:
    """A decode step's cache update in one op (in place): the fused evict (argmin over the
    pool, compare, conditional overwrite) of the token leaving the window, then the new
    token's write at each row's position ``seen (B,)`` into its sink or window-ring slot.
    With ``rows (B,)`` the cache tensors (``keys`` to ``statistic``) have ``P`` pages and row
    ``b`` of the step's inputs (the leaving token, ``priority``, ``seen``, the new token)
    updates page ``rows[b]``; other pages are untouched."""
    check_rows(rows, key.shape[0], keys.device)
    update = _kernels().update_cache if use_triton(keys) else update_cache_
    update(
        keys, values, positions, priorities, window_keys, statistic, leaving_key, leaving_value,
        leaving_position, leaving_statistic, priority, seen, key, raw_key, value,
        sinks, topk, window, rows,
    )  # fmt: skip


@triton_op("kvpop::memory_scorer_step", mutates_args=("state",))
def memory_scorer_step(
    state: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    leaving_key: torch.Tensor,
    leaving_value: torch.Tensor,
    weights: list[torch.Tensor],
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ``memory`` scorer's decode step in one op: the new token ``key, value (B, H, D)``
    updates ``state (B, H, dv + 1, r)`` in place, then the leaving token is scored against it;
    returns ``rhat (B, H)`` float32. ``weights`` as :mod:`.reference.memory_scorer_step` orders
    them. With ``rows (B,)`` the state has ``P`` pages, ``(P, H, dv + 1, r)``, and token ``b``
    updates page ``rows[b]``; other pages are untouched."""
    check_rows(rows, key.shape[0], state.device)
    step = _kernels().memory_scorer_step if use_triton(state) else memory_scorer_step_
    return step(state, key, value, leaving_key, leaving_value, weights, rows)


@triton_op("kvpop::future_attention_target", mutates_args=())
def future_attention_target(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    window: int,
    scale: float,
    block: int,
    aggregate: str = "mean",
    power: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Transposed-attention log target ``(B, Hkv, N)`` and its validity ``(N,)``; ``aggregate``
    the mean, max or power mean (of ``power``) over future queries."""
    if use_triton(q):
        return _kernels().future_attention_target(q, k, lse, window, scale, aggregate, power)
    return future_attention_target_reference(
        q, k, lse, window=window, scale=scale, block=block, aggregate=aggregate, power=power
    )
