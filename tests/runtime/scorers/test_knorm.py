"""``knorm`` on Qwen3: kvpress's KNorm (keep the keys of smallest norm) computed exactly.

Qwen3 RMS-normalises its keys (``k_norm``); with uniform norm weights every cached key has a
norm within float32 rounding of ``||w||``. These tests hold the policy to a float64 oracle of
kvpress's definition, and to the invariants prefill ≡ token-by-token ≡ compiled (design.md §6),
on models whose norm weights are uniform (fresh) or not (trained).
"""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_oracles import top_k_eligible
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc

SHAPES = {
    # head_dim: model overrides. Larger heads put the tied norms closer than float32 resolves.
    16: {},
    64: {"head_dim": 64, "hidden_size": 128},
    128: {"head_dim": 128, "hidden_size": 256},
}


def qwen3_with_key_norm(head_dim: int, seed: int, uniform: bool, **overrides):
    """A tiny Qwen3 whose ``k_norm`` weights are all 1 (as initialised) or drawn around 1 (as
    trained)."""
    model = tiny_qwen3(seed, **SHAPES[head_dim], **overrides)
    if not uniform:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in model.model.layers:
                weight = layer.self_attn.k_norm.weight
                weight.copy_(1 + 0.5 * torch.randn(weight.shape, generator=generator))
    return model


def first_layer_key_norms(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``||k_t||`` of the first layer's cached keys (after ``k_norm``) in float64: ``(B, Hkv,
    N)``. The first layer's keys do not depend on what any cache kept. transformers' RMSNorm
    computes in float32 whatever the model's dtype, so the norm is written out here."""
    model = copy.deepcopy(model).double()
    norm = model.model.layers[0].self_attn.k_norm
    captured = []
    hook = norm.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
    with torch.no_grad():
        model(ids)
    hook.remove()
    x = captured[0]  # (B, N, Hkv, D) float64, before the norm
    keys = norm.weight * x / (x.square().mean(dim=-1, keepdim=True) + norm.variance_epsilon).sqrt()
    return keys.norm(dim=-1).transpose(1, 2)


def pool(cache: kc.KVpopCache, layer: int, config: kc.KVpopConfig) -> list[list[set[int]]]:
    """Positions in each (batch, head)'s pool slots."""
    positions = cache.layers[layer].state.positions[..., config.sinks : config.sinks + config.topk]
    return [[{int(p) for p in head if p >= 0} for head in row] for row in positions]


@settings(max_examples=12)
@given(
    head_dim=st.sampled_from(sorted(SHAPES)),
    uniform=st.booleans(),
    sinks=st.integers(0, 2),
    window=st.integers(1, 8),
    topk=st.integers(1, 8),
    n=st.integers(2, 90),
    lam=st.sampled_from([0.0, 1e-4]),
    seed=st.integers(0, 2**16),
)
def test_knorm_prefill_and_token_steps_keep_kvpress_top_k(
    head_dim, uniform, sinks, window, topk, n, lam, seed
):
    config = kc.KVpopConfig(sinks=sinks, window=window, topk=topk, lam=lam, scorer="knorm")
    original = qwen3_with_key_norm(head_dim, seed, uniform)
    ids = prompt(seed, batch=2, length=n)
    norms = first_layer_key_norms(original, ids)
    model = kc.transform(original, config)
    prefilled, stepped = kc.new_cache(model), kc.new_cache(model)
    with torch.no_grad():
        logits = kc.prefill(model, ids, prefilled)
        for i in range(n):
            position = torch.full((2, 1), i)
            step_logits = kc.decode_one_token(model, ids[:, i : i + 1], position, stepped)
    # The same tokens in every layer, so the same logits up to float32 summation order.
    for layer in range(model.config.num_hidden_layers):
        assert prefilled.layers[layer].state.cached_positions() == (
            stepped.layers[layer].state.cached_positions()
        )
    torch.testing.assert_close(logits, step_logits, rtol=1e-4, atol=1e-4)
    # kvpress's score of the float64 cached key decides the first layer's pool.
    priority = -norms + lam * torch.arange(n, dtype=torch.float64)
    expected = [
        [
            top_k_eligible(
                priority[b, h].tolist(), step=n - 1, sinks=sinks, window=window, topk=topk
            )
            for h in range(priority.shape[1])
        ]
        for b in range(priority.shape[0])
    ]
    assert pool(prefilled, 0, config) == pool(stepped, 0, config) == expected


@pytest.mark.parametrize("uniform", [True, False])
def test_knorm_score_is_kvpress_score_plus_a_constant(uniform):
    # ||w|| - ||k_t|| from the keys before the norm, against ||k_t|| of the float64 model.
    original = qwen3_with_key_norm(128, 3, uniform)
    ids = prompt(3, batch=1, length=40)
    norms = first_layer_key_norms(original, ids)
    attention = original.model.layers[0].self_attn
    with torch.no_grad():
        hidden = original.model.layers[0].input_layernorm(original.model.embed_tokens(ids))
        x = attention.k_proj(hidden).view(1, 40, -1, 128).transpose(1, 2)  # before k_norm
    model = kc.transform(original, kc.KVpopConfig(sinks=1, window=2, topk=4, scorer="knorm"))
    scorer = model.model.layers[0].self_attn.scorer
    score = scorer.score_tokens(x, x, torch.arange(40))
    weight = attention.k_norm.weight.double()
    expected = weight.norm() - norms
    # Keys of the float32 model carry relative rounding of ~1e-7; so does the score, relative to
    # ||w|| (about 11 here).
    torch.testing.assert_close(score.double(), expected, rtol=0, atol=1e-5 * weight.norm().item())
    # The order is kvpress's exactly, even where the norms agree to 1e-6.
    assert torch.equal(score.argsort(dim=-1), expected.argsort(dim=-1))
    if uniform:
        assert (norms - weight.norm()).abs().max() < 1e-4 * weight.norm()


@pytest.mark.parametrize(("head_dim", "uniform"), [(128, True), (64, False)])
def test_knorm_compiled_decode_matches_eager(head_dim, uniform):
    torch._dynamo.reset()
    config = kc.KVpopConfig(sinks=2, window=8, topk=6, scorer="knorm")  # capacity 16
    model = kc.transform(qwen3_with_key_norm(head_dim, 0, uniform), config)
    ids = prompt(1, batch=1, length=20)
    compiled = kc.generate(model, ids, 140, step=kc.compile(model))
    assert torch.equal(compiled, kc.generate(model, ids, 140))
