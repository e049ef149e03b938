"""Start a training run's scorers from a saved scorer instead of a random draw.

Two starts are allowed:

- **the same kind** (``memory`` from ``memory``, ``mlp`` from ``mlp``): every tensor is loaded;
  training continues from it.
- **``memory`` from ``mlp``**: the memory scorer's readout MLP reads ``[k ; v ; read]`` where the
  ``mlp`` scorer reads ``[k ; v]``, with the same hidden width. Its weights on ``[k ; v]`` and its
  biases and output layer take the ``mlp``'s, and its weights on the memory read start at zero, so
  the memory scorer begins as exactly the ``mlp`` scorer and training can only add what the
  memory tells. The memory's own projections keep their initial draw. Why: the memory scorer
  learns the same token-feature ranking the ``mlp`` does and more, but from a random start its
  result depends more on the draw than on anything else tried (see ``docs/design.md``).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..config import ScorerKind
from ..scorer_io import layer_tensors, load_layer, read_tensors, saved_config, saved_shape


def warm_start(scorers: list[nn.Module], kind: ScorerKind, path: str | os.PathLike) -> None:
    """Load the saved scorer folder ``path`` into the per-layer ``scorers`` of kind ``kind`` (in
    place), as the module docstring says. Raises ``ValueError`` naming what does not match."""
    saved_kind = saved_config(path).scorer
    allowed = {kind, ScorerKind.MLP} if kind is ScorerKind.MEMORY else {kind}
    if saved_kind not in allowed:
        names = " or ".join(sorted(k.value for k in allowed))
        raise ValueError(
            f"init_from {os.fspath(path)!r} holds a {saved_kind.value!r} scorer; a "
            f"{kind.value!r} scorer can start from a saved {names} scorer"
        )
    shape = saved_shape(path)
    first = scorers[0]
    have = {"num_layers": len(scorers), "num_kv_heads": first.num_kv_heads,
            "head_dim": first.head_dim}  # fmt: skip
    for key, value in have.items():
        if shape[key] != value:
            raise ValueError(
                f"init_from {os.fspath(path)!r} was saved for {key}={shape[key]}, the model "
                f"being trained has {value}"
            )
    tensors = read_tensors(path)
    for index, scorer in enumerate(scorers):
        layer = layer_tensors(tensors, index)
        if saved_kind is kind:
            load_layer(scorer, layer, index)
        else:
            _load_readout_from_mlp(scorer, layer, index)


def _check_shape(name: str, saved: torch.Tensor, own: torch.Tensor, index: int) -> None:
    if saved.shape != own.shape:
        raise ValueError(
            f"init_from: layer {index}'s {name} has shape {tuple(saved.shape)}, the scorer being "
            f"trained has {tuple(own.shape)} (a different scorer_hidden or memory size)"
        )


@torch.no_grad()
def _load_readout_from_mlp(scorer: nn.Module, layer: dict[str, torch.Tensor], index: int) -> None:
    readout = scorer.readout
    features = 2 * scorer.head_dim  # [k ; v]: the first rows of the readout's w1
    for name in ("w1", "b1", "w2", "b2"):
        saved = layer.get(f"mlp.{name}")
        if saved is None:
            raise ValueError(f"init_from: layer {index} has no mlp.{name} tensor")
        own = getattr(readout, name)
        target = own[:, :features] if name == "w1" else own
        _check_shape(f"mlp.{name}", saved, target, index)
        if name == "w1":
            own.zero_()  # the memory read's rows: zero, so the start is the mlp scorer exactly
        target.copy_(saved)
