"""The benchmark's three ways of running a model over a sequence.

- :func:`teacher_forced`: the whole sequence in one forward; a transformed model's bounded
  cache runs through all of it (each query sees only what the policy still holds at its step).
- :func:`greedy_continuation`: greedy generation after a prompt, token by token.
- :func:`compressed_prompt`: the prompt-compression protocol. The policy runs over the prompt
  and leaves its bounded cache; the next tokens are then scored with full attention over that
  cache plus themselves (nothing of theirs is evicted), as prompt-compression methods do.

All take ``ids`` of shape (B, L + 1) byte tokens, batched in rows of equal length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache

from ..generation import prefill
from ..kv_cache import KVpopCache, cache_bytes, cache_kwargs


@dataclass
class Scores:
    """Per-target results: ``correct`` (B, T) bool (argmax == target), ``nll`` (B, T) float32."""

    correct: torch.Tensor
    nll: torch.Tensor


def _score(logits: torch.Tensor, targets: torch.Tensor) -> Scores:
    logits = logits.float()
    nll = -torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
    return Scores(logits.argmax(-1) == targets, nll)


def _is_transformed(model: nn.Module) -> bool:
    return getattr(model, "kvpop_config", None) is not None


def model_cache(model: nn.Module):
    """An empty cache of the model's own kind: a KVpop cache for a transformed model,
    transformers' dynamic (full) cache otherwise."""
    if _is_transformed(model):
        return KVpopCache(model.config.num_hidden_layers, model.kvpop_config)
    return DynamicCache(config=model.config)


@torch.no_grad()
def teacher_forced(model: nn.Module, ids: torch.Tensor) -> Scores:
    """Scores of targets ``ids[:, 1:]`` from one forward over ``ids[:, :-1]``: (B, L) each."""
    inputs, targets = ids[:, :-1], ids[:, 1:]
    if _is_transformed(model):
        logits = model(input_ids=inputs, **cache_kwargs(model_cache(model)), use_cache=True).logits
    else:
        logits = model(input_ids=inputs, use_cache=False).logits
    return _score(logits, targets)


