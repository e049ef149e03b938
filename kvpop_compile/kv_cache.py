"""``KVpopCache``: the bounded caches of all layers behind transformers' ``Cache`` interface.

``generate()`` and the model's forward see an ordinary cache object; the KVpop attention of each
layer reads and writes its :class:`BoundedCacheState` in place. Its size is fixed once created:
``nbytes`` is the same after 50 tokens as after 50,000.
"""

from __future__ import annotations

import inspect
from dataclasses import fields

import torch
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.models.qwen3.modeling_qwen3 import Qwen3Model

from .config import KVpopConfig
from .runtime.cache import BoundedCacheState
from .runtime.scorers.base import Scorer


def _cache_argument() -> str:
    """The keyword under which this transformers' Qwen3 forward takes its cache.

    Releases up to 5.19 call it ``past_key_values``; later ones call it ``cache`` and map the
    old name onto it with a deprecation warning. Passed under a name the forward does not know,
    the cache rides along in ``**kwargs`` to the attention layers while the model counts the
    positions of a cache-less forward, from 0: the name must be the model's own."""
    parameters = inspect.signature(Qwen3Model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


CACHE_ARGUMENT = _cache_argument()
# Both names a caller may use for the cache, this transformers' own first.
CACHE_ARGUMENTS = tuple(dict.fromkeys((CACHE_ARGUMENT, "cache", "past_key_values")))


def cache_kwargs(cache: Cache | None) -> dict[str, Cache | None]:
    """``{name: cache}`` for a model call, under the name this transformers' forward takes:
    ``model(input_ids=ids, **cache_kwargs(cache), use_cache=True)``."""
    return {CACHE_ARGUMENT: cache}


class KVpopLayer(CacheLayerMixin):
    """One layer's bounded cache; the state is allocated at the layer's first forward."""

    is_sliding = False
    is_compileable = False  # the compiled decode step is kvpop_compile.compile's, not generate's

    def __init__(self, config: KVpopConfig):
        super().__init__()
        self.config = config
        self.state: BoundedCacheState | None = None

    def lazy_initialization(self, key_states, value_states) -> None:
        raise TypeError("a KVpop cache layer is allocated by KVpop attention, not by update()")

    def update(self, key_states, value_states, *args, **kwargs):
        raise TypeError(
            "KVpopCache is written by KVpop attention; update() is not supported (was the model "
            "transformed with kvpop_compile.transform?)"
        )

    def state_for(
        self, scorer: Scorer, *, batch: int, head_dim: int, dtype: torch.dtype, device
    ) -> BoundedCacheState:
        """This layer's state, allocated on first use for ``batch`` sequences."""
        if self.state is None:
            self.state = BoundedCacheState.empty(
                self.config, scorer, batch=batch, head_dim=head_dim, dtype=dtype, device=device
            )
            self.is_initialized = True
        elif self.state.keys.shape[0] != batch:
            raise ValueError(
                f"this KVpopCache holds {self.state.keys.shape[0]} sequences, got a batch of "
                f"{batch}; use a new cache for a new batch"
            )
        return self.state

    def get_seq_length(self):
        # The columns run so far, which transformers counts with the padding: the longest row's
        # tokens (a left-padded batch's longest row has none). A 0-d tensor, like transformers'
        # static layers: no host sync and no recompilation.
        return self.state.seen.max() if self.state is not None else 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # KVpop attention builds its own causal, eviction-aware masking and ignores the model's
        # mask; keep that mask the size of the query so it never grows with the sequence.
        return query_length, 0

    def get_max_length(self) -> int:
        return -1  # generation length is unbounded; memory is bounded by capacity instead

    def reset(self) -> None:
        if self.state is not None:
            self.state.reset_()

    def _select_rows(self, rows: torch.Tensor) -> None:
        """Replace the batch by ``rows`` of it (a reorder, repeat or subset)."""
        if self.state is None:
            return
        for f in fields(self.state):  # every field has the batch first
            tensor = getattr(self.state, f.name)
            setattr(self.state, f.name, tensor.index_select(0, rows.to(tensor.device)))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select_rows(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.state is not None:
            batch = self.state.keys.shape[0]
            self._select_rows(torch.arange(batch).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._select_rows(indices)


class KVpopCache(Cache):
    """Bounded KV caches for ``num_layers`` layers under one :class:`KVpopConfig` (layer ``i``
    at ``config.layer(i)``, its own budget under a per-layer one)."""

    def __init__(self, num_layers: int, config: KVpopConfig):
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        config.check_layers(num_layers)
        super().__init__(layers=[KVpopLayer(config.layer(i)) for i in range(num_layers)])
        self.config = config
        # Per row, how many of the current forward's leading tokens are left padding, which no
        # layer may write (set by the transformed model's forward hook from the attention
        # mask); None when the forward has no padding.
        self.row_padding: list[int] | None = None

    @classmethod
    def from_states(cls, config: KVpopConfig, states: list[BoundedCacheState]) -> KVpopCache:
        """A cache over existing layer states (e.g. an exported step's state inputs); a forward
        continues the sequence they hold."""
        cache = cls(len(states), config)
        for layer, state in zip(cache.layers, states, strict=True):
            layer.state = state
            layer.is_initialized = True
        return cache

    def next_positions(self, batch: int, device) -> torch.Tensor:
        """``(batch,)`` int64 position of each row's next token: the tokens its row holds (0 for
        a cache no forward has written yet). Read on the device, no host synchronisation."""
        state = self.layers[0].state
        if state is None:
            return torch.zeros(batch, dtype=torch.int64, device=device)
        return state.seen

    @property
    def nbytes(self) -> int:
        """Bytes held by all layers' caches (scorer state included)."""
        return sum(layer.state.nbytes for layer in self.layers if layer.state is not None)


def cache_bytes(cache: Cache) -> int:
    """Bytes of KV state ``cache`` holds: a KVpopCache's fixed buffers (positions, priorities
    and scorer state included), or the keys and values of transformers' dynamic or static
    caches."""
    if isinstance(cache, KVpopCache):
        return cache.nbytes
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
