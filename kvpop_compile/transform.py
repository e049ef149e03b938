"""``transform(model, config)``: turn a Hugging Face Qwen3 model into one with a bounded cache.

Each decoder layer's attention is captured as a graph, rewritten by the passes of
:mod:`kvpop_compile.passes`, and swapped into that layer instance. A forward pre-hook on the
decoder stack hands every forward (and so ``generate()``) a :class:`KVpopCache` when it has
none.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from transformers.cache_utils import Cache

from .capture import capture_attention
from .config import KVpopConfig
from .kv_cache import CACHE_ARGUMENT, CACHE_ARGUMENTS, KVpopCache
from .modeling import KVpopAttention
from .passes import run_passes

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
SUPPORTED_ATTENTION = ("sdpa", "eager")
# The cache's place among the decoder stack's positional arguments (input_ids, attention_mask,
# position_ids, cache), the same in every supported transformers release.
CACHE_POSITION = 3


def _is_compiled(model: nn.Module) -> bool:
    return isinstance(model, torch._dynamo.eval_frame.OptimizedModule) or (
        getattr(model, "_compiled_call_impl", None) is not None
    )


def check_transformable(model: nn.Module, config: KVpopConfig) -> None:
    """Raise unless ``transform(model, config)`` can run: ``config`` is a KVpopConfig and
    ``model`` an uncompiled, untransformed Qwen3 / Qwen3-MoE causal LM without sliding-window
    attention, whose positions cover the capacity. Scorer training asks the same of its model."""
    if not isinstance(config, KVpopConfig):
        raise TypeError(f"config must be a KVpopConfig, got {type(config).__name__}")
    if _is_compiled(model):
        raise ValueError(
            "the model is already compiled: call kvpop_compile.transform on the uncompiled "
            "model, then kvpop_compile.compile on the result"
        )
    if getattr(model, "kvpop_config", None) is not None:
        raise ValueError(
            "the model is already transformed by kvpop_compile; load a fresh model to transform "
            "it with another config"
        )
    hf_config = getattr(model, "config", None)
    model_type = getattr(hf_config, "model_type", None)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if model_type not in SUPPORTED_MODEL_TYPES or layers is None:
        supported = ", ".join(SUPPORTED_MODEL_TYPES.values())
        raise ValueError(
            f"{type(model).__name__} (model_type {model_type!r}) has no Qwen3-style attention; "
            f"kvpop_compile.transform supports {supported}"
        )
    if getattr(hf_config, "use_sliding_window", False) or "sliding_attention" in (
        getattr(hf_config, "layer_types", None) or ()
    ):
        raise ValueError(
            "the model uses sliding-window attention, which KVpop replaces with its own bounded "
            "cache; load it with use_sliding_window=False"
        )
    implementation = hf_config._attn_implementation
    if implementation not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"attn_implementation {implementation!r} is not supported; load the model with "
            f"attn_implementation='sdpa' or 'eager'"
        )
    config.check_layers(hf_config.num_hidden_layers)
    if config.max_capacity > hf_config.max_position_embeddings:
        raise ValueError(
            f"capacity {config.max_capacity} (sinks + window + topk) exceeds the model's "
            f"max_position_embeddings {hf_config.max_position_embeddings}; lower topk or window"
        )


def require_transformed(model: nn.Module, when: str = "first") -> KVpopConfig:
    """The ``KVpopConfig`` ``model`` was transformed with; a ``ValueError`` saying to call
    :func:`transform` (``when``: "first", "before exporting it") if it was not."""
    config = getattr(model, "kvpop_config", None)
    if config is None:
        raise ValueError(
            f"{type(model).__name__} is not transformed: call kvpop_compile.transform(model) {when}"
        )
    return config


class BoundedCacheHook:
    """Forward pre-hook on the decoder stack (``model.model``): give every forward a KVpopCache
    unless it has one, and tell it which of the forward's tokens are left padding (KVpop
    attention is causal; it honours a 2-D mask that left-pads rows to one length and refuses
    any other). A plain class, so a transformed model pickles and deep-copies without holding
    on to the original."""

    def __init__(self, num_layers: int, config: KVpopConfig):
        self.num_layers = num_layers
        self.config = config

    @staticmethod
    def _row_padding(mask, length: int) -> list[int] | None:
        """Per row, how many of the forward's ``length`` new tokens are padding (``None``: no
        padding), from the mask over every column so far."""
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise ValueError(
                "KVpop attention is causal and ignores custom or prepared attention masks; pass "
                "a 2-D attention_mask (1: token, 0: left padding) or none, and keep generate()'s "
                "default cache_implementation"
            )
        if mask.shape[1] < length:
            raise ValueError(
                f"attention_mask covers {mask.shape[1]} columns, fewer than the {length} tokens "
                "of this forward; pass the mask of every column so far"
            )
        mask = mask != 0
        if bool(mask.all()):
            return None
        if bool((mask[:, 1:] < mask[:, :-1]).any()):
            row = int((mask[:, 1:] < mask[:, :-1]).any(dim=1).nonzero()[0])
            raise ValueError(
                f"attention_mask row {row} has padding after a token: KVpop takes left padding "
                "only (tokenizer padding_side='left')"
            )
        if not bool(mask[:, 0].any()):
            raise ValueError(
                "attention_mask pads every row at its first column: drop the columns that are "
                "padding in every row"
            )
        padding = (length - mask[:, -length:].sum(dim=1)).tolist()
        return padding if any(padding) else None

    @staticmethod
    def _check_cache(cache) -> None:
        # generate(cache_implementation="static", ...) hands over a fixed-size transformers cache
        # (and the 4-D mask that goes with it): say what to do instead of failing on the mask.
        if isinstance(cache, Cache) and not isinstance(cache, KVpopCache) and cache.is_compileable:
            raise ValueError(
                f"a transformed model keeps its KV state in a KVpopCache, not a "
                f"{type(cache).__name__} (generate()'s cache_implementation='static' and its "
                "variants): the KVpopCache is already fixed-size, so call generate() without "
                "cache_implementation, and compile the decode step with kvpop_compile.compile"
            )

    @staticmethod
    def _length(args, kwargs) -> int:
        """How many tokens the forward runs: columns of its ids or embeddings."""
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        return ids.shape[1]

    @staticmethod
    def _given_cache(args, kwargs):
        """The cache the forward was handed under either name, moved to the name this
        transformers' forward takes: under the other one it would reach the layers while the
        model counted positions as if there were no cache."""
        if len(args) > CACHE_POSITION:  # passed positionally, in its own place
            return args[CACHE_POSITION]
        given = [kwargs.pop(name) for name in CACHE_ARGUMENTS if name in kwargs]
        cache = next((value for value in given if value is not None), None)
        kwargs[CACHE_ARGUMENT] = cache
        return cache

    def __call__(self, module, args, kwargs):
        cache = self._given_cache(args, kwargs)
        self._check_cache(cache)
        mask = kwargs["attention_mask"] if "attention_mask" in kwargs else (
            args[1] if len(args) > 1 else None)  # fmt: skip
        padding = self._row_padding(mask, self._length(args, kwargs))
        if isinstance(cache, KVpopCache):
            cache.row_padding = padding
            return args, kwargs
        if kwargs.get("use_cache") is False and padding is None:
            return args, kwargs  # each layer attends within the forward alone
        if cache is not None and int(cache.get_seq_length()) > 0:
            raise TypeError(
                f"a transformed model keeps its KV state in a KVpopCache, got a filled "
                f"{type(cache).__name__}; pass the KVpopCache a previous forward returned"
            )
        # A forward without a cache (use_cache=False) but with padding gets a fresh one too:
        # the cache is where the layers find which tokens are padding.
        fresh = KVpopCache(self.num_layers, self.config)
        fresh.row_padding = padding
        if len(args) > CACHE_POSITION:
            return (*args[:CACHE_POSITION], fresh, *args[CACHE_POSITION + 1 :]), kwargs
        kwargs[CACHE_ARGUMENT] = fresh
        return args, kwargs


class ChunkedGenerate:
    """A transformed model's ``generate()``: transformers' own, which prefills a long prompt in
    chunks of ``KVpopConfig.chunk_length`` that each continue the bounded cache exactly, so
    memory does not grow with the prompt. A plain class holding the model, so the model still
    pickles and deep-copies.

    transformers chunks a prompt by its token ids and only into a cache: a prompt given as
    ``inputs_embeds``, or a generation with ``use_cache=False`` (which runs the whole sequence
    through the bounded attention at every step), is prefilled in one forward instead. A
    ``prefill_chunk_size`` the caller passes is used as given."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __call__(self, *args, **kwargs):
        generation_config = kwargs.get("generation_config")
        chosen = "prefill_chunk_size" in kwargs or (
            generation_config is not None and generation_config.prefill_chunk_size is not None
        )
        if not chosen:
            whole = kwargs.get("inputs_embeds") is not None or kwargs.get("use_cache") is False
            chunk = None if whole else self.model.kvpop_config.chunk_length
            kwargs["prefill_chunk_size"] = chunk
        return type(self.model).generate(self.model, *args, **kwargs)


