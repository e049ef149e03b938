"""FX graph passes, one per file, each ``(gm: GraphModule, config) -> GraphModule``.

:data:`PASSES` is the order the inference rewrite runs in; :func:`run_passes` applies it.
Training uses ``insert_future_attention_target`` (scorer training) and
``replace_attention_for_distillation`` (the distillation student), each followed by
``remove_dead_code``, composed in :mod:`kvpop_compile.training.objectives`.
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
