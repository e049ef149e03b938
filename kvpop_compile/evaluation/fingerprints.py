"""SHA-256 fingerprints of what a saved result depends on, so that a resumed run can tell a
saved row of the same model and items from one of another (a name or a path says neither: the
embedded model keeps its name when it is retrained, and recall items change with their
generator)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import nn

from ..embedded.recall import RecallItem


def weights_sha256(model: nn.Module) -> str:
    """Digest of ``model``'s parameters and buffers: names, dtypes, shapes and bytes, in
    ``state_dict`` order (the same weights give the same digest on any device)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())  # any dtype, bfloat16 too
    return digest.hexdigest()


def items_sha256(items: Iterable[RecallItem]) -> str:
    """Digest of the prompts and answers of ``items``, in order."""
    digest = hashlib.sha256()
    for item in items:
        for part in (item.prompt, item.answer):
            digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()
