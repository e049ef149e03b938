"""Scorers: map a token's features to ``rhat_t``, higher = keep (DESIGN §3).

Every scorer works on one layer, per KV head, with inputs detached from the LLM and pre-RoPE keys
(after ``k_norm``), so a score never depends on absolute position through the key. Scores are
float32 whatever the model's dtype.

One interface serves decode and prefill:

* ``init_state(batch, device)`` → ``(B, H, *state_shape)`` recurrent state (empty for stateless).
* ``update_state(state, k, v)`` → the state after seeing the new token ``(k, v)``: ``(B, H, D)``.
* ``score(state, k, v, position)`` → ``(B, H)`` score of the token leaving the window, read
  against the state *after* the update of the current step (the delay of DESIGN §3).
* ``score_chunk(state, k, v, leaving_k, leaving_v, leaving_position)`` → ``(B, H, L)`` scores
  of the tokens leaving the window at each of ``L`` steps, plus the state after them: a prompt
  chunk's prefill, equal to ``L`` decode steps.
* ``score_sequence(k, v, window)`` → ``(B, H, N)`` scores of all tokens of a prefill, token ``t``
  scored as it will be at step ``t + window``, plus the final state. Entries of the last
  ``window`` tokens are 0: those tokens have not left the window yet.

Attention-fed baselines (``h2o``, ``tova``) score from the attention each cached token receives;
the bounded cache keeps that statistic per slot and calls ``observe``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import KVpopConfig, ScorerKind


def rms_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Parameter-free RMS normalisation over the last dim, in float32.

    Scorers see keys and values of any model; fixing their scale makes one initialisation and
    learning rate work across layers and checkpoints."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def token_features(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[k ; v]`` detached and RMS-normalised: ``(..., D)`` x2 → ``(..., 2D)`` float32."""
    return torch.cat([rms_normalize(k.detach()), rms_normalize(v.detach())], dim=-1)


def _per_head_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """``x (B, H, ..., in) @ weight (H, in, out) + bias (H, out)``, a separate map per head.

    One batched matmul over heads on ``(B, H, M, in)``; broadcasting ``weight`` against the
    token dims instead would copy each head's matrix once per token."""
    batch, heads, *middle, width = x.shape
    rows = x.reshape(batch, heads, -1, width)
    y = torch.einsum("bhmi,hio->bhmo", rows, weight)
    if bias is not None:
        y = y + bias.view(1, heads, 1, bias.shape[-1])
    return y.reshape(batch, heads, *middle, weight.shape[-1])


