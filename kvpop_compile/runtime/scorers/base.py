"""The ``Scorer`` interface: map a token's features to ``rhat_t``, higher = keep (design.md §3).

Every scorer works on one layer, per KV head, with inputs detached from the LLM and pre-RoPE keys
(after ``k_norm``), so a score never depends on absolute position through the key. Scores are
float32 whatever the model's dtype.

One interface serves decode and prefill:

* ``init_state(batch, device)`` → ``(B, H, *state_shape)`` recurrent state (empty for stateless).
* ``update_state(state, k, v)`` → the state after seeing the new token ``(k, v)``: ``(B, H, D)``.
* ``score(state, k, v, position)`` → ``(B, H)`` score of the token leaving the window, read
  against the state *after* the update of the current step (the delay of design.md §3).
* ``update_and_score_(state, k, v, leaving_k, leaving_v, leaving_position, rows=None)`` →
  ``(B, H)``: the two above as a decode step runs them, ``state`` updated in place (one fused
  op where a scorer has one); with ``rows (B,)``, ``state`` has ``P`` pages and row ``b``
  updates page ``rows[b]``.
* ``score_chunk(state, k, v, leaving_k, leaving_v, leaving_position)`` → ``(B, H, L)`` scores
  of the tokens leaving the window at each of ``L`` steps, plus the state after them: a prompt
  chunk's prefill, equal to ``L`` decode steps.
* ``score_sequence(k, v, window)`` → ``(B, H, N)`` scores of all tokens of a prefill, token ``t``
  scored as it will be at step ``t + window``, plus the final state. Entries of the last
  ``window`` tokens are 0: those tokens have not left the window yet.

Attention-fed baselines (``h2o``, ``tova``, :mod:`.attention_fed`) score from the attention
each cached token receives; the bounded cache keeps that statistic per slot and calls
``observe``.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import PerHeadMLP


class Scorer(nn.Module):
    """Base scorer: stateless, scored from ``(k, v, position)`` alone."""

    attention_fed = False
    # Whether the scorer's keys are taken before the model's key norm (``k_norm``) rather than
    # after it; the insert_scorer pass wires the graph accordingly.
    reads_key_before_norm = False

    def __init__(self, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (0,)

    def readout_mlp(self) -> PerHeadMLP | None:
        """The per-head MLP whose output is ``rhat``, ``(B, H, ..., in) → (B, H, ...)`` (a
        learned scorer's), or ``None``: the layer whose last weights
        :func:`kvpop_compile.streaming_heads.make_streaming_heads` zeroes per head."""
        return None

    def init_state(self, batch: int, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.zeros(batch, self.num_kv_heads, *self.state_shape, device=device)

    def update_state(self, state: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return state

    def update_and_score_(
        self,
        state: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        leaving_k: torch.Tensor,
        leaving_v: torch.Tensor,
        leaving_position: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A decode step's scorer work: the new token ``k, v (B, H, D)`` updates ``state``
        in place, then the leaving token ``leaving_k, leaving_v (B, H, D)`` at
        ``leaving_position (B, H)`` is scored against it: ``rhat (B, H)``. With ``rows (B,)``
        int64, ``state`` is ``(P, H, *state_shape)`` and row ``b`` reads and writes page
        ``rows[b]``."""
        if rows is None:
            state.copy_(self.update_state(state, k, v))
            return self.score(state, leaving_k, leaving_v, leaving_position)
        updated = self.update_state(state.index_select(0, rows), k, v)
        state.index_copy_(0, rows, updated)
        return self.score(updated, leaving_k, leaving_v, leaving_position)

    def score_tokens(self, k: torch.Tensor, v: torch.Tensor, position: torch.Tensor):
        """Stateless score of ``k, v (B, H, ..., D)`` at ``position`` (broadcastable):
        ``(B, H, ...)``."""
        raise NotImplementedError(f"{type(self).__name__} must define score_tokens")

    def score(self, state, k, v, position):
        return self.score_tokens(k, v, position)

    def score_chunk(
        self,
        state: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        leaving_k: torch.Tensor,
        leaving_v: torch.Tensor,
        leaving_position: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The scores a run of ``L`` decode steps gives, at once (a prompt chunk's prefill).

        Args:
            state: ``(B, H, *state_shape)`` before the chunk.
            k, v: ``(B, H, L, D)`` the chunk's tokens, which update the state one by one.
            leaving_k, leaving_v: ``(B, H, L, D)`` the token leaving the window at each step,
                read against the state after that step's update.
            leaving_position: ``(B, 1, L)`` int64 their positions, per row (meaningless
                entries, for steps at which no token leaves, are scored and ignored by the
                caller).

        Returns:
            ``rhat (B, H, L)`` float32 and the state after the chunk.
        """
        rhat = self.score_tokens(leaving_k, leaving_v, leaving_position)
        return rhat.float().expand(leaving_k.shape[:-1]), state

    def score_sequence(self, k: torch.Tensor, v: torch.Tensor, window: int):
        n = k.shape[-2]
        positions = torch.arange(n, device=k.device)
        scores = self.score_tokens(k, v, positions).float().expand(k.shape[:-1]).clone()
        # Same contract as the delayed scorers: tokens still in the window have no score yet.
        scores[..., max(n - window, 0) :] = 0.0
        return scores, self.init_state(k.shape[0], k.device)
