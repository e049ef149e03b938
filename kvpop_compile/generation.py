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
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .config import require_int
from .cuda_graph import CUDAGraphStep
from .kv_cache import KVpopCache, cache_kwargs
from .optional import import_torch_tensorrt
from .transform import require_transformed

# ``step(token (B, 1), position (B, 1) or None, cache) -> logits (B, vocab)``: decode_one_token
# bound to a model, eager or compiled. (The exported engines' counterpart, with the cache as
# explicit inputs and outputs, is the module ``engines.steps.DecodeStep``.)
DecodeFunction = Callable[[torch.Tensor, torch.Tensor | None, KVpopCache], torch.Tensor]
BACKENDS = ("inductor", "tensorrt")
# generate()'s default stop ids: the model's generation config's, as transformers' generate().
USE_MODEL_DEFAULT = object()
# What transformers' generate() samples with when neither the call nor the model's generation
# config sets a value (GenerationConfig's global defaults).
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


def new_cache(model: nn.Module) -> KVpopCache:
    """An empty :class:`KVpopCache` for a transformed model."""
    return KVpopCache(model.config.num_hidden_layers, require_transformed(model))


def _check_ids(input_ids: torch.Tensor, name: str) -> None:
    if input_ids.dim() != 2 or input_ids.shape[1] < 1 or input_ids.is_floating_point():
        raise ValueError(
            f"{name} must be integer token ids of shape (batch, length >= 1), got "
            f"{input_ids.dtype} {tuple(input_ids.shape)}"
        )


