"""replace_attention_for_distillation: the student's attention sees only what KVpop keeps.

Each attention site becomes a :class:`StudentAttention` call on the query, the un-repeated keys
and values and the pre-RoPE keys. Unlike the inference rewrite, there is no cache: the whole
sequence runs at once under the running-top-k mask, differentiably. As with ``replace_attention``
and ``insert_scorer``, the module gets its scorer afterwards: the distillation objective gives
it the layer's scorer, shared with the teacher's training graph.
"""

from __future__ import annotations

import logging

from torch.fx import GraphModule

from ...config import KVpopConfig
from ...passes.insert_scorer import find_pre_rope
from ...passes.replace_attention import NoAttentionFoundError, find_attention
from ..student_attention import StudentAttention

logger = logging.getLogger(__name__)


def replace_attention_for_distillation(gm: GraphModule, config: KVpopConfig) -> GraphModule:
    matches = [m for m in map(find_attention, gm.graph.nodes) if m is not None]
    if len(matches) != 1:
        raise NoAttentionFoundError(f"expected one attention in the graph, found {len(matches)}")
    match = matches[0]
    raw_key = find_pre_rope(match.key)
    if raw_key is None:
        raise ValueError("the attention's keys do not come from a rotary embedding")
    gm.add_submodule("kvpop_student_attention", StudentAttention(config, match.scale))
    with gm.graph.inserting_before(match.output):
        student = gm.graph.call_module(
            "kvpop_student_attention", (match.query, match.key, match.value, raw_key)
        )
    student.meta = dict(match.output.meta)
    match.output.replace_all_uses_with(student)
    gm.graph.erase_node(match.output)
    logger.info("replace_attention_for_distillation: rewrote 1 attention site")
    gm.graph.lint()
    gm.recompile()
    return gm
