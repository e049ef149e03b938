"""SHA-256 fingerprints of what a saved file depends on: a model's weights and a list of items.

A name or a path says neither (the embedded model keeps its name when it is retrained, and
recall items change with their generator), so an engine's manifest, a resumed benchmark run and
a results file record these digests, and whoever reads them compares them with the model and
items at hand. The one :func:`weights_sha256` serves all of them: the digests in
``benchmarks/results/`` and engine manifests of version 4 on are its digests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import nn


def weights_sha256(model: nn.Module) -> str:
    """Digest of ``model``'s parameters and buffers (a transformed model's scorers included):
    names, dtypes, shapes and bytes, in ``state_dict`` order (the same weights give the same
    digest on any device)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())  # any dtype, bfloat16 too
    return digest.hexdigest()


def items_sha256(items: Iterable) -> str:
    """Digest of the ``prompt`` and ``answer`` bytes of ``items`` (recall items,
    :class:`~kvpop_compile.embedded.recall.RecallItem`), in order."""
    digest = hashlib.sha256()
    for item in items:
        for part in (item.prompt, item.answer):
            digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()
