"""Graph passes: structure of the rewritten attention graph and numerics before/after."""

import logging
from dataclasses import fields

import pytest
import torch
from tiny_models import tiny_qwen3
from torch.fx.experimental.proxy_tensor import make_fx
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from kvpop_compile import KVpopConfig
from kvpop_compile.capture import capture_attention
from kvpop_compile.passes import (
    PASSES,
    NoAttentionFoundError,
    insert_scorer,
    replace_attention,
    run_passes,
)
from kvpop_compile.runtime import BoundedCacheState, chunk_step
from kvpop_compile.runtime.bounded_attention import BoundedAttention

aten = torch.ops.aten
CONFIG = KVpopConfig(sinks=2, window=4, topk=64, scorer="memory")


def captured(implementation: str, **overrides):
    model = tiny_qwen3(attn_implementation=implementation, **overrides)
    attention = model.model.layers[1].self_attn
    graph = capture_attention(
        attention, hidden_size=model.config.hidden_size, head_dim=attention.head_dim
    )
    return model, attention, graph


def targets(gm):
    return [node.target for node in gm.graph.nodes]


def causal_reference(model, attention, hidden, cos, sin):
    n = hidden.shape[1]
    mask = torch.full((n, n), float("-inf")).triu(1).expand(hidden.shape[0], 1, n, n)
    return attention(hidden, (cos, sin), mask)[0]


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"), [(4, 4, 16), (4, 2, 16), (8, 1, 64), (16, 2, 128)]
)
def test_passes_rewrite_attention_and_keep_numerics(implementation, heads, kv_heads, head_dim):
    model, attention, gm = captured(
        implementation, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim
    )
    before = targets(gm)
    assert aten.scaled_dot_product_attention.default in before or aten.softmax.int in before
    gm = run_passes(gm, CONFIG)
    after = targets(gm)
    for gone in (aten.scaled_dot_product_attention.default, aten.softmax.int, aten.expand.default):
        assert gone not in after
    modules = [gm.get_submodule(n.target) for n in gm.graph.nodes if n.op == "call_module"]
    assert len(modules) == 1 and isinstance(modules[0], BoundedAttention)
    assert modules[0].layer_idx == 1 and modules[0].scorer.num_kv_heads == kv_heads
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    state_inputs = [f"kvpop_state_0_{f.name}" for f in fields(BoundedCacheState)]  # in order
    assert placeholders == ["hidden", "cos", "sin", *state_inputs]

    hidden = torch.randn(2, 10, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(10).unsqueeze(0).expand(2, -1))
    state = BoundedCacheState.empty(CONFIG, modules[0].scorer, batch=2, head_dim=head_dim)
    with torch.no_grad():
        reference = causal_reference(model, attention, hidden, cos, sin)
        out = gm(hidden, cos, sin, *state.tensors())[0]
    # Same float32 terms, differently ordered sums: a few ulps of unit-scale activations.
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_passes_log_their_rewrites(caplog):
    _, _, gm = captured("eager")
    with caplog.at_level(logging.INFO, logger="kvpop_compile.passes"):
        run_passes(gm, CONFIG)
    text = caplog.text
    assert "replace_attention: rewrote 1 attention site(s)" in text
    assert "insert_scorer: inserted 1 scorer(s)" in text
    assert "remove_dead_code: removed" in text
    assert [p.__name__ for p in PASSES] == [
        "replace_attention",
        "insert_scorer",
        "remove_dead_code",
    ]


