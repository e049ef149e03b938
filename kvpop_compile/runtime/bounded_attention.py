"""KVpop bounded attention on one layer's cache: ``decode_step`` and ``prefill`` (DESIGN §5).

Both are references in plain PyTorch and have the same contract: ``prefill`` of N tokens leaves
the cache and returns the outputs that N calls of ``decode_step`` would (to float rounding).

The decode step is split into the pieces a compiled graph carries as separate ops — read the
token leaving the window, evict, write the new token, attend — each written without ``.item()``
or a Python branch on data, so one traced step serves every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import KVpopConfig
from . import ops  # noqa: F401  (registers the kvpop ops)
from .attention import query_group
from .cache import BoundedCacheState
from .cache_update import window_slot
from .scorers import AttentionFedScorer, Scorer


@dataclass
class LeavingToken:
    """The token whose window slot the new token takes: all ``(B, H, ...)``."""

    slot: torch.Tensor  # () int64 cache slot of the window ring entry
    ring: torch.Tensor  # () int64 index in the window ring
    key: torch.Tensor  # (B, H, D) after RoPE
    raw_key: torch.Tensor  # (B, H, D) before RoPE (scorer input)
    value: torch.Tensor  # (B, H, D)
    position: torch.Tensor  # (B, H) int64, -1 when the ring slot is still empty
    statistic: torch.Tensor  # (B, H) float32 attention statistic (attention-fed scorers)


def _select(tensor: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    return tensor.index_select(dim, index.view(1)).squeeze(dim)


def leaving_token(state: BoundedCacheState, config: KVpopConfig) -> LeavingToken:
    """The window ring entry the next token overwrites: token ``seen - window`` once the window
    is full (and it is not a sink), otherwise an empty slot (``position == -1``)."""
    ring, slot = window_slot(state.seen, config.sinks, config.topk, config.window)
    statistic = (
        _select(state.statistic, 2, slot)
        if state.statistic.shape[-1]
        else torch.zeros_like(state.positions[..., 0], dtype=torch.float32)
    )
    return LeavingToken(
        slot=slot,
        ring=ring,
        key=_select(state.keys, 2, slot),
        raw_key=_select(state.window_keys, 2, ring),
        value=_select(state.values, 2, slot),
        position=_select(state.positions, 2, slot),
        statistic=statistic,
    )


def evict_(
    state: BoundedCacheState, leaving: LeavingToken, priority: torch.Tensor, config: KVpopConfig
) -> None:
    """Move the leaving token into the pool if it beats the pool's weakest entry
    (``kvpop::evict``; ``priority (B, H)``). A free slot is always taken."""
    torch.ops.kvpop.evict(
        state.keys, state.values, state.positions, state.priorities, state.statistic,
        leaving.key, leaving.value, leaving.position, leaving.statistic, priority,
        config.sinks, config.topk,
    )  # fmt: skip


def write_token_(
    state: BoundedCacheState,
    key: torch.Tensor,
    raw_key: torch.Tensor,
    value: torch.Tensor,
    config: KVpopConfig,
) -> None:
    """Write the new token (``(B, H, 1, D)`` each) at position ``seen``: a sink slot for
    ``seen < sinks``, otherwise the ring slot the leaving token vacated (``kvpop::write_token``)."""
    torch.ops.kvpop.write_token(
        state.keys, state.values, state.positions, state.window_keys, state.statistic,
        state.seen, key, raw_key, value, config.sinks, config.topk, config.window,
    )  # fmt: skip


def _refresh_attention_priorities(
    state: BoundedCacheState, scorer: AttentionFedScorer, probs: torch.Tensor, config: KVpopConfig
) -> None:
    """Fold this step's attention ``probs (B, H, group, C)`` into the per-slot statistic and
    re-derive the pool priorities from it (attention-fed scorers change every step)."""
    state.statistic.copy_(scorer.observe(state.statistic, probs.mean(dim=2)))
    pool = slice(config.sinks, config.sinks + config.topk)
    pool_positions = state.positions[..., pool]
    priority = state.statistic[..., pool] + config.lam * pool_positions.float()
    empty = torch.full_like(priority, float("-inf"))
    state.priorities.copy_(torch.where(pool_positions >= 0, priority, empty))


def _check_inputs(state, q, k, raw_k, v):
    """Validate shapes; return ``k, raw_k, v`` in the cache's dtype.

    Both paths must score the same numbers: decode scores a leaving token from the cache's
    copies, so prefill must see keys and values rounded to the cache's dtype too."""
    if q.dim() != 4 or k.shape != raw_k.shape or k.shape != v.shape or k.dim() != 4:
        raise ValueError(
            "expected q (B, Hq, N, D) and k, raw_k, v of one shape (B, Hkv, N, D); got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, raw_k {tuple(raw_k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    query_group(q.shape[1], k.shape[1])
    expected = (state.keys.shape[0], state.keys.shape[1], state.keys.shape[3])
    got = (k.shape[0], k.shape[1], k.shape[3])
    if got != expected or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"inputs of (batch, kv_heads, head_dim) {got} and q {tuple(q.shape)} do not match "
            f"the cache's {expected}"
        )
    return tuple(x.to(state.keys.dtype) for x in (k, raw_k, v))