def prefill(
    model: nn.Module,
    input_ids: torch.Tensor,
    cache: KVpopCache,
    *,
    chunk: int | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run ``input_ids (B, N)`` into ``cache`` (continuing the sequence it holds, if any);
    next-token logits ``(B, vocab)``.

    The prompt goes through the model in chunks of ``chunk`` tokens (default: the model's
    ``KVpopConfig.chunk_length``, the capacity unless set), each continuing the cache exactly,
    and only the last position's logits are computed: memory above the weights depends on the
    chunk and the capacity, not on ``N``.

    ``attention_mask (B, N)`` (1 for a token, 0 for padding) takes a batch of prompts of
    different lengths, left-padded (as a tokenizer with ``padding_side="left"`` gives them):
    the padding is never cached and every row continues from its own length.

    This is the one prefill: within it each layer runs a chunk through its cache with
    :func:`~kvpop_compile.runtime.chunk_step.chunk_step`, and an exported engine runs it as
    ``EngineRunner.prefill``."""
    require_transformed(model)
    _check_ids(input_ids, "input_ids")
    chunk = model.kvpop_config.chunk_length if chunk is None else chunk
    require_int("chunk", chunk, 1)
    # Each row counts on from the tokens its row of the cache holds. The positions are passed,
    # not left to the model: they then never depend on how a transformers release counts a
    # cache's length.
    before = cache.next_positions(input_ids.shape[0], input_ids.device).view(-1, 1)
    if attention_mask is None:
        positions = before + torch.arange(input_ids.shape[1], device=input_ids.device)
    else:
        attention_mask = _checked_mask(attention_mask, input_ids)
        # Each row counts from its first token; the padding's positions are never used.
        positions = before + (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    for start in range(0, input_ids.shape[1], chunk):
        end = start + chunk
        inputs = {"position_ids": positions[:, start:end], **cache_kwargs(cache)}
        if attention_mask is not None:  # the mask of every column so far, as generate() passes
            inputs["attention_mask"] = attention_mask[:, :end]
        piece = input_ids[:, start:end]
        out = model(input_ids=piece, use_cache=True, logits_to_keep=1, **inputs)
    return out.logits[:, -1]


def _checked_mask(attention_mask: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """The mask as ``(B, N)`` int64, or a ValueError naming what is wrong with it."""
    if not torch.is_tensor(attention_mask) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if torch.is_tensor(attention_mask) else (
            type(attention_mask).__name__)  # fmt: skip
        raise ValueError(
            f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, got {shape}"
        )
    return attention_mask.to(device=input_ids.device, dtype=torch.long)


def decode_one_token(
    model: nn.Module, token: torch.Tensor, position: torch.Tensor | None, cache: KVpopCache
) -> torch.Tensor:
    """One decode step: ``token (B, 1)`` → logits ``(B, vocab)``.

    Each row's token position is the number of tokens its row of the cache holds, read on the
    device (no host synchronisation). ``position (B, 1)`` may be passed to state it: run
    eagerly, a position that disagrees with the cache raises; ``None`` skips the check."""
    if token.dim() != 2 or token.shape[1] != 1:
        raise ValueError(f"expected token of shape (batch, 1), got {tuple(token.shape)}")
    position_ids = cache.next_positions(token.shape[0], token.device).view(-1, 1)
    if position is not None and not torch.compiler.is_compiling():
        _check_position(position, position_ids)
    out = model(input_ids=token, position_ids=position_ids, use_cache=True, **cache_kwargs(cache))
    return out.logits[:, -1]


def _check_position(position: torch.Tensor, expected: torch.Tensor) -> None:
    if not torch.is_tensor(position) or position.shape != expected.shape:
        shape = tuple(position.shape) if torch.is_tensor(position) else type(position).__name__
        raise ValueError(f"expected position of shape {tuple(expected.shape)}, got {shape}")
    if bool((position.to(expected.device) != expected).any()):
        raise ValueError(
            f"position {position.flatten().tolist()} disagrees with the cache, whose rows hold "
            f"{expected.flatten().tolist()} tokens: those are the next tokens' positions (pass "
            "None to take them from the cache)"
        )


def compile(
    model: nn.Module, backend: str = "inductor", *, cuda_graph: bool = False, **options
) -> DecodeFunction:
    """The transformed model's decode step, compiled whole (``fullgraph=True``).

    Returns ``step(token (B, 1), position (B, 1) or None, cache) -> logits (B, vocab)``; pass
    it to :func:`generate`. Every step reuses one graph: the cache is fixed-size and updated
    in place. ``cuda_graph`` (a model on a CUDA device) also captures the compiled step in one
    CUDA graph, replayed for every token (:class:`~.cuda_graph.CUDAGraphStep`).
    """
    require_transformed(model)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if not isinstance(cuda_graph, bool):
        raise TypeError(f"cuda_graph must be True or False, got {cuda_graph!r}")
    if cuda_graph and next(model.parameters()).device.type != "cuda":
        raise ValueError(
            f"cuda_graph=True needs the model on a CUDA device, got "
            f"{next(model.parameters()).device}; compile without it on other devices"
        )
    if backend == "tensorrt":
        import_torch_tensorrt("backend='tensorrt'")  # registers torch.compile's backend
    compiled = torch.compile(_own_decode_step(model), backend=backend, fullgraph=True, **options)
    return CUDAGraphStep(compiled) if cuda_graph else compiled


def _own_decode_step(model: nn.Module) -> DecodeFunction:
    """:func:`decode_one_token` bound to ``model``, as a function with a code object of its own.

    torch.compile keeps its compiled graphs per code object, and a code object that gathers
    more than ``torch._dynamo.config.recompile_limit`` (8) of them fails under
    ``fullgraph=True``. Each model's step is a graph of its own (its guards name the model's
    modules), so steps sharing a code object would fail from the ninth compiled model on: a
    ``functools.partial`` is compiled through a wrapper whose code object every compiled
    partial in the process shares, and every closure made here shares one code object. A copy
    of the code object gives each compiled step a cache of its own, freed with the step; the
    limits and other compiled functions' caches are left as they are."""

    def step(token: torch.Tensor, position: torch.Tensor | None, cache: KVpopCache):
        return decode_one_token(model, token, position, cache)

    step.__code__ = step.__code__.replace()  # an equal code object, but not the same one
    return step


