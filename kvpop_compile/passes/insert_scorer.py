"""insert_scorer: give each bounded attention its scorer, fed with the pre-RoPE keys.

Scorers read keys before RoPE (after ``k_norm``) so that a score does not depend on absolute
position. The pass finds that tensor by matching the rotary embedding
``k * cos + rotate_half(k) * sin`` backwards from the key the attention consumes, and passes it
to the bounded attention as an extra input. The scorer becomes a submodule, so its parameters
are the model's to train, save and load.

A scorer that asks for keys before the model's key norm (``knorm``: on Qwen3 the norms after
``k_norm`` nearly tie) is fed the tensor that the RMSNorm ``w * (x * rsqrt(mean(x**2) + eps))``
normalised, transposed to ``(B, Hkv, N, D)``, and told the norm's weight and epsilon.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from torch.fx import GraphModule, Node

from ..config import KVpopConfig
from ..runtime.bounded_attention import BoundedAttention
from ..runtime.scorers.registry import build_scorer
from .pass_utils import aten, clean_up, is_call, pre_rope_key, skip_casts

logger = logging.getLogger(__name__)


@dataclass
class RMSNormMatch:
    """An RMSNorm ``weight * (x * rsqrt(mean(x**2, -1) + eps))`` found in a graph."""

    input: Node  # x, (..., D) before the norm
    weight: Node  # get_attr of the (D,) weight
    eps: float


def _find_rms_norm(node: Node) -> RMSNormMatch | None:
    """The RMSNorm that ``node`` is the output of (casts around its parts allowed), as
    transformers' ``Qwen3RMSNorm`` traces."""
    if not is_call(node, aten.mul.Tensor):
        return None
    weights = [a for a in node.args if isinstance(a, Node) and a.op == "get_attr"]
    if len(weights) != 1:
        return None
    weight = weights[0]
    scaled = skip_casts(node.args[1] if node.args[0] is weight else node.args[0])
    if not is_call(scaled, aten.mul.Tensor) or len(scaled.args) != 2:
        return None
    for source, inverse in (scaled.args, scaled.args[::-1]):
        if not is_call(inverse, aten.rsqrt.default):
            continue
        shifted = inverse.args[0]
        if not (is_call(shifted, aten.add.Tensor) and isinstance(shifted.args[1], float)):
            continue
        mean = shifted.args[0]
        if not (is_call(mean, aten.mean.dim) and list(mean.args[1]) == [-1]):
            continue
        square = mean.args[0]
        if is_call(square, aten.pow.Tensor_Scalar) and square.args == (source, 2):
            return RMSNormMatch(skip_casts(source), weight, shifted.args[1])
    return None


def _find_key_before_norm(raw_key: Node) -> RMSNormMatch | None:
    """The key norm behind ``raw_key`` if ``raw_key`` is ``rms_norm(x).transpose(1, 2)`` (as
    Qwen3's ``k_norm`` on ``(B, N, Hkv, D)`` keys)."""
    if not is_call(raw_key, aten.transpose.int) or sorted(raw_key.args[1:]) != [1, 2]:
        return None
    return _find_rms_norm(raw_key.args[0])


def _feed_key_before_norm(gm: GraphModule, raw_key: Node, scorer, layer_idx: int) -> Node:
    """The ``(B, Hkv, N, D)`` node of the keys before the norm; tells ``scorer`` the norm."""
    norm = _find_key_before_norm(raw_key)
    if norm is None:
        raise ValueError(
            f"layer {layer_idx}: the {type(scorer).__name__} reads keys before the key norm, but "
            "the pre-RoPE keys do not come from an RMSNorm (weight * x * rsqrt(mean(x**2) + "
            "eps)) in this graph"
        )
    owner, _, name = norm.weight.target.rpartition(".")
    scorer.read_keys_before_norm(gm.get_submodule(owner), name, norm.eps)
    with gm.graph.inserting_after(raw_key):
        before_norm = gm.graph.call_function(aten.transpose.int, (norm.input, 1, 2))
    before_norm.meta = dict(raw_key.meta)
    if "val" in norm.input.meta:
        before_norm.meta["val"] = norm.input.meta["val"].transpose(1, 2)
    return before_norm


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
        raw_key = pre_rope_key(key, module.layer_idx)
        _, kv_heads, _, head_dim = key.meta["val"].shape
        scorer = build_scorer(config, int(kv_heads), int(head_dim), module.layer_idx)
        module.scorer = scorer.to(key.meta["val"].device)
        if scorer.reads_key_before_norm:
            raw_key = _feed_key_before_norm(gm, raw_key, scorer, module.layer_idx)
        node.args = (query, key, value, raw_key, *state)
        inserted += 1
    logger.info("insert_scorer: inserted %d scorer(s)", inserted)
    return clean_up(gm, changed=inserted > 0)
