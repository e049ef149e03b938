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


# Bits of the key-norm weights' fixed-point form: products of these integers and float32
# squares (24 bits each) are exact in float64.
WEIGHT_BITS = 23


def fixed_order_sum(terms: torch.Tensor) -> torch.Tensor:
    """``terms (..., n)`` summed over the last dim in one fixed order: ``(...)``.

    ``Tensor.sum`` leaves the order of its additions to the kernel, and eager kernels and
    Inductor's vectorise a reduction differently (by shape, by backend), so equal inputs can sum
    to values a rounding apart. Here the sum is a pairwise tree of elementwise additions (the
    first half of the terms plus the second, padded with an exact zero when odd), which every
    backend rounds alike."""
    while terms.shape[-1] > 1:
        if terms.shape[-1] % 2:
            terms = torch.nn.functional.pad(terms, (0, 1))
        half = terms.shape[-1] // 2
        terms = terms[..., :half] + terms[..., half:]
    return terms[..., 0]


def key_norm_gap(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``||w|| - ||k||`` in float32, ``k = w * x / sqrt(mean(x**2) + eps)`` the RMSNorm of the
    keys ``x (..., D)`` float32 with weight ``w (D,)`` float32: ``(...)``.

    The value is bit-identical on every path (eager or Inductor, CPU or GPU): sums run in one
    fixed order (:func:`fixed_order_sum`), every product that is added to something is exact
    (a float32 square times an integer of at most 24 bits, in float64), so fusing it into a
    multiply-add changes no bit, and the rest is divisions and square roots, which IEEE rounds
    correctly on every backend (no ``log1p`` or ``expm1``, whose implementations differ). So
    equal keys get equal scores wherever they are scored, and ties break the same way on
    every path.

    With ``S = sum x_i**2``, ``T = sum n_i x_i**2`` and ``N = sum n_i``, where ``n_i`` is
    ``w_i**2`` in fixed point (``w_i**2 / max(w**2)`` rounded to ``WEIGHT_BITS`` bits),

        (||k|| / ||w||)**2 = (1 + a) / (1 + b),  a = D T / (N S) - 1,  b = D eps / S,

    and ``1 - ||k|| / ||w|| = (b - a) / ((1 + b) (1 + ||k|| / ||w||))`` keeps the differences
    of ``eps / mean(x**2)`` that decide the order when the weights are uniform: then every
    ``n_i = 2**WEIGHT_BITS``, ``T = 2**WEIGHT_BITS S`` and ``a = 0`` exactly. A zero key (an
    empty slot's placeholder) has norm 0 after the norm.
    """
    head_dim = x.shape[-1]
    # float32 squares (24 significant bits) times integers up to 2**23 are exact in float64.
    squares = x.square().double()
    weight_squares = weight.square().double()
    largest = weight_squares.amax().clamp(min=torch.finfo(torch.float64).tiny)
    fixed = torch.round(weight_squares / largest * 2.0**WEIGHT_BITS)  # n_i, (D,)
    total = fixed_order_sum(squares)  # S, (...)
    weighted = fixed_order_sum(squares * fixed)  # T
    spread = (weighted * head_dim) / (fixed_order_sum(fixed) * total)  # 1 + a
    # A tensor over a tensor: ``number / tensor`` runs as a reciprocal times the number, two
    # roundings, and a compiler may fuse that product into the subtraction below.
    b = torch.full_like(total, head_dim * eps) / total
    ratio = (spread / (1 + b)).sqrt()  # ||k|| / ||w||
    a = spread - 1
    weight_norm = fixed_order_sum(weight_squares).sqrt()
    gap = weight_norm * (b - a) / ((1 + b) * (1 + ratio))
    return torch.where(total > 0, gap, weight_norm).float()


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
    ``lam`` keeps its meaning) by :func:`key_norm_gap`. Until a norm is set (the scorer used on
    its own) the score is kvpress's ``-||k_t||`` of the key it is given.

    Either score is bit-identical for equal keys on every path (prefill or decode, eager or
    compiled): a repeated token's key ties the earlier copy's exactly, and the tie breaks the
    same way wherever the step runs.
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
        x = k.detach().float()
        if norm is None:
            # A fixed-order sum of squares exact in float64: equal keys, equal scores.
            return -fixed_order_sum(x.double().square()).sqrt().float()
        weight = getattr(norm, self._key_norm_weight).detach().float()  # (D,)
        return key_norm_gap(x, weight, self.key_norm_eps)


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
