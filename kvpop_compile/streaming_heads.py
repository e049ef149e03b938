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

Two conditions hold it: ``lam`` must stay a positive float32 number wherever the scorer runs
(with ``lam = 0`` every token of a streaming head ties and the oldest are kept; ``load_scorer``
refuses such a model), and positions must stay below 2^23, beyond which neighbouring positions
can round to one float32 priority. Training the scorer further gives the zeroed readouts
gradients again: choose streaming heads after training.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from .runtime.scorers.layers import PerHeadMLP
from .transform import require_transformed

# The smallest float32 ``lam`` that still orders positions: below it, ``lam`` rounds to 0 or to a
# subnormal that loses the order between neighbouring positions.
SMALLEST_LAM = torch.finfo(torch.float32).tiny


def require_recency(lam: float, what: str = "streaming heads need") -> None:
    """Raise ``ValueError`` unless ``lam`` is a finite float32 number of at least
    :data:`SMALLEST_LAM`, so that ``lam * t`` ranks a streaming head's tokens by position."""
    ok = isinstance(lam, (int, float)) and math.isfinite(lam)
    if not (ok and float(torch.tensor(float(lam), dtype=torch.float32)) >= SMALLEST_LAM):
        raise ValueError(
            f"{what} lam > 0 in float32 (at least {SMALLEST_LAM:.3g}), got lam={lam!r}: a head "
            "scored 0 ranks its tokens by lam * position, and with lam = 0 every token ties and "
            "the oldest are kept"
        )


def _readouts(model: nn.Module) -> list[PerHeadMLP]:
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
    """``heads`` as a sorted list of distinct ``(layer, kv_head)`` pairs of ints in range;
    ``ValueError`` naming the first bad entry otherwise."""
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise ValueError(f"heads must be a list of (layer, kv_head) pairs, got {heads!r}")
    heads = list(heads)
    if len(heads) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in heads):
        raise ValueError(
            f"heads must be a list of (layer, kv_head) pairs, got the pair {tuple(heads)} alone: "
            f"write [{tuple(heads)}]"
        )
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
        if (layer, kv_head) in pairs:
            raise ValueError(f"streaming heads name {(layer, kv_head)} twice")
        pairs.append((layer, kv_head))
    return sorted(pairs)


def make_streaming_heads(model: nn.Module, heads: Iterable) -> list[tuple[int, int]]:
    """Make ``heads`` of a transformed ``model`` streaming heads, in place.

    Args:
        model: a model transformed with a learned scorer (``memory`` or ``mlp``) and ``lam > 0``
            (:func:`require_recency`).
        heads: ``(layer, kv_head)`` pairs. Each such head's readout layer (``w2 (hidden, 1)``
            and ``b2 (1,)`` of its per-head MLP) is zeroed, so its scorer output is exactly 0
            and its pool keeps the most recent tokens; the other heads are unchanged.

    Returns:
        The pairs, sorted. ``ValueError`` for an untransformed model, a heuristic scorer, a
        ``lam`` that cannot order positions, or a bad pair (named).
    """
    config = require_transformed(model)
    require_recency(config.lam)
    readouts = _readouts(model)
    pairs = check_heads(heads, len(readouts), readouts[0].w2.shape[0])
    with torch.no_grad():
        for layer, kv_head in pairs:
            readouts[layer].w2[kv_head].zero_()
            readouts[layer].b2[kv_head].zero_()
    return pairs


def _zero_heads(w2: torch.Tensor, b2: torch.Tensor) -> list[int]:
    """The heads whose readout ``w2 (H, hidden, 1)`` and ``b2 (H, 1)`` are all zero."""
    return [head for head in range(w2.shape[0]) if not w2[head].any() and not b2[head].any()]


def streaming_heads(model: nn.Module) -> list[tuple[int, int]]:
    """The ``(layer, kv_head)`` pairs of a transformed ``model`` whose scorer output is 0 for
    every token (its readout layer, ``w2`` and ``b2``, is all zero), sorted; ``[]`` for a
    heuristic scorer, which has no readout."""
    require_transformed(model)
    if model.model.layers[0].self_attn.scorer.readout_mlp() is None:
        return []
    return [
        (layer, head)
        for layer, readout in enumerate(_readouts(model))
        for head in _zero_heads(readout.w2, readout.b2)
    ]


def saved_streaming_heads(tensors: dict[str, torch.Tensor]) -> list[tuple[int, int]]:
    """:func:`streaming_heads` of a saved scorer's ``tensors`` (``layers.<i>.<readout>.w2`` and
    ``.b2``, as ``scorer_io.read_tensors`` returns them), before they are loaded."""
    heads = []
    for name, w2 in tensors.items():
        parts = name.split(".")
        b2 = tensors.get(name[: -len("w2")] + "b2")
        if parts[0] == "layers" and parts[-1] == "w2" and b2 is not None and w2.dim() == 3:
            heads += [(int(parts[1]), head) for head in _zero_heads(w2, b2)]
    return sorted(heads)


def check_streaming_recency(heads: list[tuple[int, int]], lam: float) -> None:
    """Raise ``ValueError`` when a scorer has streaming ``heads`` and ``lam`` cannot order their
    tokens (:func:`require_recency`): those heads would keep the oldest tokens."""
    if heads:
        require_recency(lam, f"this scorer has streaming heads {heads}, which need")