@torch.no_grad()
def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    attention_mask: torch.Tensor | None = None,
    step: DecodeFunction | None = None,
    cache: KVpopCache | None = None,
    eos_token_id: int | list[int] | None = USE_MODEL_DEFAULT,
    pad_token_id: int | None = None,
    do_sample: bool = False,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
) -> torch.Tensor:
    """Generate after ``input_ids (B, N)`` → ``(B, N + T)``, ``T <= max_new_tokens``.

    Greedy by default; ``do_sample`` samples with ``temperature``, ``top_k`` and ``top_p``
    (by default the model's ``generation_config`` values, else transformers' defaults: top-k
    50) applied by transformers' own warpers, from a generator seeded with ``seed``
    (default: the global one), so the tokens equal ``model.generate()``'s with the same
    settings after ``torch.manual_seed(seed)``. Generation stops at ``eos_token_id`` (one id
    or several; by default the model's ``generation_config.eos_token_id``; ``None``: never): a
    row that has ended is filled with ``pad_token_id`` (default: the generation config's, else
    the first EOS id), and the loop ends once every row has ended.

    ``attention_mask (B, N)`` takes left-padded prompts of different lengths (see
    :func:`prefill`): every row gets the tokens it gets alone. ``step`` is the decode step
    (``compile(model)``'s, or eager by default). A ``cache`` that already holds a sequence is
    continued: ``input_ids`` are the tokens that follow it."""
    require_transformed(model)
    require_int("max_new_tokens", max_new_tokens, 1)
    eos = _eos_ids(model, eos_token_id)
    pad = _pad_id(model, pad_token_id, eos)
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
    choose = _token_chooser(model, do_sample, sampling, input_ids.device)
    cache = new_cache(model) if cache is None else cache
    step = partial(decode_one_token, model) if step is None else step
    token = choose(input_ids, prefill(model, input_ids, cache, attention_mask=attention_mask))
    tokens = torch.cat([input_ids, token], dim=1)
    ended = _is_eos(token, eos)
    for _ in range(max_new_tokens - 1):
        if eos is not None and bool(ended.all()):
            break
        logits = step(token, None, cache)
        token = choose(tokens, logits)
        if eos is not None:
            token = torch.where(ended, pad, token)
            ended |= _is_eos(token, eos)
        tokens = torch.cat([tokens, token], dim=1)
    return tokens


def _eos_ids(model: nn.Module, eos_token_id) -> torch.Tensor | None:
    """The stop ids as a 1-d tensor, or ``None`` for no stop."""
    if eos_token_id is USE_MODEL_DEFAULT:
        generation_config = getattr(model, "generation_config", None)
        eos_token_id = getattr(generation_config, "eos_token_id", None)
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    for value in ids:
        require_int("eos_token_id", value, 0)
    return torch.tensor(ids) if ids else None


def _pad_id(model: nn.Module, pad_token_id, eos: torch.Tensor | None) -> int | None:
    if pad_token_id is None:
        generation_config = getattr(model, "generation_config", None)
        pad_token_id = getattr(generation_config, "pad_token_id", None)
    if pad_token_id is None and eos is not None:
        pad_token_id = int(eos[0])  # as transformers does when no pad id is set
    if pad_token_id is not None:
        require_int("pad_token_id", pad_token_id, 0)
    return pad_token_id


def _is_eos(token: torch.Tensor, eos: torch.Tensor | None) -> torch.Tensor:
    """``(B, 1)`` bool: the token is a stop id."""
    if eos is None:
        return torch.zeros_like(token, dtype=torch.bool)
    return torch.isin(token, eos.to(token.device))


def _sampling_default(model: nn.Module, name: str, value):
    """``value``, else the model's generation config's, else transformers' own default."""
    if value is None:
        value = getattr(getattr(model, "generation_config", None), name, None)
    return SAMPLING_DEFAULTS[name] if value is None else value


def _token_chooser(model: nn.Module, do_sample: bool, sampling: dict, device):
    """``choose(tokens (B, T), logits (B, vocab)) -> (B, 1)``: argmax, or a sample through
    transformers' temperature / top-k / top-p warpers."""
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample must be True or False, got {do_sample!r}")
    if not do_sample:
        given = [f"{name}={value!r}" for name, value in sampling.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} needs do_sample=True (decoding is greedy)")
        return lambda tokens, logits: logits.argmax(dim=-1, keepdim=True)
    temperature, top_k, top_p = (_sampling_default(model, name, sampling[name])
                                 for name in ("temperature", "top_k", "top_p"))  # fmt: skip
    warpers = LogitsProcessorList()
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(float(temperature)))
    if top_k:  # transformers' 0 means no top-k
        require_int("top_k", top_k, 1)
        warpers.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(float(top_p)))
    generator = None
    if sampling["seed"] is not None:
        require_int("seed", sampling["seed"], 0)
        generator = torch.Generator(device).manual_seed(sampling["seed"])

    def choose(tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(warpers(tokens, logits.float()), dim=-1)
        return torch.multinomial(probs, num_samples=1, generator=generator)

    return choose