@dataclass
class Continuation:
    """``tokens`` (B, steps) generated greedily; ``cache_bytes`` maps tokens in context to the
    bytes the cache held then; ``cache`` is the cache at the end; ``prefill_seconds`` and
    ``decode_seconds`` are the wall times of the prompt and of the generated tokens."""

    tokens: torch.Tensor
    cache: object
    cache_bytes: dict[int, int] = field(default_factory=dict)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of decoding, per sequence."""
        return self.tokens.shape[1] / self.decode_seconds


@torch.no_grad()
def greedy_continuation(
    model: nn.Module, prompt: torch.Tensor, steps: int, *, record_at=(), on_step=None
) -> Continuation:
    """Generate ``steps`` tokens greedily after ``prompt`` (B, P) with the model's own cache
    (a KVpop cache for a transformed model, transformers' full cache otherwise).

    ``record_at``: context lengths at which to record the cache's size; ``on_step()`` is called
    after each token (a progress bar's update).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    start = time.perf_counter()
    cache = model_cache(model)
    batch, length = prompt.shape
    if isinstance(cache, KVpopCache):
        logits = prefill(model, prompt, cache)  # in chunks, the last position's logits only
    else:
        logits = model(
            input_ids=prompt, **cache_kwargs(cache), use_cache=True, logits_to_keep=1
        ).logits
        logits = logits[:, -1]
    prefilled = time.perf_counter()
    tokens, sizes = [], {}
    for step in range(steps):
        token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        tokens.append(token)
        if on_step is not None:
            on_step()
        if step == steps - 1:
            break
        position = torch.full((batch, 1), length + step, dtype=torch.long)
        logits = model(
            input_ids=token, position_ids=position, **cache_kwargs(cache), use_cache=True
        ).logits[:, -1]
        if length + step + 1 in record_at:
            sizes[length + step + 1] = cache_bytes(cache)
    done = time.perf_counter()
    return Continuation(torch.cat(tokens, dim=1), cache, sizes, prefilled - start, done - prefilled)


def first_difference(tokens: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per row of ``tokens`` (B, T), the first step where it differs from ``reference``, or T
    where it never does: (B,) int64."""
    differs = tokens != reference
    steps = torch.full_like(differs[:, 0], tokens.shape[1], dtype=torch.long)
    return torch.where(differs.any(1), differs.long().argmax(1), steps)


def bounded_cache_as_dynamic(cache: KVpopCache, config) -> DynamicCache:
    """The keys and values a filled KVpop cache holds, as a transformers ``DynamicCache``.

    Slot order does not matter to attention: every cached token precedes the tokens that
    follow, and keys carry their position through RoPE. Raises ``ValueError`` if a slot is
    empty (the prompt was shorter than the capacity).
    """
    dynamic = DynamicCache()
    for index, layer in enumerate(cache.layers):
        state = layer.state
        if bool((state.positions < 0).any()):
            raise ValueError(
                f"layer {index}'s KVpop cache has empty slots: the prompt must be longer than "
                f"the capacity {config.layer(index).capacity}"
            )
        dynamic.update(state.keys, state.values, index)
    return dynamic


@torch.no_grad()
def compressed_prompt(
    original: nn.Module, model: nn.Module, ids: torch.Tensor, prompt_length: int
) -> Scores:
    """Prompt-compression scores: targets ``ids[:, prompt_length + 1:]``, (B, L - prompt_length).

    ``model`` (transformed, or ``original`` itself for full attention) runs over the prompt
    ``ids[:, :prompt_length]``; ``original`` then reads ``ids[:, prompt_length:-1]`` at their
    positions over the cache the prompt left.
    """
    batch, total = ids.shape
    if not 0 < prompt_length < total - 1:
        raise ValueError(f"prompt_length must be in 1..{total - 2}, got {prompt_length}")
    prompt, inputs, targets = (
        ids[:, :prompt_length],
        ids[:, prompt_length:-1],
        ids[:, prompt_length + 1 :],
    )
    cache = model_cache(model)
    model(input_ids=prompt, **cache_kwargs(cache), use_cache=True)
    masks = None
    if _is_transformed(model):
        cache = bounded_cache_as_dynamic(cache, model.kvpop_config)
        if model.kvpop_config.per_layer is not None:
            if original.config.model_type != "qwen3":
                # Qwen3-MoE's forward builds its own mask and takes no mask per layer type.
                raise ValueError(
                    f"the prompt-compression protocol reads a per-layer budget on Qwen3 only, "
                    f"got {original.config.model_type!r}; run the other protocols"
                )
            masks = layer_masks(cache, inputs.shape[1], original.dtype)
    positions = torch.arange(prompt_length, total - 1).expand(batch, -1)
    kwargs = dict(input_ids=inputs, position_ids=positions, **cache_kwargs(cache), use_cache=True)
    if masks is None:
        return _score(original(**kwargs).logits, targets)
    # transformers builds one mask for every layer of a type, from the first layer's cache; the
    # layers of a per-layer budget hold different numbers of tokens, so each gets a type of its
    # own for this forward, and its own mask.
    layer_types = original.config.layer_types
    original.config.layer_types = list(masks)
    try:
        logits = original(**kwargs, attention_mask=masks).logits
    finally:
        original.config.layer_types = layer_types
    return _score(logits, targets)


def layer_masks(cache: DynamicCache, length: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Per layer of ``cache``, the additive mask ``(1, 1, length, held + length)`` of ``length``
    new tokens reading every token the layer holds and, causally, each other."""
    masks = {}
    for index, layer in enumerate(cache.layers):
        device = layer.keys.device
        causal = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype, device=device)
        held = torch.zeros(length, layer.keys.shape[-2], dtype=dtype, device=device)
        masks[f"kvpop_layer_{index}"] = torch.cat([held, causal.triu(1)], dim=1)[None, None]
    return masks
