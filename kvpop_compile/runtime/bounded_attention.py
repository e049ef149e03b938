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

    slot: torch.Tensor  # (B,) int64 cache slot of the window ring entry, per row
    ring: torch.Tensor  # (B,) int64 index in the window ring
    key: torch.Tensor  # (B, H, D) after RoPE
    raw_key: torch.Tensor  # (B, H, D) before RoPE (scorer input)
    value: torch.Tensor  # (B, H, D)
    position: torch.Tensor  # (B, H) int64, -1 when the ring slot is still empty
    statistic: torch.Tensor  # (B, H) float32 attention statistic (attention-fed scorers)


def _gather_slots(tensor: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Entries ``slots (B, n)`` along dim 2 of ``tensor (B, H, C, ...)``, the same for every
    head: ``(B, H, n, ...)``."""
    index = slots.view(*slots.shape[:1], 1, slots.shape[-1], *([1] * (tensor.dim() - 3)))
    return tensor.gather(2, index.expand(-1, tensor.shape[1], -1, *tensor.shape[3:]))


def leaving_token(state: BoundedCacheState, config: KVpopConfig) -> LeavingToken:
    """The window ring entry each row's next token overwrites: token ``seen - window`` once the
    window is full (and it is not a sink), otherwise an empty slot (``position == -1``)."""
    ring, slot = window_slot(state.seen, config.sinks, config.topk, config.window)
    at_slot = slot.view(-1, 1)

    def select(tensor: torch.Tensor, index: torch.Tensor = at_slot) -> torch.Tensor:
        return _gather_slots(tensor, index).squeeze(2)

    statistic = (
        select(state.statistic)
        if state.statistic.shape[-1]
        else torch.zeros_like(state.positions[..., 0], dtype=torch.float32)
    )
    return LeavingToken(
        slot=slot,
        ring=ring,
        key=select(state.keys),
        raw_key=select(state.window_keys, ring.view(-1, 1)),
        value=select(state.values),
        position=select(state.positions),
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
        state: the layer's cache; row ``b``'s new token has position ``state.seen[b]``.
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


# Eviction step of a key no query of the chunk can outlive: held after it.
NEVER = torch.iinfo(torch.int64).max


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
    """``L`` tokens at once into the cache, continuing the sequence each row holds (row ``b``'s
    positions ``seen[b] .. seen[b] + L - 1``; an empty cache starts at 0), in place: the chunked
    rule.

    Same arguments as :func:`decode_step` with ``L`` tokens. Scores come from the scorer's
    parallel form continued from its state, eviction steps from the parallel rule over what the
    cache holds plus the chunk, and attention runs over the cache's keys and the chunk's under
    the eviction-step mask (``O(L * (C + L))`` work and memory ``O(block * (C + L))``, whatever
    came before). The cache ends as after ``L`` decode steps: the same tokens in the same
    slots with the same keys, values, priorities and scorer state (to float rounding), except
    that pool slots may be in another order and empty slots may hold other stale values,
    neither of which any later step reads. Attention-fed scorers have no parallel form: they
    run step by step.

    Returns:
        ``(B, Hq, L, D)`` attention outputs.
    """
    k, raw_k, v = _check_inputs(state, q, k, raw_k, v)
    if isinstance(scorer, AttentionFedScorer) or q.shape[2] == 0:
        return decode_tokens(state, q, k, raw_k, v, scorer=scorer, config=config, scale=scale)
    chunk = _Chunk(state, config, q.shape[2])
    rhat, scorer_state = scorer.score_chunk(
        state.scorer_state, raw_k, v, *chunk.leaving(raw_k, v), chunk.leaving_positions
    )
    candidates = chunk.candidates(rhat)
    steps = candidates.eviction_steps(config.topk)
    keys = torch.cat([state.keys, k], dim=2)
    values = torch.cat([state.values, v], dim=2)
    out, _ = torch.ops.kvpop.masked_attention(
        q, keys, values, chunk.key_steps(steps), scale, config.prefill_block,
        chunk.key_positions(),
    )  # fmt: skip
    chunk.hold_survivors(candidates, steps, k, raw_k, v)
    state.scorer_state.copy_(scorer_state)
    state.seen.add_(q.shape[2])
    return out


@dataclass
class _Candidates:
    """The tokens that may sit in the pool during a chunk, ``(B, H, M)`` each with
    ``M = K + W + L``: the pool's slots, the window ring's slots, then the chunk's tokens."""

    positions: torch.Tensor  # int64, -1 where there is no token
    priority: torch.Tensor  # float32 static priority (-inf where it is not needed)
    entry: torch.Tensor  # int64 step at which it is in the pool (NEVER: never, in this chunk)

    def eviction_steps(self, topk: int) -> torch.Tensor:
        """``(B, H, M)`` int64 eviction step of every candidate (the chunked rule, DESIGN §2).

        Ordered by entry step (position order; pool entries first, as they are older than the
        window's), the rule is the parallel one with unit spacing: a candidate leaves when the
        K-th oldest candidate that beats it has entered, or at its own entry if that came
        first. ``kvpop::eviction_steps`` with no sinks and no window gives, in that order, the
        index of whichever of the two is later (``M`` when fewer than K beat it); its entry step
        is the eviction step."""
        count = self.positions.shape[-1]
        order_key = torch.where(self.entry < NEVER, self.positions, NEVER)
        order = torch.sort(order_key, dim=-1, stable=True).indices
        entry = self.entry.gather(-1, order)
        priority = torch.where(
            entry < NEVER, self.priority.gather(-1, order), float("-inf")
        )  # a token that never enters beats nobody
        later = torch.ops.kvpop.eviction_steps(priority, 0, 0, topk)
        steps = torch.where(later < count, entry.gather(-1, later.clamp(max=count - 1)), NEVER)
        return torch.empty_like(steps).scatter_(-1, order, steps)


class _Chunk:
    """Index bookkeeping for one prompt chunk of ``length`` tokens entering ``state``: which
    token leaves the window at each step, the candidates of the pool, the visibility of every
    key, and what the cache holds afterwards. Rows may have seen different numbers of tokens,
    so every position is per row. Nothing here reads a value back to the host."""

    def __init__(self, state: BoundedCacheState, config: KVpopConfig, length: int):
        self.state, self.config, self.length = state, config, length
        device = state.keys.device
        self.start = state.seen.view(-1, 1)  # (B, 1) int64: position of the chunk's first token
        self.positions = self.start + torch.arange(length, device=device)  # (B, L)
        window = config.window
        # Step start + j moves the token at position start - W + j out of the window: the
        # ring's tokens first (in position order), then the chunk's own.
        recent = self.start - window + torch.arange(window + length, device=device)  # (B, W + L)
        self.ring_order = torch.remainder(recent[:, :window] - config.sinks, window)  # (B, W)
        self.leaving_positions = recent[:, None, :length]  # (B, 1, L)

    def leaving(self, raw_k: torch.Tensor, v: torch.Tensor):
        """Pre-RoPE key and value ``(B, H, L, D)`` of the token leaving at each step."""
        state, config = self.state, self.config
        ring_keys = _gather_slots(state.window_keys, self.ring_order)
        ring_values = _gather_slots(state.values, config.sinks + config.topk + self.ring_order)
        keys = torch.cat([ring_keys, raw_k], dim=2)[:, :, : self.length]
        values = torch.cat([ring_values, v], dim=2)[:, :, : self.length]
        return keys, values

    def candidates(self, rhat: torch.Tensor) -> _Candidates:
        """The pool's candidates, with ``rhat (B, H, L)`` the scores of the leaving tokens."""
        state, config = self.state, self.config
        sinks, topk, window = config.sinks, config.topk, config.window
        held = state.positions[..., sinks:]  # (B, H, K + W): pool then ring slots
        pool, ring = held[..., :topk], held[..., topk:]
        shape = (*held.shape[:2], self.length)
        start = self.start.unsqueeze(1)  # (B, 1, 1)
        # Priority of every token that leaves the window during the chunk, by leave step.
        leaving_priority = rhat + config.lam * self.leaving_positions.float()
        unscored = torch.full((*shape[:2], window), float("-inf"), device=rhat.device)
        recent_priority = torch.cat([leaving_priority, unscored], dim=-1)  # (B, H, W + L)
        step_of_ring = (ring - (start - window)).clamp(0, window + self.length - 1)
        chunk_tokens = self.positions.unsqueeze(1).expand(shape)
        entry_pool = torch.where(pool >= 0, start, NEVER)
        entry_ring = torch.where(ring >= 0, ring + window, NEVER)
        entry_chunk = torch.where(chunk_tokens >= sinks, chunk_tokens + window, NEVER)
        return _Candidates(
            positions=torch.cat([held, chunk_tokens], dim=-1),
            priority=torch.cat(
                [
                    state.priorities,
                    recent_priority.gather(-1, step_of_ring),
                    recent_priority[..., window:],
                ],
                dim=-1,
            ),
            entry=torch.cat([entry_pool, entry_ring, entry_chunk], dim=-1),
        )

    def key_positions(self) -> torch.Tensor:
        """``(B, H, C + L)`` position of every key the chunk attends over: the cache's slots,
        then the chunk's tokens."""
        positions = self.state.positions
        chunk = self.positions.unsqueeze(1).expand(*positions.shape[:2], self.length)
        return torch.cat([positions, chunk], dim=-1)

    def key_steps(self, steps: torch.Tensor) -> torch.Tensor:
        """``(B, H, C + L)`` eviction step of every key, from the candidates' ``steps``: sinks
        are never evicted, an empty slot is seen by no query."""
        sinks = self.config.sinks
        positions = self.key_positions()
        key_steps = torch.cat([torch.full_like(positions[..., :sinks], NEVER), steps], dim=-1)
        is_sink = positions < sinks
        key_steps = torch.where(is_sink, NEVER, key_steps)
        return torch.where(positions >= 0, key_steps, 0)

    def hold_survivors(self, candidates, steps, k, raw_k, v) -> None:
        """Write what the cache holds after the chunk: the pool's survivors (entered, not
        evicted), then the chunk's sinks and its newest tokens in their ring slots."""
        state, config = self.state, self.config
        sinks, topk, window = config.sinks, config.topk, config.window
        end = self.start + self.length  # (B, 1)
        # The pool, gathered before the ring slots it may draw from are overwritten.
        alive = (candidates.entry < end.unsqueeze(1)) & (steps >= end.unsqueeze(1))  # <= K per row
        chosen = torch.sort((~alive).to(torch.int8), dim=-1, stable=True).indices[..., :topk]
        kept = alive.gather(-1, chosen)
        held_keys = torch.cat([state.keys[..., sinks:, :], k], dim=2)
        held_values = torch.cat([state.values[..., sinks:, :], v], dim=2)
        pool_keys = _gather_rows(held_keys, chosen, kept)
        pool_values = _gather_rows(held_values, chosen, kept)
        pool = slice(sinks, sinks + topk)
        state.positions[..., pool] = torch.where(kept, candidates.positions.gather(-1, chosen), -1)
        state.priorities.copy_(
            torch.where(kept, candidates.priority.gather(-1, chosen), float("-inf"))
        )
        state.keys[..., pool, :] = pool_keys
        state.values[..., pool, :] = pool_values
        # Sinks and ring slots: slot by slot, the newest position that maps there, if the chunk
        # holds it. Slots are fixed; the positions they take are per row.
        device = k.device
        sink_positions = torch.arange(sinks, device=device).expand(end.shape[0], sinks)
        ring = torch.arange(window, device=device)
        ring_positions = end - 1 - torch.remainder(end - 1 - sinks - ring, window)  # (B, W)
        slots = torch.cat([torch.arange(sinks, device=device), sinks + topk + ring])
        newest = torch.cat([sink_positions, ring_positions], dim=-1)  # (B, S + W)
        # A ring slot's newest position is below `end` by construction; a sink's may not be.
        is_ring = torch.arange(sinks + window, device=device) >= sinks
        from_chunk = (newest >= self.start) & (newest < end) & (~is_ring | (newest >= sinks))
        index = (newest - self.start).clamp(0, self.length - 1)  # (B, S + W)
        _overwrite_slots(state.keys, slots, from_chunk, _gather_slots(k, index))
        _overwrite_slots(state.values, slots, from_chunk, _gather_slots(v, index))
        state.positions[..., slots] = torch.where(
            from_chunk.unsqueeze(1), newest.unsqueeze(1), state.positions[..., slots]
        )
        ring_rows = _gather_slots(raw_k, index[:, sinks:])
        take = from_chunk[:, None, sinks:, None]
        state.window_keys.copy_(torch.where(take, ring_rows, state.window_keys))


def _gather_rows(source: torch.Tensor, index: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``source (B, H, M, D)`` rows ``index (B, H, K)``, zero where ``keep`` is false."""
    rows = source.gather(2, index.unsqueeze(-1).expand(-1, -1, -1, source.shape[-1]))
    return torch.where(keep.unsqueeze(-1), rows, torch.zeros((), dtype=rows.dtype))


def _overwrite_slots(cache, slots, take, rows) -> None:
    """``cache[..., slots, :] = rows (B, H, n, D)`` where ``take (B, n)``, else unchanged."""
    cache[..., slots, :] = torch.where(take[:, None, :, None], rows, cache[..., slots, :])
