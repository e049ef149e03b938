"""insert_scorer: give each bounded attention its scorer, fed with the pre-RoPE keys.

Scorers read keys before RoPE (after ``k_norm``) so that a score does not depend on absolute
position. The pass finds that tensor by matching the rotary embedding
``k * cos + rotate_half(k) * sin`` backwards from the key the attention consumes, and passes it
to the bounded attention as an extra input. The scorer becomes a submodule, so its parameters
are the model's to train, save and load.
"""

from __future__ import annotations

import logging

import torch
from torch.fx import GraphModule, Node

from ..config import KVpopConfig
from ..runtime.attention_module import BoundedAttention
from ..runtime.scorers import build_scorer

logger = logging.getLogger(__name__)
aten = torch.ops.aten


def _is_call(node: object, target) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target is target


def _rotated_half_of(node: Node) -> Node | None:
    """``x`` if ``node`` is ``cat([-x[..., d/2:], x[..., :d/2]])``."""
    if not _is_call(node, aten.cat.default):
        return None
    parts = node.args[0]
    if len(parts) != 2 or not _is_call(parts[0], aten.neg.default):
        return None
    upper, lower = parts[0].args[0], parts[1]
    if not (_is_call(upper, aten.slice.Tensor) and _is_call(lower, aten.slice.Tensor)):
        return None
    if upper.args[0] is not lower.args[0]:
        return None
    return upper.args[0]


def find_pre_rope(key: Node) -> Node | None:
    """The tensor that RoPE rotated into ``key``, if ``key`` is ``x * cos + rotate_half(x) *
    sin`` (either operand order)."""
    if not _is_call(key, aten.add.Tensor):
        return None
    terms = [t for t in key.args if _is_call(t, aten.mul.Tensor)]
    if len(terms) != 2:
        return None
    for plain, rotated in (terms, terms[::-1]):
        for factor in rotated.args:
            source = _rotated_half_of(factor) if isinstance(factor, Node) else None
            if source is not None and source in plain.args:
                return source
    return None


def insert_scorer(gm: GraphModule, config: KVpopConfig) -> GraphModule:
    """Attach a scorer to every ``BoundedAttention`` and feed it the pre-RoPE keys."""
    inserted = 0
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        module = gm.get_submodule(node.target)
        if not isinstance(module, BoundedAttention) or module.scorer is not None:
            continue
        query, key, value, *state = node.args
        raw_key = find_pre_rope(key)
        if raw_key is None:
            raise ValueError(
                f"layer {module.layer_idx}: the attention's keys do not come from a rotary "
                "embedding (k * cos + rotate_half(k) * sin); KVpop scorers need the pre-RoPE keys"
            )
        _, kv_heads, _, head_dim = key.meta["val"].shape
        scorer = build_scorer(config, int(kv_heads), int(head_dim), module.layer_idx)
        module.scorer = scorer.to(key.meta["val"].device)
        node.args = (query, key, value, raw_key, *state)
        inserted += 1
    logger.info("insert_scorer: inserted %d scorer(s)", inserted)
    if inserted:
        gm.graph.lint()
        gm.recompile()
    return gm
