"""``decode_step``: one token through a layer's bounded cache, in place (design.md §5).

The decode step is split into the pieces a compiled graph carries as separate ops — read the
token leaving the window, update the cache (evict or drop that token, write the new one),
attend — each written without ``.item()`` or a Python branch on data, so one traced step serves
every step. Its counterpart for ``L``
tokens at once is :func:`~.chunk_step.chunk_step`, with the same contract: ``L`` decode steps
and one chunk step leave the same cache and return the same outputs (to float rounding).

A state-index indirection, ``rows (B,)``, runs the step on ``B`` pages of a larger state of
``P`` pages in place (a server's pool of per-request pages): the big fields (keys, values,
window keys, the memory scorer's state) are addressed through the ops, the small ones are read
at ``rows`` and written back with ``index_copy_``. The dense step is the same code with
``rows=None``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import KVpopConfig
from . import ops  # noqa: F401  (registers the kvpop ops)
from .cache import BoundedCacheState
from .ops import check_rows
from .policy import query_group, spread_scores, token_priority, window_slot
from .scorers.attention_fed import AttentionFedScorer
from .scorers.base import Scorer


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


def gather_slots(tensor: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Entries ``slots (B, n)`` along dim 2 of ``tensor (B, H, C, ...)``, the same for every
    head: ``(B, H, n, ...)``."""
    index = slots.view(*slots.shape[:1], 1, slots.shape[-1], *([1] * (tensor.dim() - 3)))
    return tensor.gather(2, index.expand(-1, tensor.shape[1], -1, *tensor.shape[3:]))