@torch.no_grad()
def decode_step(
    state: BoundedCacheState,
    q: torch.Tensor,
    k: torch.Tensor,
    raw_k: torch.Tensor,
    v: torch.Tensor,
    *,
    scorer: Scorer,
    config: KVpopConfig,
    scale: float,
) -> torch.Tensor:
    """One token through the bounded cache, in place.

    Args:
        state: the layer's cache; the new token has position ``state.seen``.
        q: ``(B, Hq, 1, D)`` query after RoPE.
        k, raw_k, v: ``(B, Hkv, 1, D)`` key after RoPE, key before RoPE, value.

    Returns:
        ``(B, Hq, 1, D)`` attention output over sinks + pool + window (the new token included).
    """
    k, raw_k, v = _check_inputs(state, q, k, raw_k, v)
    if q.shape[2] != 1:
        raise ValueError(f"decode_step takes one token, got {q.shape[2]}; use prefill")
    attention_fed = isinstance(scorer, AttentionFedScorer)
    if not attention_fed:
        state.scorer_state.copy_(
            scorer.update_state(state.scorer_state, raw_k[:, :, 0], v[:, :, 0])
        )
    leaving = leaving_token(state, config)
    if attention_fed:
        rhat = leaving.statistic
    else:
        rhat = scorer.score(state.scorer_state, leaving.raw_key, leaving.value, leaving.position)
    evict_(state, leaving, rhat + config.lam * leaving.position.float(), config)
    write_token_(state, k, raw_k, v, config)
    out, probs = torch.ops.kvpop.decode_attention(
        q, state.keys, state.values, state.positions, scale, attention_fed
    )
    if attention_fed:
        _refresh_attention_priorities(state, scorer, probs, config)
    state.seen.add_(1)
    return out


@torch.no_grad()
def decode_tokens(
    state: BoundedCacheState,
    q: torch.Tensor,
    k: torch.Tensor,
    raw_k: torch.Tensor,
    v: torch.Tensor,
    *,
    scorer: Scorer,
    config: KVpopConfig,
    scale: float,
) -> torch.Tensor:
    """N tokens through :func:`decode_step`, one after another (the streaming oracle of
    :func:`prefill`, and the prefill of attention-fed scorers). Shapes as in :func:`prefill`."""
    steps = [
        decode_step(
            state,
            q[:, :, i : i + 1],
            k[:, :, i : i + 1],
            raw_k[:, :, i : i + 1],
            v[:, :, i : i + 1],
            scorer=scorer,
            config=config,
            scale=scale,
        )
        for i in range(q.shape[2])
    ]
    return torch.cat(steps, dim=2) if steps else torch.empty_like(q)


