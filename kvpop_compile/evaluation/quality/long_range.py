"""Long-range positions: where the next bytes complete an identifier last seen long ago.

Inside the window every policy keeps every token, so positions whose prediction can be made
from recent text cannot tell policies apart. Eviction decides where the model must recall
something older: typing an identifier (a name, attribute or function) whose previous use lies
more than ``window`` tokens back. Those are the positions this module finds.

An identifier is a maximal run of ``[A-Za-z0-9_]`` bytes starting with a letter or ``_``, of at
least ``min_length`` bytes, that is not a Python keyword (keywords are completed from grammar,
not memory). For an occurrence at bytes ``[s, e)`` whose most recent earlier occurrence starts
at ``s'`` with ``s - s' > window``, the bytes ``s+1 .. e-1`` are long-range targets: once the
first byte is seen, completing the name is recall. The first byte is not counted: which name
comes next is not a question of memory alone. First occurrences are never counted.
"""

from __future__ import annotations

import keyword
import re

import torch

from ...config import require_int

_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORDS = frozenset(k.encode() for k in keyword.kwlist + keyword.softkwlist)


def long_range_targets(ids: torch.Tensor, window: int, min_length: int = 4) -> torch.Tensor:
    """Which bytes of ``ids`` are long-range targets: bool, same shape (N,) as ``ids``.

    ``ids`` holds byte tokens (0..255). Element ``j`` is True when byte ``j`` continues an
    identifier whose previous occurrence starts more than ``window`` bytes before this one.
    In teacher forcing, the logits at position ``j - 1`` predict byte ``j``.
    """
    if ids.dim() != 1:
        raise ValueError(f"ids must be one-dimensional, got shape {tuple(ids.shape)}")
    require_int("window", window, 0)
    require_int("min_length", min_length, 2)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > 255):
        raise ValueError("ids must be byte tokens in 0..255")
    data = bytes(ids.to(torch.uint8).tolist())
    mask = torch.zeros(ids.shape, dtype=torch.bool)
    last_start: dict[bytes, int] = {}
    for match in _IDENTIFIER.finditer(data):
        name, start, end = match.group(), match.start(), match.end()
        # A run that starts with a digit's tail (e.g. "0x1f") is matched from its letter; skip
        # names glued to a preceding digit so that number literals never count.
        if start > 0 and data[start - 1 : start].isdigit():
            continue
        if len(name) < min_length or name in _KEYWORDS:
            continue
        previous = last_start.get(name)
        if previous is not None and start - previous > window:
            mask[start + 1 : end] = True
        last_start[name] = start
    return mask