class PerHeadMLP(nn.Module):
    """Two-layer SiLU MLP with separate weights per KV head: ``(B, H, ..., in) → (B, H, ...)``."""

    def __init__(self, num_heads: int, in_features: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_heads, in_features, hidden))
        self.b1 = nn.Parameter(torch.zeros(num_heads, hidden))
        self.w2 = nn.Parameter(torch.empty(num_heads, hidden, 1))
        self.b2 = nn.Parameter(torch.zeros(num_heads, 1))
        nn.init.normal_(self.w1, std=in_features**-0.5)
        nn.init.normal_(self.w2, std=hidden**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(_per_head_linear(x, self.w1, self.b1))
        return _per_head_linear(hidden, self.w2, self.b2).squeeze(-1)


class Scorer(nn.Module):
    """Base scorer: stateless, scored from ``(k, v, position)`` alone."""

    attention_fed = False

    def __init__(self, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (0,)

    def init_state(self, batch: int, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.zeros(batch, self.num_kv_heads, *self.state_shape, device=device)

    def update_state(self, state: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return state

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
            leaving_position: ``(L,)`` int64 their positions (meaningless entries, for steps
                at which no token leaves, are scored and ignored by the caller).

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


class MLPScorer(Scorer):
    """``mlp``: per-KV-head two-layer MLP on ``[k_t ; v_t]``."""

    def __init__(self, num_kv_heads: int, head_dim: int, hidden: int):
        super().__init__(num_kv_heads, head_dim)
        self.mlp = PerHeadMLP(num_kv_heads, 2 * head_dim, hidden)

    def score_tokens(self, k, v, position):
        return self.mlp(token_features(k, v))


class WindowScorer(Scorer):
    """``window`` (StreamingLLM): newer always wins, so the cache holds sinks + the most recent
    ``window + topk`` tokens."""

    def score_tokens(self, k, v, position):
        return position.to(torch.float32).expand(k.shape[:-1])


class KNormScorer(Scorer):
    """``knorm``: keep keys of small L2 norm (score ``-||k_t||``)."""

    def score_tokens(self, k, v, position):
        return -k.detach().float().norm(dim=-1)


class RandomScorer(Scorer):
    """``random``: a seeded hash of (seed, layer, head, position) in ``[0, 1)``.

    A hash rather than a generator, so prefill and decode draw the same number for a token."""

    def __init__(self, num_kv_heads: int, head_dim: int, seed: int, layer_idx: int):
        super().__init__(num_kv_heads, head_dim)
        self.salt = (seed * 1_000_003 + layer_idx * 7919) & 0xFFFFFFFF

    def score_tokens(self, k, v, position):
        heads = torch.arange(self.num_kv_heads, device=k.device)
        heads = heads.view(1, -1, *([1] * (k.dim() - 3)))
        x = (position.to(torch.int64) * 0x9E3779B1 + heads * 0x85EBCA77 + self.salt) & 0xFFFFFFFF
        # Three rounds of a 32-bit integer mix; every product stays below 2**63.
        for _ in range(3):
            x = ((x ^ (x >> 16)) * 0x045D9F3B) & 0xFFFFFFFF
        x = x ^ (x >> 16)
        return (x.to(torch.float64) / 2.0**32).to(torch.float32).expand(k.shape[:-1]).clone()


class AttentionFedScorer(Scorer):
    """Base of ``h2o`` and ``tova``: the score of a cached token is a per-slot statistic of the
    attention it receives, updated every step, so only the streaming rule applies."""

    attention_fed = True

    def observe(self, statistic: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """New per-slot statistic from ``attention (B, H, C)``, the current query's attention
        to every slot averaged over the KV head's query group."""
        raise NotImplementedError(f"{type(self).__name__} must define observe")

    def score_tokens(self, k, v, position):
        raise ValueError(
            f"the {type(self).__name__} scorer is attention-fed: its scores change every step, "
            "so it has no per-token score; run it through the bounded cache's decode steps"
        )


class H2OScorer(AttentionFedScorer):
    """``h2o``: cumulative attention received since the token arrived."""

    def observe(self, statistic, attention):
        return statistic + attention


class TOVAScorer(AttentionFedScorer):
    """``tova``: the attention the latest query gave the token."""

    def observe(self, statistic, attention):
        return attention


def build_scorer(config: KVpopConfig, num_kv_heads: int, head_dim: int, layer_idx: int = 0):
    """The scorer ``config.scorer`` names, for one layer with ``num_kv_heads`` heads."""
    from .memory_scorer import MemoryScorer

    for name, value in (("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    kind = ScorerKind(config.scorer)
    generator_state = torch.random.get_rng_state()
    # Seed initialisation per layer so a transformed model is reproducible.
    torch.manual_seed(config.seed * 1_000_003 + layer_idx)
    try:
        if kind is ScorerKind.MEMORY:
            return MemoryScorer(
                num_kv_heads,
                head_dim,
                hidden=config.scorer_hidden,
                key_dim=config.memory_dim,
                value_dim=config.memory_value_dim,
            )
        if kind is ScorerKind.MLP:
            return MLPScorer(num_kv_heads, head_dim, config.scorer_hidden)
        if kind is ScorerKind.RANDOM:
            return RandomScorer(num_kv_heads, head_dim, config.seed, layer_idx)
        simple = {
            ScorerKind.WINDOW: WindowScorer,
            ScorerKind.KNORM: KNormScorer,
            ScorerKind.H2O: H2OScorer,
            ScorerKind.TOVA: TOVAScorer,
        }
        return simple[kind](num_kv_heads, head_dim)
    finally:
        torch.random.set_rng_state(generator_state)


__all__ = [
    "AttentionFedScorer",
    "H2OScorer",
    "KNormScorer",
    "MLPScorer",
    "PerHeadMLP",
    "RandomScorer",
    "Scorer",
    "TOVAScorer",
    "WindowScorer",
    "build_scorer",
]
