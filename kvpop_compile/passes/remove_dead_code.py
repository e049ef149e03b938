"""remove_dead_code: drop what the rewrite left unused (softmax chains, repeat_kv copies)."""

from __future__ import annotations

import logging

from torch.fx import GraphModule, Node

from ..config import KVpopConfig
from .pass_utils import clean_up

logger = logging.getLogger(__name__)


def _has_effects(node: Node) -> bool:
    """Inputs, outputs, module calls and ops that mutate stay. Unlike FX's default, ops that only
    *may* draw random numbers (dropout) go when unused: in an inference graph nothing reads
    their noise."""
    if node.op in ("placeholder", "output", "call_module", "call_method"):
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is None or schema.is_mutable


def remove_dead_code(gm: GraphModule, config: KVpopConfig) -> GraphModule:
    before = len(gm.graph.nodes)
    gm.graph.eliminate_dead_code(is_impure_node=_has_effects)
    removed = before - len(gm.graph.nodes)
    logger.info("remove_dead_code: removed %d node(s)", removed)
    return clean_up(gm, changed=removed > 0)
