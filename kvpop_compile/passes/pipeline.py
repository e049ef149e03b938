"""The inference rewrite's pass list, written once: :data:`PASSES` in the order they run, and
:func:`run_passes`, which applies them."""

from __future__ import annotations

from torch.fx import GraphModule

from ..config import KVpopConfig
from .insert_scorer import insert_scorer
from .remove_dead_code import remove_dead_code
from .replace_attention import replace_attention

PASSES = [replace_attention, insert_scorer, remove_dead_code]


def run_passes(gm: GraphModule, config: KVpopConfig) -> GraphModule:
    for graph_pass in PASSES:
        gm = graph_pass(gm, config)
    return gm