def read_rows(tensor: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """Pages ``rows (B,)`` of ``tensor (P, ...)`` as ``(B, ...)`` (a copy), or ``tensor`` itself
    when ``rows`` is ``None``."""
    return tensor if rows is None else tensor.index_select(0, rows)


def write_rows_(tensor: torch.Tensor, rows: torch.Tensor | None, new: torch.Tensor) -> None:
    """Write ``new (B, ...)`` into pages ``rows (B,)`` of ``tensor (P, ...)`` in place (all of
    ``tensor`` when ``rows`` is ``None``)."""
    if rows is None:
        tensor.copy_(new)
    else:
        tensor.index_copy_(0, rows, new)


def leaving_token(
    state: BoundedCacheState, config: KVpopConfig, rows: torch.Tensor | None = None
) -> LeavingToken:
    """The window ring entry each row's next token overwrites: token ``seen - window`` once the
    window is full (and it is not a sink), otherwise an empty slot (``position == -1``). With
    ``rows (B,)``, row ``b`` is page ``rows[b]`` of the state; only the entries read are
    copied."""
    ring, slot = window_slot(read_rows(state.seen, rows), config.sinks, config.topk, config.window)
    at_slot = slot.view(-1, 1)

    def select(tensor: torch.Tensor, index: torch.Tensor = at_slot) -> torch.Tensor:
        if rows is None:
            return gather_slots(tensor, index).squeeze(2)
        heads = torch.arange(tensor.shape[1], device=tensor.device)
        return tensor[rows[:, None], heads[None, :], index]  # (B, H, ...)

    statistic = (
        select(state.statistic)
        if state.statistic.shape[-1]
        else torch.zeros(slot.shape[0], state.positions.shape[1], device=slot.device)
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


def update_state_(
    state: BoundedCacheState,
    leaving: LeavingToken,
    priority: torch.Tensor,
    key: torch.Tensor,
    raw_key: torch.Tensor,
    value: torch.Tensor,
    config: KVpopConfig,
    rows: torch.Tensor | None = None,
) -> None:
    """Move the leaving token into the pool if it beats the pool's weakest entry (``priority
    (B, H)``; a free slot is always taken), then write the new token (``(B, H, 1, D)`` each) at
    position ``seen``: a sink slot for ``seen < sinks``, otherwise the ring slot the leaving
    token vacated (in page ``rows[b]`` when ``rows (B,)`` is given). One ``kvpop::update_cache``
    op, one kernel launch on a GPU."""
    torch.ops.kvpop.update_cache(
        state.keys, state.values, state.positions, state.priorities, state.window_keys,
        state.statistic, leaving.key, leaving.value, leaving.position, leaving.statistic,
        priority, read_rows(state.seen, rows), key, raw_key, value,
        config.sinks, config.topk, config.window, rows,
    )  # fmt: skip


def _refresh_attention_priorities(
    state: BoundedCacheState,
    scorer: AttentionFedScorer,
    probs: torch.Tensor,
    config: KVpopConfig,
    rows: torch.Tensor | None,
) -> None:
    """Fold this step's attention ``probs (B, H, group, C)`` into the per-slot statistic and
    re-derive the pool priorities from it (attention-fed scorers change every step)."""
    write_rows_(
        state.statistic, rows, scorer.observe(read_rows(state.statistic, rows), probs.mean(dim=2))
    )
    pool = slice(config.sinks, config.sinks + config.topk)
    pool_positions = read_rows(state.positions[..., pool], rows)
    statistic = read_rows(state.statistic[..., pool], rows)
    priority = token_priority(statistic, config.lam, pool_positions)
    empty = torch.full_like(priority, float("-inf"))
    write_rows_(state.priorities, rows, torch.where(pool_positions >= 0, priority, empty))


def _check_row_values(rows: torch.Tensor, pages: int) -> None:
    """On the CPU, outside tracing, also check that ``rows`` names distinct pages in ``[0,
    pages)``: a few integers copied, cheap next to the step. Elsewhere (CUDA) reading them
    would synchronise with the device every step, so there it is the caller's contract."""
    if rows.device.type != "cpu" or torch.compiler.is_compiling():
        return
    listed = rows.tolist()
    outside = [row for row in listed if not 0 <= row < pages]
    if outside:
        raise ValueError(f"rows must name pages in [0, {pages}), got {outside} in {listed}")
    if len(set(listed)) != len(listed):
        raise ValueError(f"rows must name distinct pages, got {listed}")


def check_inputs(state, q, k, raw_k, v, rows=None):
    """Validate the shapes of a step's inputs (and ``rows``, see :func:`decode_step`); return
    ``k, raw_k, v`` in the cache's dtype.

    Both steps must score the same numbers: decode scores a leaving token from the cache's
    copies, so a chunk step must see keys and values rounded to the cache's dtype too."""
    if q.dim() != 4 or k.shape != raw_k.shape or k.shape != v.shape or k.dim() != 4:
        raise ValueError(
            "expected q (B, Hq, N, D) and k, raw_k, v of one shape (B, Hkv, N, D); got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, raw_k {tuple(raw_k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    query_group(q.shape[1], k.shape[1])
    batch = state.keys.shape[0]
    if rows is not None:
        check_rows(rows, k.shape[0], state.keys.device)
        _check_row_values(rows, batch)
        batch = rows.shape[0]
    expected = (batch, state.keys.shape[1], state.keys.shape[3])
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
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token through the bounded cache, in place.

    Args:
        state: the layer's cache; row ``b``'s new token has position ``state.seen[b]``.
        q: ``(B, Hq, 1, D)`` query after RoPE.
        k, raw_k, v: ``(B, Hkv, 1, D)`` key after RoPE, key before RoPE, value.
        rows: ``(B,)`` int64 on the state's device, or ``None`` (row ``b`` is the state's row
            ``b``). Given, ``state`` holds ``P`` pages (every field ``(P, ...)``), row ``b``
            of the inputs reads and writes page ``rows[b]`` in place, and the other pages are
            left untouched. The pages must be distinct and in ``[0, P)``: checked on the CPU,
            the caller's contract on CUDA (a check there would synchronise every step).

    Returns:
        ``(B, Hq, 1, D)`` attention output over sinks + pool + window (the new token included).
    """
    k, raw_k, v = check_inputs(state, q, k, raw_k, v, rows)
    if q.shape[2] != 1:
        raise ValueError(f"decode_step takes one token, got {q.shape[2]}; use chunk_step")
    attention_fed = isinstance(scorer, AttentionFedScorer)
    leaving = leaving_token(state, config, rows)
    if attention_fed:
        rhat = leaving.statistic
    else:
        rhat = scorer.update_and_score_(
            state.scorer_state, raw_k[:, :, 0], v[:, :, 0], leaving.raw_key, leaving.value,
            leaving.position, rows=rows,
        )  # fmt: skip
        # Spreading is a no-op (and recent_scores empty) when priority_span is 0.
        spread, recent = spread_scores(
            rhat.unsqueeze(-1),
            read_rows(state.recent_scores, rows),
            leaving.position.unsqueeze(-1),
            config.sinks,
        )
        rhat = spread.squeeze(-1)
        write_rows_(state.recent_scores, rows, recent)
    priority = token_priority(rhat, config.lam, leaving.position)
    update_state_(state, leaving, priority, k, raw_k, v, config, rows)
    out, probs = torch.ops.kvpop.decode_attention(
        q, state.keys, state.values, state.positions, scale, attention_fed, rows
    )
    if attention_fed:
        _refresh_attention_priorities(state, scorer, probs, config, rows)
    write_rows_(state.seen, rows, read_rows(state.seen, rows) + 1)
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
    :func:`~.chunk_step.chunk_step`, and the chunk step of attention-fed scorers): ``q (B, Hq,
    N, D)``, ``k, raw_k, v (B, Hkv, N, D)`` → ``(B, Hq, N, D)``."""
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
