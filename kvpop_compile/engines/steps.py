"""The decode and prefill steps as modules whose whole cache is explicit input and output: the
exported forms of :func:`~kvpop_compile.generation.decode_one_token` and
:func:`~kvpop_compile.generation.prefill` (one chunk).

``DecodeStep(token, *state) -> (logits, *state)``: one token per sequence; its position is read
from the cache (``seen``), so an engine needs nothing else. ``PrefillStep(input_ids, *state)``
runs a prompt of fixed length into the state, continuing what it holds. ``state`` is every layer's
:class:`BoundedCacheState` tensors, in layer then field order (:func:`state_names`).

Exporters that keep mutated state only as side effects lose it (ONNX drops in-place updates of
buffers); with ``functional=True`` the step clones its state inputs and returns the updated
copies, so the new cache is a real graph output. AOTInductor runs the in-place form.

Every input is exported, and run, in row-major strides (:func:`row_major`): a compiled step
indexes its inputs with the strides it was traced at, whatever the strides of the tensors it is
given: a column ``ids[:, i : i + 1]`` of a ``(B, N)`` prompt has strides ``(N, 1)``, and a
decode step traced at a fresh ``(B, 1)`` token would read row ``b`` of it at ``b``, not
``b * N``.
"""

from __future__ import annotations

from dataclasses import fields

import torch
from torch import nn

from ..kv_cache import KVpopCache
from ..runtime.cache import EMPTY_FILL, BoundedCacheState

STATE_FIELDS = [f.name for f in fields(BoundedCacheState)]


def state_names(num_layers: int) -> list[str]:
    return [f"layers.{i}.{name}" for i in range(num_layers) for name in STATE_FIELDS]


def empty_fill(name: str) -> float:
    """The value an empty cache holds in the state tensor called ``name``."""
    return EMPTY_FILL.get(name.rsplit(".", 1)[-1], 0)


def row_major_strides(shape) -> list[int]:
    """The strides ``torch.empty(shape)`` has: row-major, a size-0 or size-1 dimension counted
    as one element."""
    strides, step = [], 1
    for size in reversed(list(shape)):
        strides.append(step)
        step *= max(int(size), 1)
    return strides[::-1]


def row_major(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, copied into row-major strides unless it has them."""
    if list(tensor.stride()) == row_major_strides(tensor.shape):
        return tensor
    return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device).copy_(tensor)


def export_step(module: nn.Module, example: tuple, *, decompose: bool = False):
    """``torch.export`` of a step at ``example``'s shapes; with ``decompose``, the kvpop ops
    decomposed into aten ops, for runtimes that cannot call them (ONNX, TensorRT)."""
    with torch.no_grad():
        program = torch.export.export(module, example)
        if decompose:
            program = program.run_decompositions(decompose_custom_triton_ops=True)
    return program


def _cache_over(model: nn.Module, state: tuple[torch.Tensor, ...]) -> KVpopCache:
    per_layer = len(STATE_FIELDS)
    states = [BoundedCacheState(*state[i : i + per_layer]) for i in range(0, len(state), per_layer)]
    return KVpopCache.from_states(model.kvpop_config, states)


class _Step(nn.Module):
    def __init__(self, model: nn.Module, *, functional: bool):
        super().__init__()
        self.model = model
        self.functional = functional

    def _state(self, state):
        return tuple(t.clone() for t in state) if self.functional else state


class DecodeStep(_Step):
    """``token (B, 1) int64, *state -> logits (B, vocab) float32, *state``."""

    def forward(self, token: torch.Tensor, *state: torch.Tensor):
        state = self._state(state)
        cache = _cache_over(self.model, state)
        position = cache.layers[0].state.seen.view(-1, 1)  # each row's own length
        out = self.model(input_ids=token, position_ids=position, cache=cache, use_cache=True)
        return (out.logits[:, -1].float(), *state)


class PrefillStep(_Step):
    """``input_ids (B, P) int64, *state -> logits (B, vocab) float32, *state``: ``P`` tokens
    continue the sequence the state holds (an empty state starts one), as one chunk; only the
    last position's logits are computed."""

    def forward(self, input_ids: torch.Tensor, *state: torch.Tensor):
        state = self._state(state)
        cache = _cache_over(self.model, state)
        start = cache.layers[0].state.seen.view(-1, 1)  # each row's own length
        positions = start + torch.arange(input_ids.shape[1], device=input_ids.device)
        out = self.model(
            input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        return (out.logits[:, -1].float(), *state)
