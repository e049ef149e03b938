"""Generation with a bounded cache in a few small functions, and the compiled decode step.

``model.generate()`` works on a transformed model as it is. These functions are the minimal
loop around one static decode step, which is what ``compile`` compiles (``fullgraph=True``: the
whole step, every layer, one graph reused for every token).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from .config import require_int
from .engines.tensorrt import import_torch_tensorrt
from .kv_cache import KVpopCache

DecodeStep = Callable[[torch.Tensor, torch.Tensor, KVpopCache], torch.Tensor]
BACKENDS = ("inductor", "tensorrt")


def _require_transformed(model: nn.Module) -> None:
    if getattr(model, "kvpop_config", None) is None:
        raise ValueError(
            f"{type(model).__name__} is not transformed: call kvpop_compile.transform(model) first"
        )


def new_cache(model: nn.Module) -> KVpopCache:
    """An empty :class:`KVpopCache` for a transformed model."""
    _require_transformed(model)
    return KVpopCache(model.config.num_hidden_layers, model.kvpop_config)


def _check_ids(input_ids: torch.Tensor, name: str) -> None:
    if input_ids.dim() != 2 or input_ids.shape[1] < 1 or input_ids.is_floating_point():
        raise ValueError(
            f"{name} must be integer token ids of shape (batch, length >= 1), got "
            f"{input_ids.dtype} {tuple(input_ids.shape)}"
        )


def prefill(
    model: nn.Module, input_ids: torch.Tensor, cache: KVpopCache, *, chunk: int | None = None
) -> torch.Tensor:
    """Run ``input_ids (B, N)`` into ``cache`` (continuing the sequence it holds, if any);
    next-token logits ``(B, vocab)``.

    The prompt goes through the model in chunks of ``chunk`` tokens (default: the model's
    ``KVpopConfig.chunk_length``, the capacity unless set), each continuing the cache exactly,
    and only the last position's logits are computed: memory above the weights depends on the
    chunk and the capacity, not on ``N``."""
    _require_transformed(model)
    _check_ids(input_ids, "input_ids")
    chunk = model.kvpop_config.chunk_length if chunk is None else chunk
    require_int("chunk", chunk, 1)
    for piece in input_ids.split(chunk, dim=1):
        logits = model(input_ids=piece, cache=cache, use_cache=True, logits_to_keep=1).logits
    return logits[:, -1]


def decode_one_token(
    model: nn.Module, token: torch.Tensor, position: torch.Tensor, cache: KVpopCache
) -> torch.Tensor:
    """One decode step: ``token (B, 1)`` at ``position (B, 1)`` → logits ``(B, vocab)``."""
    if token.dim() != 2 or token.shape[1] != 1 or position.shape != token.shape:
        raise ValueError(
            f"expected token and position of shape (batch, 1), got {tuple(token.shape)} and "
            f"{tuple(position.shape)}"
        )
    out = model(input_ids=token, position_ids=position, cache=cache, use_cache=True)
    return out.logits[:, -1]


def compile(model: nn.Module, backend: str = "inductor", **options) -> DecodeStep:
    """The transformed model's decode step, compiled whole (``fullgraph=True``).

    Returns ``step(token (B, 1), position (B, 1), cache) -> logits (B, vocab)``; pass it to
    :func:`generate`. Every step reuses one graph: the cache is fixed-size and updated in place.
    """
    _require_transformed(model)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "tensorrt":
        import_torch_tensorrt("backend='tensorrt'")  # registers torch.compile's backend
    step = partial(decode_one_token, model)
    return torch.compile(step, backend=backend, fullgraph=True, **options)


@torch.no_grad()
def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    step: DecodeStep | None = None,
    cache: KVpopCache | None = None,
) -> torch.Tensor:
    """Greedy generation: ``input_ids (B, N)`` → ``(B, N + max_new_tokens)``.

    ``step`` is the decode step (``compile(model)``'s, or eager by default). A ``cache`` that
    already holds a sequence is continued: ``input_ids`` are the tokens that follow it."""
    _require_transformed(model)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    cache = new_cache(model) if cache is None else cache
    step = partial(decode_one_token, model) if step is None else step
    token = prefill(model, input_ids, cache).argmax(dim=-1, keepdim=True)
    tokens = [input_ids, token]
    position = torch.full_like(token, int(cache.get_seq_length()))
    for _ in range(max_new_tokens - 1):
        token = step(token, position, cache).argmax(dim=-1, keepdim=True)
        tokens.append(token)
        position = position + 1
    return torch.cat(tokens, dim=1)
