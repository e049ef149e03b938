"""insert_future_attention_target: turn a captured attention into scorer training's teacher.

The teacher keeps full causal attention, computed by ``kvpop::masked_attention`` so that each
query's log-sum-exp comes out with the output. After the attention site the pass inserts
``kvpop::future_attention_target`` (the transposed-attention pass: keys as queries, O(N d)
memory, never an N x N map). The graph then returns ``(attention output, pre-RoPE keys,
values, log target, valid)``: the output the model continues with, and what the layer's
:class:`~kvpop_compile.training.scorer_loss.ScorerLoss` takes, which the training objective
owns (so the pass, like every pass, depends on the ``KVpopConfig`` alone). The graph's
``kvpop_target`` attribute, when the objective sets one, chooses the target's reduction over
later queries (``"mean"``, the default, ``"max"`` or ``"power_mean"``, whose power
``kvpop_target_power`` gives), as ``kvpop_layer_idx`` names its layer.
"""

from __future__ import annotations

import logging
import operator

import torch
from torch.fx import GraphModule

from ...config import KVpopConfig
from ...passes.pass_utils import clean_up, find_one_attention, pre_rope_key
from ...runtime import ops  # noqa: F401  (registers the kvpop ops)

logger = logging.getLogger(__name__)

# Query rows per block of the teacher attention and of the target pass.
TEACHER_BLOCK = 128
TARGET_BLOCK = 64


def insert_future_attention_target(gm: GraphModule, config: KVpopConfig) -> GraphModule:
    layer = getattr(gm, "kvpop_layer_idx", 0)
    aggregate = getattr(gm, "kvpop_target", "mean")
    power = getattr(gm, "kvpop_target_power", 1.0)  # checked, as given, by the op
    match = find_one_attention(gm)
    raw_key = pre_rope_key(match.key, layer)
    graph = gm.graph
    kvpop = torch.ops.kvpop
    with graph.inserting_before(match.output):
        teacher = graph.call_function(
            kvpop.masked_attention.default,
            (match.query, match.key, match.value, None, match.scale, TEACHER_BLOCK),
        )
        out = graph.call_function(operator.getitem, (teacher, 0))
        lse = graph.call_function(operator.getitem, (teacher, 1))
        target = graph.call_function(
            kvpop.future_attention_target.default,
            (
                match.query,
                match.key,
                lse,
                config.window,
                match.scale,
                TARGET_BLOCK,
                aggregate,
                power,
            ),
        )
        log_target = graph.call_function(operator.getitem, (target, 0))
        valid = graph.call_function(operator.getitem, (target, 1))
    out.meta = dict(match.output.meta)
    match.output.replace_all_uses_with(out)
    graph.erase_node(match.output)
    output = next(n for n in graph.nodes if n.op == "output")
    (results,) = output.args
    output.args = ((*results, raw_key, match.value, log_target, valid),)
    logger.info("insert_future_attention_target: inserted 1 target (layer %d)", layer)
    return clean_up(gm, changed=True)
