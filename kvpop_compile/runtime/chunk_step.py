"""``chunk_step``: ``L`` tokens at once through a layer's bounded cache, in place — the chunked
rule (design.md §2), which a prompt's prefill runs chunk by chunk.

Its contract is :func:`~.decode_step.decode_step`'s: one chunk step of ``L`` tokens leaves the
cache and returns the outputs that ``L`` decode steps would (to float rounding). Every index
here is per row (rows may have seen different numbers of tokens) and computed on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import KVpopConfig
from . import ops  # noqa: F401  (registers the kvpop ops)
from .cache import BoundedCacheState
from .decode_step import check_inputs, decode_tokens, gather_slots
from .policy import spread_scores, token_priority
from .scorers.attention_fed import AttentionFedScorer
from .scorers.base import Scorer

# Eviction step of a key no query of the chunk can outlive: held after it.
NEVER = torch.iinfo(torch.int64).max


@torch.no_grad()
def chunk_step(
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
    k, raw_k, v = check_inputs(state, q, k, raw_k, v)
    if isinstance(scorer, AttentionFedScorer) or q.shape[2] == 0:
        return decode_tokens(state, q, k, raw_k, v, scorer=scorer, config=config, scale=scale)
    chunk = _Chunk(state, config, q.shape[2])
    rhat, scorer_state = scorer.score_chunk(
        state.scorer_state, raw_k, v, *chunk.leaving(raw_k, v), chunk.leaving_positions
    )
    rhat, recent = spread_scores(rhat, state.recent_scores, chunk.leaving_positions, config.sinks)
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
    state.recent_scores.copy_(recent)
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
        """``(B, H, M)`` int64 eviction step of every candidate (the chunked rule, design.md §2).

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
        ring_keys = gather_slots(state.window_keys, self.ring_order)
        ring_values = gather_slots(state.values, config.sinks + config.topk + self.ring_order)
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
        leaving_priority = token_priority(rhat, config.lam, self.leaving_positions)
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
        _overwrite_slots(state.keys, slots, from_chunk, gather_slots(k, index))
        _overwrite_slots(state.values, slots, from_chunk, gather_slots(v, index))
        state.positions[..., slots] = torch.where(
            from_chunk.unsqueeze(1), newest.unsqueeze(1), state.positions[..., slots]
        )
        ring_rows = gather_slots(raw_k, index[:, sinks:])
        take = from_chunk[:, None, sinks:, None]
        state.window_keys.copy_(torch.where(take, ring_rows, state.window_keys))


def _gather_rows(source: torch.Tensor, index: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``source (B, H, M, D)`` rows ``index (B, H, K)``, zero where ``keep`` is false."""
    rows = source.gather(2, index.unsqueeze(-1).expand(-1, -1, -1, source.shape[-1]))
    return torch.where(keep.unsqueeze(-1), rows, torch.zeros((), dtype=rows.dtype))


def _overwrite_slots(cache, slots, take, rows) -> None:
    """``cache[..., slots, :] = rows (B, H, n, D)`` where ``take (B, n)``, else unchanged."""
    cache[..., slots, :] = torch.where(take[:, None, :, None], rows, cache[..., slots, :])
