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
    """``knorm``: keep keys of small L2 norm — kvpress's KNorm, whose score is ``-||k_t||`` of
    the key the cache holds (RoPE rotates a key without changing its norm).

    Qwen3 normalises keys (``k_norm``, an RMSNorm with weight ``w``), so the cached key is
    ``k_t = w * x_t / sqrt(mean(x_t**2) + eps)`` with ``x_t`` the projected key. With uniform
    ``w`` (every freshly initialised model) all norms lie within ``eps / mean(x_t**2)`` of
    ``||w||``, below float32's resolution at that magnitude: ``-||k_t||`` in float32 is float
    noise, and noise would choose the evicted token (prefill and decode, eager and compiled,
    would then keep different tokens). So once :meth:`read_keys_before_norm` has been called
    (the ``insert_scorer`` pass does it), the scorer is fed ``x_t`` and computes the same
    ordering without that rounding, as ``||w|| - ||k_t||`` (kvpress's score plus a constant, so
    ``lam`` keeps its meaning) through

        ||k_t|| / ||w|| = sqrt((1 + sum_i d_i p_i) / (1 + eps / mean(x_t**2)))

    with ``p_i = x_i**2 / ||x_t||**2`` and ``d_i = w_i**2 / mean(w**2) - 1``: each factor
    is computed near 1 by ``log1p`` and ``expm1``, so differences of ``eps / mean(x**2)``
    survive. Until a norm is set (the scorer used on its own) the score is kvpress's
    ``-||k_t||`` of the key it is given.
    """

    reads_key_before_norm = True

    def __init__(self, num_kv_heads: int, head_dim: int):
        super().__init__(num_kv_heads, head_dim)
        self.key_norm_eps: float | None = None
        # The model's norm module, kept outside nn.Module registration: its weight belongs to
        # the model (registering it here would save it twice and add state_dict keys). The
        # weight is read at call time, so whatever swaps the norm's parameters (``.to()``,
        # export tracing them, FSDP unsharding) is seen.
        self.__dict__["_key_norm"] = None
        self._key_norm_weight = "weight"

    def read_keys_before_norm(self, norm: nn.Module, weight: str, eps: float) -> None:
        """Score keys given *before* the RMSNorm ``norm`` (its ``(head_dim,)`` parameter called
        ``weight``, epsilon ``eps``), as the norm of the key after it."""
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
            raise ValueError(f"eps must be a number >= 0, got {eps!r}")
        shape = tuple(getattr(norm, weight).shape)
        if shape != (self.head_dim,):
            raise ValueError(
                f"the key norm's {weight} has shape {shape}; knorm needs ({self.head_dim},)"
            )
        self.__dict__["_key_norm"] = norm
        self._key_norm_weight = weight
        self.key_norm_eps = float(eps)

    def score_tokens(self, k, v, position):
        """``(B, H, ..., D)`` keys (before the norm once one is set) → ``(B, H, ...)``."""
        norm = self.__dict__["_key_norm"]
        if norm is None:
            return -k.detach().float().norm(dim=-1)
        x = k.detach().float()
        weight = getattr(norm, self._key_norm_weight).detach().float()  # (D,)
        square = x.square()
        total = square.sum(dim=-1)  # ||x||^2, (B, H, ...)
        deviation = weight.square() / weight.square().mean() - 1  # d_i, exactly 0 if uniform
        # A zero key (an empty slot's placeholder) has norm 0 after the norm: p_i = 0 and
        # eps / mean(x**2) = inf give ||k|| = 0 below.
        spread = (square * deviation).sum(dim=-1) / total.clamp(min=torch.finfo(x.dtype).tiny)
        mean_square = total / x.shape[-1]
        relative_eps = torch.where(
            total > 0, self.key_norm_eps / mean_square, torch.full_like(total, torch.inf)
        )
        log_ratio = 0.5 * (torch.log1p(spread) - torch.log1p(relative_eps))  # log ||k|| / ||w||
        return -weight.norm() * torch.expm1(log_ratio)


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