class RefusedSavePretrained:
    """A transformed model's ``save_pretrained``: refused, because ``from_pretrained`` would
    load the saved folder as the plain model and drop the trained scorer without an error."""

    def __init__(self, model_class: str):
        self.model_class = model_class

    def __call__(self, *args, **kwargs):
        raise ValueError(
            "save_pretrained is not supported on a model transformed by kvpop_compile: "
            f"{self.model_class}.from_pretrained would drop its scorer. Save the scorer with "
            "kvpop_compile.save_scorer(model, folder) and the model before transforming it "
            "(transform leaves its weights as they are); reload with from_pretrained, "
            "kvpop_compile.transform(model, kvpop_compile.scorer_io.saved_config(folder)) and "
            "kvpop_compile.load_scorer(model, folder)"
        )


def transform(model: nn.Module, config: KVpopConfig | None = None) -> nn.Module:
    """Rewrite every attention of a Qwen3 / Qwen3-MoE causal LM into KVpop bounded attention.

    The model is changed in place and returned. Its ``forward`` and ``generate()`` then keep at
    most ``config.capacity`` tokens per layer and KV head (layer ``i``
    ``config.layer(i).capacity`` under a per-layer budget); scorer parameters live in
    ``model.model.layers[i].self_attn.scorer``.
    """
    config = KVpopConfig() if config is None else config
    check_transformable(model, config)
    hf_config = model.config
    for index, layer in enumerate(model.model.layers):
        attention = layer.self_attn
        graph = capture_attention(
            attention, hidden_size=hf_config.hidden_size, head_dim=attention.head_dim
        )
        budget = config.layer(index)  # the layer's own under a per-layer budget
        graph = run_passes(graph, budget)
        layer.self_attn = KVpopAttention(attention, graph, budget).train(attention.training)
    model.kvpop_config = config
    # Instance attributes, so the class and the saved generation config stay the original's.
    model.generate = ChunkedGenerate(model)
    model.save_pretrained = RefusedSavePretrained(type(model).__name__)
    hook = BoundedCacheHook(hf_config.num_hidden_layers, config)
    model.model.register_forward_pre_hook(hook, with_kwargs=True)
    logger.info("transform: %d layers now use KVpop bounded attention", len(model.model.layers))
    return model
