"""What the passes share: finding an attention site, the pre-RoPE keys behind it, and the
clean-up after a rewrite. The training passes (:mod:`kvpop_compile.training.passes`) use them
too.

Two attention forms are recognised: ``aten.scaled_dot_product_attention`` and the eager
``matmul -> (scale) -> (+ mask) -> softmax -> (cast, dropout) -> matmul`` chain. Keys and values
are traced back through ``repeat_kv`` (unsqueeze/expand/reshape, or repeat_interleave) to the
un-repeated ``(B, Hkv, N, D)`` tensors: grouped-query attention is handled inside the bounded
attention, and repeating the cache would copy all of it every step.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten
_PASS_THROUGH = (
    aten.dropout.default,
    aten.to.dtype,
    aten._to_copy.default,
    aten.clone.default,
    aten.alias.default,
)
_RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
_CASTS = (aten.to.dtype, aten._to_copy.default)


class NoAttentionFoundError(ValueError):
    """A graph had no attention that the passes recognise."""


@dataclass
class AttentionMatch:
    """The nodes of one attention site."""

    query: Node  # (B, Hq, N, D) after RoPE
    key: Node  # (B, Hkv, N, D) after RoPE, not repeated
    value: Node  # (B, Hkv, N, D), not repeated
    output: Node  # (B, Hq, N, D), the node a pass replaces
    scale: float


def is_call(node: object, *targets) -> bool:
    """Whether ``node`` calls one of the functions ``targets``."""
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def skip_casts(node: object) -> object:
    """The node behind any dtype casts of ``node``."""
    while is_call(node, *_CASTS):
        node = node.args[0]
    return node


def _skip_full_slices(node: Node) -> Node:
    """``x[:, :, ...]`` traces to slices that keep everything; look through them."""
    while is_call(node, aten.slice.Tensor):
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
    if is_call(node, aten.repeat_interleave.self_int):
        return node.args[0]
    if is_call(node, *_RESHAPES):
        expanded = _skip_full_slices(node.args[0])
        if is_call(expanded, aten.expand.default):
            unsqueezed = _skip_full_slices(expanded.args[0])
            if is_call(unsqueezed, aten.unsqueeze.default) and unsqueezed.args[1] == 2:
                return _skip_full_slices(unsqueezed.args[0])
    return node


def _default_scale(query: Node) -> float:
    return query.meta["val"].shape[-1] ** -0.5


def _match_sdpa(node: Node) -> AttentionMatch | None:
    if not is_call(node, aten.scaled_dot_product_attention.default):
        return None
    query, key, value = node.args[:3]
    scale = node.kwargs.get("scale", node.args[6] if len(node.args) > 6 else None)
    scale = _default_scale(query) if scale is None else float(scale)
    return AttentionMatch(query, _unrepeat(key), _unrepeat(value), node, scale)


def _match_eager(node: Node) -> AttentionMatch | None:
    if not is_call(node, aten.matmul.default):
        return None
    probs, value = node.args
    while is_call(probs, *_PASS_THROUGH):
        probs = probs.args[0]
    if not is_call(probs, aten.softmax.int, aten._softmax.default):
        return None
    scores = probs.args[0]
    if is_call(scores, aten.add.Tensor):  # an additive mask: causality is ours now
        scores = scores.args[0]
    scale = 1.0
    if is_call(scores, aten.mul.Tensor, aten.div.Tensor) and isinstance(
        scores.args[1], (int, float)
    ):
        factor = float(scores.args[1])
        scale = factor if scores.target is aten.mul.Tensor else 1.0 / factor
        scores = scores.args[0]
    if not is_call(scores, aten.matmul.default):
        return None
    query, key_transposed = scores.args
    if not is_call(key_transposed, aten.transpose.int):
        return None
    key = key_transposed.args[0]
    return AttentionMatch(query, _unrepeat(key), _unrepeat(value), node, scale)


def find_attention(node: Node) -> AttentionMatch | None:
    """The attention site that ``node`` is the output of, if any."""
    return _match_sdpa(node) or _match_eager(node)


def find_attentions(gm: GraphModule) -> list[AttentionMatch]:
    """Every attention site of ``gm``, in graph order; a ``NoAttentionFoundError`` if none."""
    matches = [m for m in map(find_attention, gm.graph.nodes) if m is not None]
    if not matches:
        raise NoAttentionFoundError(
            "no attention found in the graph: expected aten.scaled_dot_product_attention or an "
            "eager matmul -> softmax -> matmul attention (as in Qwen3 and Qwen3-MoE)"
        )
    return matches


def find_one_attention(gm: GraphModule) -> AttentionMatch:
    """The attention site of a graph captured from one attention module."""
    matches = find_attentions(gm)
    if len(matches) != 1:
        raise ValueError(f"expected one attention per captured graph, found {len(matches)}")
    return matches[0]


def _rotated_half_of(node: Node) -> Node | None:
    """``x`` if ``node`` is ``cat([-x[..., d/2:], x[..., :d/2]])``."""
    if not is_call(node, aten.cat.default):
        return None
    parts = node.args[0]
    if len(parts) != 2 or not is_call(parts[0], aten.neg.default):
        return None
    upper, lower = parts[0].args[0], parts[1]
    if not (is_call(upper, aten.slice.Tensor) and is_call(lower, aten.slice.Tensor)):
        return None
    if upper.args[0] is not lower.args[0]:
        return None
    return upper.args[0]


def find_pre_rope(key: Node) -> Node | None:
    """The tensor that RoPE rotated into ``key``, if ``key`` is ``x * cos + rotate_half(x) *
    sin`` (either operand order)."""
    if not is_call(key, aten.add.Tensor):
        return None
    terms = [t for t in key.args if is_call(t, aten.mul.Tensor)]
    if len(terms) != 2:
        return None
    for plain, rotated in (terms, terms[::-1]):
        for factor in rotated.args:
            source = _rotated_half_of(factor) if isinstance(factor, Node) else None
            if source is not None and source in plain.args:
                return source
    return None


def pre_rope_key(key: Node, layer_idx: int) -> Node:
    """The keys before RoPE that ``key`` was rotated from (the scorers' input), or a
    ``ValueError``."""
    raw_key = find_pre_rope(key)
    if raw_key is None:
        raise ValueError(
            f"layer {layer_idx}: the attention's keys do not come from a rotary embedding "
            "(k * cos + rotate_half(k) * sin); KVpop scorers need the pre-RoPE keys"
        )
    return raw_key


def clean_up(gm: GraphModule, changed: bool) -> GraphModule:
    """After a pass: check the graph and regenerate ``gm``'s code, if the pass changed it."""
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm
