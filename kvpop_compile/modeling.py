"""``KVpopAttention``: what a transformed model's decoder layers call instead of their attention.

It runs the attention's rewritten graph (projections, norms and RoPE exactly as captured, the
attention itself replaced by bounded attention) against the layer's state in the
:class:`KVpopCache` it is handed. The module is swapped into each layer instance; no transformers
class is modified.

The original attention's projections and norms stay registered under their own names, so the
model's ``state_dict`` keys (and ``save_pretrained`` files) are those of the original model,
plus ``self_attn.scorer.*``. The graph reads the very same parameters.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.fx import GraphModule
from transformers.cache_utils import Cache

from .config import KVpopConfig
from .kv_cache import KVpopCache
from .runtime.bounded_attention import BoundedAttention
from .runtime.cache import BoundedCacheState


class KVpopAttention(nn.Module):
    """Drop-in for a Qwen3 attention: ``forward(hidden (B, N, hidden), (cos, sin), ...)``."""

    def __init__(self, attention: nn.Module, graph: GraphModule, config: KVpopConfig):
        super().__init__()
        for name, child in attention.named_children():
            self.add_module(name, child)  # the parameters the graph reads
        self.scorer = graph.kvpop_attention_0.scorer
        # Not a registered submodule: its parameters are registered above already.
        self.__dict__["graph"] = graph
        self.layer_idx = attention.layer_idx
        self.head_dim = attention.head_dim
        self.kvpop_config = config
        # The capture recorded the casts of this dtype (q_norm, k_norm): it is the only one the
        # graph computes correctly.
        self.graph_dtype = next(attention.parameters()).dtype

    @property
    def bounded(self) -> BoundedAttention:
        return self.graph.kvpop_attention_0

    def _state(self, cache, hidden_states: torch.Tensor) -> BoundedCacheState:
        """The state to run against: the layer's in ``cache``, or a temporary empty one for a
        forward without a cache."""
        kwargs = {
            "batch": hidden_states.shape[0],
            "head_dim": self.head_dim,
            "dtype": hidden_states.dtype,
            "device": hidden_states.device,
        }
        if cache is None:
            return BoundedCacheState.empty(self.kvpop_config, self.scorer, **kwargs)
        if not isinstance(cache, KVpopCache):
            kind = type(cache).__name__ if isinstance(cache, Cache) else repr(cache)
            raise TypeError(
                f"KVpop attention keeps its state in a KVpopCache, got {kind}; call the model "
                "(it supplies one) or pass cache=kvpop_compile.new_cache(model)"
            )
        # The identity test first: under compilation, after other models' steps were compiled
        # in the process, the configs' integers may be symbolic and not comparable by value.
        layer = cache.layers[self.layer_idx]
        if layer.config is not self.kvpop_config and layer.config != self.kvpop_config:
            raise ValueError(
                f"this KVpopCache was made for {cache.config}, the model is transformed with "
                f"{self.kvpop_config} in layer {self.layer_idx}; use "
                "kvpop_compile.new_cache(model)"
            )
        return layer.state_for(self.scorer, **kwargs)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache=None,
        past_key_values=None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        if self.training:
            raise RuntimeError(
                "a transformed model runs inference only (its bounded cache is not "
                "differentiable): call model.eval(); scorers are trained on the original model"
            )
        if hidden_states.dtype != self.graph_dtype:
            raise ValueError(
                f"the model was transformed in {self.graph_dtype} and now runs in "
                f"{hidden_states.dtype}; change the dtype before kvpop_compile.transform"
            )
        # The graph was captured with one rotary row per sequence; transformers may pass one
        # row for the whole batch.
        batch = hidden_states.shape[0]
        cos, sin = (table.expand(batch, -1, -1) for table in position_embeddings)
        cache = cache if cache is not None else past_key_values
        state = self._state(cache, hidden_states)
        # One token is a decode step; several are a prefill chunk, which continues whatever
        # the cache holds (an empty cache, a chunk of a long prompt, or a continued
        # conversation) with the chunked rule.
        padding = cache.row_padding if isinstance(cache, KVpopCache) else None
        if padding is None:
            return self.graph(hidden_states, cos, sin, *state.tensors())[0], None
        return self._rows_without_padding(hidden_states, cos, sin, state, padding), None

    def _rows_without_padding(self, hidden_states, cos, sin, state, padding: list[int]):
        """The forward of a batch whose rows start with ``padding[b]`` pad tokens: each row's
        tokens alone through the graph, against its row of the cache (views: the graph updates
        the batch's state in place). Padding is never cached or scored; its outputs are 0."""
        out = torch.zeros_like(hidden_states)
        for row, pad in enumerate(padding):
            if pad == hidden_states.shape[1]:
                continue  # nothing but padding in this row yet
            tokens = slice(pad, None)
            row_state = (tensor[row : row + 1] for tensor in state.tensors())
            out[row : row + 1, tokens] = self.graph(
                hidden_states[row : row + 1, tokens],
                cos[row : row + 1, tokens],
                sin[row : row + 1, tokens],
                *row_state,
            )[0]
        return out