@torch.no_grad()
def prefill(
    state: BoundedCacheState,
    q: torch.Tensor,
    k: torch.Tensor,
    raw_k: torch.Tensor,
    v: torch.Tensor,
    *,
    scorer: Scorer,
    config: KVpopConfig,
    scale: float,
) -> torch.Tensor:
    """N tokens at once into an emptied cache (positions ``0..N-1``), in place.

    Same arguments as :func:`decode_step` with ``N`` tokens. Scores come from the scorer's
    parallel form, eviction steps from the parallel rule, and attention runs under the
    eviction-step mask in query blocks (``O(block * N)`` memory). The cache ends as after
    N decode steps: the same tokens in the same slots with the same keys, values, priorities
    and scorer state (to float rounding), except that pool slots may be in another order and
    empty ring slots may hold other stale values, neither of which any later step reads.
    Attention-fed scorers have no parallel form: they run step by step.

    Returns:
        ``(B, Hq, N, D)`` attention outputs.
    """
    k, raw_k, v = _check_inputs(state, q, k, raw_k, v)
    state.reset_()
    if isinstance(scorer, AttentionFedScorer):
        return decode_tokens(state, q, k, raw_k, v, scorer=scorer, config=config, scale=scale)
    n = q.shape[2]
    rhat, final_scorer_state = scorer.score_sequence(raw_k, v, config.window)
    priority = rhat + config.lam * torch.arange(n, device=q.device, dtype=torch.float32)
    steps = torch.ops.kvpop.eviction_steps(priority, config.sinks, config.window, config.topk)
    out, _ = torch.ops.kvpop.masked_attention(q, k, v, steps, scale, config.prefill_block)
    _fill_after_prefill(state, k, raw_k, v, priority, steps, config)
    state.scorer_state.copy_(final_scorer_state)
    state.seen.fill_(n)
    return out


def _fill_after_prefill(state, k, raw_k, v, priority, steps, config: KVpopConfig) -> None:
    """Write what N decode steps would leave: sinks, the last ``window`` tokens in their ring
    slots, and the pool tokens still alive after the last step (``e_t == N``)."""
    n = k.shape[2]
    sinks, topk, window = config.sinks, config.topk, config.window
    device = k.device

    def put(slots: torch.Tensor, source: torch.Tensor) -> None:
        state.keys.index_copy_(2, slots, k.index_select(2, source).to(state.keys.dtype))
        state.values.index_copy_(2, slots, v.index_select(2, source).to(state.values.dtype))
        state.positions[..., slots] = source

    first_sinks = torch.arange(min(sinks, n), device=device)
    put(first_sinks, first_sinks)
    in_window = torch.arange(min(max(sinks, n - window), n), n, device=device)
    ring = torch.remainder(in_window - sinks, window)
    put(sinks + topk + ring, in_window)
    state.window_keys.index_copy_(
        2, ring, raw_k.index_select(2, in_window).to(state.window_keys.dtype)
    )

    candidates = max(0, n - window - sinks)  # tokens that have left the window
    taken = min(topk, candidates)
    if taken == 0:
        return
    alive = steps[..., sinks : sinks + candidates] == n  # (B, H, candidates); at most topk true
    # Alive tokens first, in position order; a row with fewer alive leaves the rest empty.
    local = torch.sort((~alive).to(torch.int8), dim=-1, stable=True).indices[..., :taken]
    valid = alive.gather(-1, local)
    position = local + sinks  # (B, H, taken)
    pool = slice(sinks, sinks + taken)
    gathered = position.unsqueeze(-1).expand(-1, -1, -1, k.shape[-1])
    zero = torch.zeros((), dtype=state.keys.dtype, device=device)
    state.keys[..., pool, :] = torch.where(
        valid.unsqueeze(-1), k.gather(2, gathered).to(zero.dtype), zero
    )
    state.values[..., pool, :] = torch.where(
        valid.unsqueeze(-1), v.gather(2, gathered).to(zero.dtype), zero
    )
    state.positions[..., pool] = torch.where(valid, position, torch.full_like(position, -1))
    state.priorities[..., :taken] = torch.where(
        valid, priority.gather(-1, position), torch.full_like(priority[..., :taken], float("-inf"))
    )
