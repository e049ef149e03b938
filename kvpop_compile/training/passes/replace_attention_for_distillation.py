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
from ...passes.pass_utils import clean_up, find_one_attention, pre_rope_key
from ..student_attention import StudentAttention

logger = logging.getLogger(__name__)


def replace_attention_for_distillation(gm: GraphModule, config: KVpopConfig) -> GraphModule:
    match = find_one_attention(gm)
    raw_key = pre_rope_key(match.key, getattr(gm, "kvpop_layer_idx", 0))
    gm.add_submodule("kvpop_student_attention", StudentAttention(config, match.scale))
    with gm.graph.inserting_before(match.output):
        student = gm.graph.call_module(
            "kvpop_student_attention", (match.query, match.key, match.value, raw_key)
        )
    student.meta = dict(match.output.meta)
    match.output.replace_all_uses_with(student)
    gm.graph.erase_node(match.output)
    logger.info("replace_attention_for_distillation: rewrote 1 attention site")
    return clean_up(gm, changed=True)
