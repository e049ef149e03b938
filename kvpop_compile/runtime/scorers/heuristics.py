"""Heuristic baselines scored from the token alone (design.md §3): ``window`` (StreamingLLM),
``knorm`` (kvpress's key norm) and ``random``."""

from __future__ import annotations

import torch
from torch import nn

from .base import Scorer


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
