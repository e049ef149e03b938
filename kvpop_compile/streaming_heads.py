"""Streaming heads: KV heads whose bounded cache keeps the most recent tokens, not scored ones.

A bounded cache splits each KV head's capacity into ``sinks``, a ``window`` of the most recent
tokens and a pool of the ``topk`` older tokens of highest priority ``rhat + lam * t``
(docs/design.md §2). Heads differ in what they need: some read the last few hundred tokens for
ordinary text, others look far back for a line a question asks about. One window for all heads
forces one split of the capacity between the two, and a wide window that ordinary text needs
leaves a retrieval head too small a pool.

:func:`make_streaming_heads` gives chosen ``(layer, kv_head)`` pairs a learned scorer output of
exactly 0 by zeroing that head's readout layer (the last linear layer of its per-head MLP). With
``lam > 0`` such a head's pool then ranks tokens by position alone and keeps the newest: the head
holds its sinks and the ``capacity - sinks`` most recent tokens, as StreamingLLM's window does,
while every other head keeps its learned pool. The change is in the weights, so it needs nothing
of the kernels, the exporters or a saved scorer's format: ``save_scorer`` saves it and every
execution path runs it. Which heads to make streaming is a choice measured on validation data
(``scripts/choose_streaming_heads.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .transform import require_transformed


def _readouts(model: nn.Module) -> list[nn.Module]:
    """Each layer's scorer's readout (a ``PerHeadMLP``), refusing scorers that have none."""
    config = require_transformed(model)
    readouts = []
    for layer in model.model.layers:
        readout = layer.self_attn.scorer.readout_mlp()
        if readout is None:
            raise ValueError(
                f"streaming heads need a learned scorer (memory or mlp); this model's scorer is "
                f"{str(config.scorer.value)!r}, whose scores are not learned"
            )
        readouts.append(readout)
    return readouts


def check_heads(heads: Iterable, num_layers: int, num_kv_heads: int) -> list[tuple[int, int]]:
    """``heads`` as a sorted list of distinct ``(layer, kv_head)`` pairs of ints in range."""
    pairs = []
    for head in heads:
        ok = (
            isinstance(head, (tuple, list))
            and len(head) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) for i in head)
        )
        if not ok:
            raise ValueError(
                f"each streaming head must be a (layer, kv_head) pair of ints, got {head!r}"
            )
        layer, kv_head = head
        if not (0 <= layer < num_layers and 0 <= kv_head < num_kv_heads):
            raise ValueError(
                f"streaming head {tuple(head)} is out of range: layers 0..{num_layers - 1}, "
                f"KV heads 0..{num_kv_heads - 1}"
            )
        pairs.append((layer, kv_head))
    if len(set(pairs)) != len(pairs):
        raise ValueError(f"streaming heads repeat a pair: {pairs}")
    return sorted(pairs)


def make_streaming_heads(model: nn.Module, heads: Iterable) -> list[tuple[int, int]]:
    """Make ``heads`` of a transformed ``model`` streaming heads, in place; returns them sorted.

    Args:
        model: a model transformed with a learned scorer (``memory`` or ``mlp``) and ``lam > 0``.
        heads: ``(layer, kv_head)`` pairs. Each such head's scorer output becomes exactly 0, so
            its pool keeps the most recent tokens; the other heads are unchanged.
    """
    config = require_transformed(model)
    if not config.lam > 0:
        raise ValueError(
            f"streaming heads need lam > 0, got lam={config.lam}: a head scored 0 ranks its "
            "tokens by lam * position, and with lam = 0 every token ties and the oldest are kept"
        )
    readouts = _readouts(model)
    pairs = check_heads(heads, len(readouts), readouts[0].w2.shape[0])
    with torch.no_grad():
        for layer, kv_head in pairs:
            readouts[layer].w2[kv_head].zero_()
            readouts[layer].b2[kv_head].zero_()
    return pairs


def streaming_heads(model: nn.Module) -> list[tuple[int, int]]:
    """The ``(layer, kv_head)`` pairs of a transformed ``model`` whose scorer output is 0 for
    every token (its readout layer is all zero), sorted."""
    return [
        (layer, kv_head)
        for layer, readout in enumerate(_readouts(model))
        for kv_head in range(readout.w2.shape[0])
        if not readout.w2[kv_head].any() and not readout.b2[kv_head].any()
    ]
