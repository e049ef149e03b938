"""The ``memory`` scorer: a delayed, stateful scorer with a gated matrix memory (design.md §3).

Per KV head, a matrix memory in the mLSTM / gated-linear-attention family sees every token:

    S_i = f_i * S_{i-1} + g_i * [phi_v(v_i); 1] phi_k(k_i)^T          S_i: (dv + 1, r)

(the last row is the normaliser ``n_i``). When token ``t`` leaves the window at step
``i = t + W`` it is read against ``S_i`` with a query made from its own features, and a small MLP
turns ``[k_t ; v_t ; read]`` into ``rhat_t``. Because the memory has seen the ``W`` tokens after
``t``, the score can tell whether ``t`` is still being referred to.

Decode uses the recurrence; prefill and training use the chunked causal linear-attention form
below, whose read query at step ``i`` is token ``i - W``'s. The two agree to float rounding.
"""

from __future__ import annotations

import torch
from torch import nn

from ..reference.memory_scorer_step import (
    MEMORY_WEIGHTS,
    memory_projections,
    memory_query,
    memory_read,
    memory_readout,
    memory_update,
)
from ..reference.scorer_layers import token_features
from .base import Scorer
from .layers import PerHeadMLP


class MemoryScorer(Scorer):
    """Gated matrix-memory scorer; ``key_dim`` = r, ``value_dim`` = dv."""

    chunk_size = 64  # rows per chunk of the parallel form: O(chunk^2) scratch per head

    def __init__(
        self, num_kv_heads: int, head_dim: int, *, hidden: int, key_dim: int, value_dim: int
    ):
        super().__init__(num_kv_heads, head_dim)
        heads, d = num_kv_heads, head_dim
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.w_key = nn.Parameter(torch.randn(heads, d, key_dim) * d**-0.5)
        self.w_value = nn.Parameter(torch.randn(heads, d, value_dim) * d**-0.5)
        self.w_query = nn.Parameter(torch.randn(heads, 2 * d, key_dim) * (2 * d) ** -0.5)
        self.w_gates = nn.Parameter(torch.randn(heads, 2 * d, 2) * (2 * d) ** -0.5 * 0.1)
        # Forget bias 4 (f ~ 0.98): the memory starts with a horizon of about 50 tokens.
        self.b_gates = nn.Parameter(torch.tensor([4.0, 0.0]).repeat(heads, 1))
        self.readout = PerHeadMLP(heads, 2 * d + value_dim, hidden)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.value_dim + 1, self.key_dim)

    def readout_mlp(self) -> PerHeadMLP:
        return self.readout

    def step_weights(self) -> list[torch.Tensor]:
        """The weights ``kvpop::memory_scorer_step`` takes, in its order
        (:data:`~..reference.memory_scorer_step.MEMORY_WEIGHTS`)."""
        own = [getattr(self, name) for name in MEMORY_WEIGHTS[:5]]  # then the readout's MLP
        return [*own, *self.readout.weights()]

    def _memory_weights(self) -> tuple[torch.Tensor, ...]:
        """``w_key, w_value, w_gates, b_gates``: what the memory update reads."""
        return self.w_key, self.w_value, self.w_gates, self.b_gates

    def _projections(self, k: torch.Tensor, v: torch.Tensor):
        """``k, v (B, H, ..., D)`` → features ``x (..., 2D)``, ``phi_k (..., r)``,
        ``[phi_v; 1] (..., dv + 1)``, ``log f (...)`` and ``g (...)``."""
        x = token_features(k, v)
        return x, *memory_projections(x, *self._memory_weights())

    def _readout(self, x: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
        """``x (..., 2D)`` and the raw read ``(..., dv + 1)`` → ``rhat (...)``."""
        return memory_readout(x, read, *self.readout.weights())

    def update_state(self, state, k, v):
        """``state (B, H, dv + 1, r)``, ``k, v (B, H, D)`` → the state after token ``(k, v)``."""
        return memory_update(state, token_features(k, v), *self._memory_weights())

    def score(self, state, k, v, position):
        """Score ``(B, H)`` of the token ``(k, v)`` leaving the window, read against ``state``."""
        x = token_features(k, v)
        return self._readout(x, memory_read(state, x, self.w_query))

    def update_and_score_(self, state, k, v, leaving_k, leaving_v, leaving_position, rows=None):
        """The decode step's update and score as one ``kvpop::memory_scorer_step`` op: one
        kernel launch per layer on a GPU instead of some thirty small ones (on pages ``rows``
        of the state when given)."""
        return torch.ops.kvpop.memory_scorer_step(
            state, k, v, leaving_k, leaving_v, self.step_weights(), rows
        )

    def score_chunk(self, state, k, v, leaving_k, leaving_v, leaving_position):
        """Scores of the tokens leaving the window during ``L`` steps (see
        :meth:`Scorer.score_chunk`): the chunk's tokens ``k, v (B, H, L, D)`` update the memory,
        and step ``i``'s leaving token is read against the state after step ``i``."""
        _, phi_k, values, log_forget, gate = self._projections(k, v)
        x = token_features(leaving_k, leaving_v)
        queries = memory_query(x, self.w_query)
        reads, state = self._scan(state, queries, phi_k, values, log_forget, gate)
        return self._readout(x, reads), state

    def score_sequence(self, k: torch.Tensor, v: torch.Tensor, window: int):
        """Chunked parallel form. ``k, v (B, H, N, D)`` → ``rhat (B, H, N)`` (token ``t`` read
        against ``S_{t+W}``; 0 for the last ``W`` tokens) and the final state ``S_{N-1}``."""
        batch, heads, n, _ = k.shape
        x, phi_k, values, log_forget, gate = self._projections(k, v)
        # The read at step i uses token (i - W)'s query: shift the queries by the window.
        queries = torch.zeros_like(phi_k)
        if n > window:
            queries[..., window:, :] = memory_query(x[..., : n - window, :], self.w_query)
        state = self.init_state(batch, k.device)
        reads, state = self._scan(state, queries, phi_k, values, log_forget, gate)
        scores = torch.zeros(batch, heads, n, device=k.device)
        if n > window:
            scores[..., : n - window] = self._readout(
                x[..., : n - window, :], reads[..., window:, :]
            )
        return scores, state

    def _scan(self, state, queries, keys, values, log_forget, gate):
        """The causal linear-attention pass over ``L`` steps in chunks of ``chunk_size``: reads
        ``(B, H, L, dv + 1)`` (step ``i``'s query against the state after step ``i``) and the
        final state. Shapes as in :meth:`_chunk`."""
        batch, heads, n, _ = queries.shape
        reads = torch.empty(batch, heads, n, self.value_dim + 1, device=queries.device)
        for start in range(0, n, self.chunk_size):
            end = min(start + self.chunk_size, n)
            reads[..., start:end, :], state = self._chunk(
                state,
                queries[..., start:end, :],
                keys[..., start:end, :],
                values[..., start:end, :],
                log_forget[..., start:end],
                gate[..., start:end],
            )
        return reads, state

    @staticmethod
    def _chunk(state, queries, keys, values, log_forget, gate):
        """One chunk of L steps. ``state (B, H, dv+1, r)``, ``queries, keys (B, H, L, r)``,
        ``values (B, H, L, dv+1)``, ``log_forget, gate (B, H, L)`` → reads ``(B, H, L, dv+1)``
        and the state after the chunk. Every exponent is a sum of log-forgets, so <= 0."""
        length = queries.shape[-2]
        decay_in = torch.cumsum(log_forget, dim=-1)  # log prod f over [chunk start, i]
        causal = torch.ones(length, length, dtype=torch.bool, device=queries.device).tril()
        pairwise = decay_in.unsqueeze(-1) - decay_in.unsqueeze(-2)  # (B, H, L, L): i, j
        pairwise = torch.where(causal, pairwise, torch.full_like(pairwise, float("-inf")))
        weights = (queries @ keys.transpose(-1, -2)) * pairwise.exp() * gate.unsqueeze(-2)
        carried = decay_in.exp().unsqueeze(-1) * (queries @ state.transpose(-1, -2))
        reads = carried + weights @ values
        to_end = (decay_in[..., -1:] - decay_in).exp() * gate  # (B, H, L)
        new_state = (
            decay_in[..., -1].exp()[..., None, None] * state
            + (values * to_end.unsqueeze(-1)).transpose(-1, -2) @ keys
        )
        return reads, new_state
