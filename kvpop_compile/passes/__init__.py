"""FX graph passes, one per file, each ``(gm: GraphModule, config) -> GraphModule``.

:data:`PASSES` is the order they run in; :func:`run_passes` applies it.
"""

from __future__ import annotations

from torch.fx import GraphModule

from ..config import KVpopConfig
from .insert_scorer import insert_scorer
from .remove_dead_code import remove_dead_code
from .replace_attention import NoAttentionFoundError, replace_attention

PASSES = [replace_attention, insert_scorer, remove_dead_code]


def run_passes(gm: GraphModule, config: KVpopConfig) -> GraphModule:
    for graph_pass in PASSES:
        gm = graph_pass(gm, config)
    return gm


__all__ = [
    "PASSES",
    "NoAttentionFoundError",
    "insert_scorer",
    "remove_dead_code",
    "replace_attention",
    "run_passes",
]