def test_decode_graph_carries_kvpop_ops():
    model, _, gm = captured("sdpa")
    gm = run_passes(gm, CONFIG)
    scorer = gm.kvpop_attention_0.scorer
    state = BoundedCacheState.empty(CONFIG, scorer, batch=1, head_dim=16)
    hidden = torch.randn(1, 1, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(hidden, torch.zeros(1, 1, dtype=torch.long))
    with torch.no_grad():
        traced = make_fx(gm)(hidden, cos, sin, *state.tensors())
    names = {str(node.target) for node in traced.graph.nodes}
    assert {"kvpop.update_cache.default", "kvpop.decode_attention.default"} <= names
    assert "kvpop.decode_attention.default" in names


def test_graph_without_attention_is_an_error():
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    gm = torch.export.export(mlp, (torch.randn(2, 4),)).module()
    with pytest.raises(NoAttentionFoundError, match="no attention found in the graph"):
        replace_attention(gm, CONFIG)


class NoRope(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_attention_without_rotary_keys_is_an_error():
    x = torch.randn(1, 2, 4, 8)
    gm = torch.export.export(NoRope(), (x, x.clone(), x.clone())).module()
    gm = replace_attention(gm, CONFIG)
    with pytest.raises(ValueError, match="do not come from a rotary embedding"):
        insert_scorer(gm, CONFIG)


class NodeValues(torch.fx.Interpreter):
    """Runs a graph and keeps the value of every node."""

    def run_node(self, node):
        value = super().run_node(node)
        self.values[node] = value
        return value

    def __call__(self, *inputs):
        self.values = {}
        with torch.no_grad():
            self.run(*inputs)
        return self.values


def bounded_call(gm):
    (node,) = [n for n in gm.graph.nodes if n.op == "call_module"]
    return node


def test_insert_scorer_feeds_knorm_the_keys_before_k_norm():
    model, attention, gm = captured("sdpa", head_dim=32)
    config = KVpopConfig(sinks=1, window=2, topk=3, scorer="knorm")
    gm = run_passes(gm, config)
    scorer = gm.kvpop_attention_0.scorer
    hidden = torch.randn(2, 9, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(9).unsqueeze(0).expand(2, -1))
    state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=32)
    values = NodeValues(gm)(hidden, cos, sin, *state.tensors())
    fed = values[bounded_call(gm).args[3]]
    with torch.no_grad():
        before_norm = attention.k_proj(hidden).view(2, 9, -1, 32).transpose(1, 2)
    torch.testing.assert_close(fed, before_norm, rtol=0, atol=0)
    # The scorer reads the very norm the model applies: ||k_norm(x)|| in float64.
    weight = attention.k_norm.weight.double()
    x = before_norm.double()
    eps = attention.k_norm.variance_epsilon
    keys = weight * x / (x.square().mean(-1, keepdim=True) + eps).sqrt()
    expected = weight.norm() - keys.norm(dim=-1)
    score = scorer.score_tokens(before_norm, before_norm, torch.arange(9))
    torch.testing.assert_close(score.double(), expected, rtol=0, atol=1e-6)


def test_knorm_needs_a_key_norm_in_the_graph():
    class RopeWithoutNorm(torch.nn.Module):
        def forward(self, q, k, v, cos, sin):
            half = k.shape[-1] // 2
            rotated = torch.cat([-k[..., half:], k[..., :half]], dim=-1)
            return torch.nn.functional.scaled_dot_product_attention(
                q, k * cos + rotated * sin, v, is_causal=True
            )

    x = torch.randn(1, 2, 4, 8)
    gm = torch.export.export(RopeWithoutNorm(), tuple(x.clone() for _ in range(5))).module()
    gm = replace_attention(gm, CONFIG)
    with pytest.raises(ValueError, match="reads keys before the key norm, but the pre-RoPE keys"):
        insert_scorer(gm, KVpopConfig(sinks=1, window=2, topk=2, scorer="knorm"))
    insert_scorer(gm, CONFIG)  # a scorer of keys after the norm needs none


def projected(attention, hidden, cos, sin):
    """Qwen3's own projections, norms and RoPE: ``q``, ``k`` after RoPE, ``k`` before RoPE (after
    ``k_norm``) and ``v``, each ``(B, H, N, D)``."""
    batch, n, _ = hidden.shape
    dim = attention.head_dim
    with torch.no_grad():
        q = attention.q_norm(attention.q_proj(hidden).view(batch, n, -1, dim)).transpose(1, 2)
        k = attention.k_norm(attention.k_proj(hidden).view(batch, n, -1, dim)).transpose(1, 2)
        v = attention.v_proj(hidden).view(batch, n, -1, dim).transpose(1, 2)
        q_rotated, k_rotated = apply_rotary_pos_emb(q, k, cos, sin)
    return q_rotated, k_rotated, k, v


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_insert_scorer_feeds_the_scorer_the_keys_before_rope(implementation):
    model, attention, gm = captured(implementation)
    config = KVpopConfig(sinks=1, window=2, topk=3, scorer="memory")  # capacity 6 < 20 tokens
    gm = run_passes(gm, config)
    scorer = gm.kvpop_attention_0.scorer
    hidden = torch.randn(2, 20, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(20).unsqueeze(0).expand(2, -1))
    q, k, k_before_rope, v = projected(attention, hidden, cos, sin)

    # Wiring: the bounded attention's scorer input is the key before RoPE, not after.
    state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=16)
    values = NodeValues(gm)(hidden, cos, sin, *state.tensors())
    fed = values[bounded_call(gm).args[3]]
    torch.testing.assert_close(fed, k_before_rope, rtol=1e-6, atol=1e-6)
    assert (fed - k).abs().max() > 0.1

    # Numerics under eviction: the graph equals prefill called with the keys before RoPE, and
    # not with the rotated ones (the memory scorer's scores, so what is evicted, depend on it).
    def reference(raw_keys):
        fresh = BoundedCacheState.empty(config, scorer, batch=2, head_dim=16)
        out = chunk_step(fresh, q, k, raw_keys, v, scorer=scorer, config=config,
                      scale=16**-0.5)  # fmt: skip
        with torch.no_grad():
            return attention.o_proj(out.transpose(1, 2).reshape(2, 20, -1)), fresh

    state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=16)
    with torch.no_grad():
        out = gm(hidden, cos, sin, *state.tensors())[0]
    expected, expected_state = reference(k_before_rope)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert state.cached_positions() == expected_state.cached_positions()
    rotated, rotated_state = reference(k)
    assert rotated_state.cached_positions() != expected_state.cached_positions()
    assert not torch.allclose(out, rotated, rtol=1e-3, atol=1e-3)
