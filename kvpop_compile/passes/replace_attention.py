"""replace_attention: rewrite every attention of a captured graph into KVpop bounded attention.

Two forms are recognised: ``aten.scaled_dot_product_attention`` and the eager
``matmul -> (scale) -> (+ mask) -> softmax -> (cast, dropout) -> matmul`` chain. Keys and values
are traced back through ``repeat_kv`` (unsqueeze/expand/reshape, or repeat_interleave) to the
un-repeated ``(B, Hkv, N, D)`` tensors: grouped-query attention is handled inside the bounded
attention, and repeating the cache would copy all of it every step.

Each site becomes a call to a :class:`BoundedAttention` submodule whose cache state arrives as
new graph inputs (one per state tensor), so the state can live outside the graph.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, fields

import torch
from torch.fx import GraphModule, Node

from ..config import KVpopConfig
from ..runtime.bounded_attention import BoundedAttention
from ..runtime.cache import BoundedCacheState

logger = logging.getLogger(__name__)

aten = torch.ops.aten
_PASS_THROUGH = {
    aten.dropout.default,
    aten.to.dtype,
    aten._to_copy.default,
    aten.clone.default,
    aten.alias.default,
}
_RESHAPES = {aten.reshape.default, aten.view.default, aten._unsafe_view.default}


class NoAttentionFoundError(ValueError):
    """A graph had no attention that the pass recognises."""


@dataclass
class AttentionMatch:
    """The nodes of one attention site."""

    query: Node  # (B, Hq, N, D) after RoPE
    key: Node  # (B, Hkv, N, D) after RoPE, not repeated
    value: Node  # (B, Hkv, N, D), not repeated
    output: Node  # (B, Hq, N, D), the node the bounded attention replaces
    scale: float


def _is_call(node: object, targets) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def _skip_full_slices(node: Node) -> Node:
    """``x[:, :, ...]`` traces to slices that keep everything; look through them."""
    while _is_call(node, {aten.slice.Tensor}):
        args = node.args
        start = args[2] if len(args) > 2 else None
        end = args[3] if len(args) > 3 else None
        step = args[4] if len(args) > 4 else 1
        if start not in (None, 0) or end not in (None, sys.maxsize) or step != 1:
            break
        node = node.args[0]
    return node


def _unrepeat(node: Node) -> Node:
    """The tensor before ``repeat_kv``, or ``node`` itself if it was not repeated."""
    if _is_call(node, {aten.repeat_interleave.self_int}):
        return node.args[0]
    if _is_call(node, _RESHAPES):
        expanded = _skip_full_slices(node.args[0])
        if _is_call(expanded, {aten.expand.default}):
            unsqueezed = _skip_full_slices(expanded.args[0])
            if _is_call(unsqueezed, {aten.unsqueeze.default}) and unsqueezed.args[1] == 2:
                return _skip_full_slices(unsqueezed.args[0])
    return node


def _default_scale(query: Node) -> float:
    return query.meta["val"].shape[-1] ** -0.5


def _match_sdpa(node: Node) -> AttentionMatch | None:
    if not _is_call(node, {aten.scaled_dot_product_attention.default}):
        return None
    query, key, value = node.args[:3]
    scale = node.kwargs.get("scale", node.args[6] if len(node.args) > 6 else None)
    scale = _default_scale(query) if scale is None else float(scale)
    return AttentionMatch(query, _unrepeat(key), _unrepeat(value), node, scale)


def _match_eager(node: Node) -> AttentionMatch | None:
    if not _is_call(node, {aten.matmul.default}):
        return None
    probs, value = node.args
    while _is_call(probs, _PASS_THROUGH):
        probs = probs.args[0]
    if not _is_call(probs, {aten.softmax.int, aten._softmax.default}):
        return None
    scores = probs.args[0]
    if _is_call(scores, {aten.add.Tensor}):  # an additive mask: causality is ours now
        scores = scores.args[0]
    scale = 1.0
    if _is_call(scores, {aten.mul.Tensor, aten.div.Tensor}) and isinstance(
        scores.args[1], (int, float)
    ):
        factor = float(scores.args[1])
        scale = factor if scores.target is aten.mul.Tensor else 1.0 / factor
        scores = scores.args[0]
    if not _is_call(scores, {aten.matmul.default}):
        return None
    query, key_transposed = scores.args
    if not _is_call(key_transposed, {aten.transpose.int}):
        return None
    key = key_transposed.args[0]
    return AttentionMatch(query, _unrepeat(key), _unrepeat(value), node, scale)


def find_attention(node: Node) -> AttentionMatch | None:
    """The attention site that ``node`` is the output of, if any."""
    return _match_sdpa(node) or _match_eager(node)


def _add_state_inputs(gm: GraphModule, prefix: str) -> list[Node]:
    last_input = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    inputs = []
    for field in fields(BoundedCacheState):
        with gm.graph.inserting_after(last_input):
            last_input = gm.graph.placeholder(f"{prefix}_{field.name}")
        inputs.append(last_input)
    return inputs


def replace_attention(gm: GraphModule, config: KVpopConfig) -> GraphModule:
    """Replace each attention site with a ``BoundedAttention`` call on explicit cache state.

    The new submodules are ``kvpop_attention_<i>``; the first site's layer index is
    ``gm.kvpop_layer_idx`` (0 if unset), used to seed the layer's scorer.
    """
    matches = [m for m in map(find_attention, gm.graph.nodes) if m is not None]
    if not matches:
        raise NoAttentionFoundError(
            "no attention found in the graph: expected aten.scaled_dot_product_attention or an "
            "eager matmul -> softmax -> matmul attention (as in Qwen3 and Qwen3-MoE)"
        )
    first_layer = getattr(gm, "kvpop_layer_idx", 0)
    for site, match in enumerate(matches):
        name = f"kvpop_attention_{site}"
        gm.add_submodule(name, BoundedAttention(config, first_layer + site, match.scale))
        state = _add_state_inputs(gm, f"kvpop_state_{site}")
        with gm.graph.inserting_before(match.output):
            bounded = gm.graph.call_module(name, args=(match.query, match.key, match.value, *state))
        bounded.meta = dict(match.output.meta)
        match.output.replace_all_uses_with(bounded)
        # sdpa counts as impure (it may draw dropout noise), so dead-code removal keeps it.
        gm.graph.erase_node(match.output)
    logger.info("replace_attention: rewrote %d attention site(s)", len(matches))
    gm.graph.lint()
    gm.recompile()
    return gm
