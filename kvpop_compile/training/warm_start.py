"""Start a training run's scorers from a saved scorer instead of a random draw.

Two starts are allowed:

- **the same kind** (``memory`` from ``memory``, ``mlp`` from ``mlp``): every tensor is loaded;
  training continues from it.
- **``memory`` from ``mlp``**: the memory scorer's readout MLP reads ``[k ; v ; read]`` where the
  ``mlp`` scorer reads ``[k ; v]``, with the same hidden width. Its weights on ``[k ; v]``, its
  biases and its output layer take the ``mlp``'s, and its weights on the memory read start at
  zero, so the memory scorer begins as exactly the ``mlp`` scorer; the memory's own projections
  keep their initial draw. Training then adjusts all of it, the ``mlp`` part included. Why: from
  a random start the memory scorer's result depends more on the draw than on anything else
  tried (see ``docs/design.md``).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..config import ScorerKind
from ..scorer_io import (
    check_shape,
    layer_tensors,
    load_layers,
    read_tensors,
    saved_config,
    saved_shape,
)


def check_start(path: str | os.PathLike, kind: ScorerKind) -> ScorerKind:
    """The kind of the scorer saved in ``path`` if a ``kind`` scorer can start from it, else
    ``ValueError`` (``FileNotFoundError`` if ``path`` is no saved scorer). Cheap: reads
    ``scorer.json`` only, so a run can check before it reads its data."""
    saved_kind = saved_config(path).scorer
    allowed = {kind, ScorerKind.MLP} if kind is ScorerKind.MEMORY else {kind}
    if saved_kind not in allowed:
        names = " or ".join(sorted(k.value for k in allowed))
        raise ValueError(
            f"init_from {os.fspath(path)!r} holds a {saved_kind.value!r} scorer; a "
            f"{kind.value!r} scorer can start from a saved {names} scorer"
        )
    return saved_kind


def warm_start(scorers: list[nn.Module], kind: ScorerKind, path: str | os.PathLike) -> None:
    """Load the saved scorer folder ``path`` into the per-layer ``scorers`` of kind ``kind`` (in
    place), as the module docstring says. Raises ``ValueError`` naming what does not match."""
    saved_kind = check_start(path, kind)
    first = scorers[0]
    have = {"num_layers": len(scorers), "num_kv_heads": first.num_kv_heads,
            "head_dim": first.head_dim}  # fmt: skip
    where = f"init_from {os.fspath(path)!r}"
    check_shape(saved_shape(path), have, where)
    tensors = read_tensors(path)
    try:
        if saved_kind is kind:
            load_layers(scorers, tensors)
            return
        for index, scorer in enumerate(scorers):
            _load_readout_from_mlp(scorer, layer_tensors(tensors, index), index)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


@torch.no_grad()
def _load_readout_from_mlp(scorer: nn.Module, layer: dict[str, torch.Tensor], index: int) -> None:
    """Layer ``index``'s ``mlp`` tensors into the memory ``scorer``'s readout: ``mlp.w1
    (H, 2D, hidden)`` into the first ``2D`` input features of ``readout.w1 (H, 2D + dv,
    hidden)``, whose last ``dv`` (the memory read's) are zeroed; ``b1 (H, hidden)``,
    ``w2 (H, hidden, 1)`` and ``b2 (H, 1)`` as they are."""
    readout = scorer.readout
    features = 2 * scorer.head_dim  # [k ; v]: the first input features of the readout's w1
    for name in ("w1", "b1", "w2", "b2"):
        saved = layer.get(f"mlp.{name}")
        if saved is None:
            raise ValueError(f"layer {index} has no mlp.{name} tensor")
        own = getattr(readout, name)
        target = own[:, :features] if name == "w1" else own
        if saved.shape != target.shape:
            raise ValueError(
                f"layer {index}'s mlp.{name} has shape {tuple(saved.shape)}, the scorer being "
                f"trained needs {tuple(target.shape)} (a different scorer_hidden?)"
            )
        if name == "w1":
            own.zero_()  # the memory read's features: zero, so the start is the mlp exactly
        target.copy_(saved)
