"""transform() end to end on tiny Qwen3 and Qwen3-MoE models."""

import pytest
import torch
from tiny_models import prompt, tiny_qwen3
from transformers import LlamaConfig, LlamaForCausalLM

import kvpop_compile as kc
from kvpop_compile.kv_cache import cache_kwargs
from kvpop_compile.modeling import KVpopAttention

ROOMY = kc.KVpopConfig(sinks=2, window=4, topk=64)  # capacity 70 >= prompt + generated
TIGHT = kc.KVpopConfig(sinks=2, window=4, topk=6, scorer="memory")  # capacity 12


@pytest.mark.parametrize(
    ("implementation", "moe"), [("sdpa", False), ("eager", False), ("sdpa", True)]
)
def test_roomy_budget_gives_the_original_greedy_tokens_and_logits(implementation, moe):
    original = tiny_qwen3(attn_implementation=implementation, moe=moe)
    ids = prompt(length=12)
    with torch.no_grad():
        expected_tokens = original.generate(ids, max_new_tokens=30, do_sample=False)
        expected_logits = original(ids).logits
    model = kc.transform(original, ROOMY)
    assert all(isinstance(layer.self_attn, KVpopAttention) for layer in model.model.layers)
    with torch.no_grad():
        tokens = model.generate(ids, max_new_tokens=30, do_sample=False)
        logits = model(ids).logits
    assert torch.equal(tokens, expected_tokens)
    # float32 attention summed in another order: ulp-level differences, amplified by two layers.
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)


def test_roomy_budget_matches_sampling_with_the_same_seed():
    original = tiny_qwen3()
    ids = prompt(length=8)
    torch.manual_seed(7)
    expected = original.generate(ids, max_new_tokens=20, do_sample=True, top_k=20)
    model = kc.transform(original, ROOMY)
    torch.manual_seed(7)
    assert torch.equal(model.generate(ids, max_new_tokens=20, do_sample=True, top_k=20), expected)


def test_bf16_model_stays_bf16_and_close_to_the_original():
    original = tiny_qwen3(dtype=torch.bfloat16)
    ids = prompt(length=12)
    with torch.no_grad():
        expected = original(ids).logits.float()
        model = kc.transform(original, ROOMY)
        logits = model(ids).logits
    assert logits.dtype == torch.bfloat16
    assert model.model.layers[0].self_attn.graph.kvpop_attention_0.scorer.w_key.dtype == (
        torch.float32
    )
    # Both run bf16 matmuls and round attention outputs to bf16 (8 mantissa bits) per layer.
    torch.testing.assert_close(logits.float(), expected, rtol=2**-6, atol=2**-6)


def layer_positions(cache):
    return [layer.state.cached_positions() for layer in cache.layers]


def test_prefill_equals_single_token_steps():
    model = kc.transform(tiny_qwen3(), TIGHT)
    ids = prompt(length=40)
    parallel, stepped = kc.new_cache(model), kc.new_cache(model)
    with torch.no_grad():
        prefill_logits = model(ids, **cache_kwargs(parallel)).logits
        step_logits = torch.cat(
            [
                model(
                    ids[:, i : i + 1], **cache_kwargs(stepped), position_ids=torch.tensor([[i]])
                ).logits
                for i in range(ids.shape[1])
            ],
            dim=1,
        )
    torch.testing.assert_close(prefill_logits, step_logits, rtol=1e-4, atol=1e-4)
    assert layer_positions(parallel) == layer_positions(stepped)
    assert all(len(p) == TIGHT.capacity for layer in layer_positions(parallel) for p in layer[0])


def test_cache_bytes_do_not_grow_with_generated_length():
    model = kc.transform(tiny_qwen3(), TIGHT)
    ids = prompt(length=8)
    short, long = kc.new_cache(model), kc.new_cache(model)
    kc.generate(model, ids, 50, cache=short)
    kc.generate(model, ids, 500, cache=long)
    assert short.nbytes == long.nbytes > 0
    assert int(long.get_seq_length()) == 8 + 500 - 1  # the last token is returned, not cached


def test_generate_helper_matches_hf_generate():
    model = kc.transform(tiny_qwen3(), TIGHT)
    ids = prompt(length=10)
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=40, do_sample=False)
    assert torch.equal(kc.generate(model, ids, 40), expected)


def test_forward_returns_a_reusable_kvpop_cache():
    model = kc.transform(tiny_qwen3(), TIGHT)
    ids = prompt(length=20)
    with torch.no_grad():
        whole = model(ids).logits[:, -1]
        first = model(ids[:, :12])
        assert isinstance(first.past_key_values, kc.KVpopCache)
        # The remaining 8 tokens continue the cached sequence one by one.
        rest = model(
            ids[:, 12:],
            **cache_kwargs(first.past_key_values),
            position_ids=torch.arange(12, 20)[None],
        )
    torch.testing.assert_close(rest.logits[:, -1], whole, rtol=1e-4, atol=1e-4)


def test_qwen3_0_6b_layer_shapes_smoke():
    model = tiny_qwen3(
        vocab_size=512, hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, num_hidden_layers=2,
    )  # fmt: skip
    model = kc.transform(model, kc.KVpopConfig(sinks=4, window=8, topk=16))
    out = kc.generate(model, prompt(length=40, batch=1) % 512, 6)
    assert out.shape == (1, 46)
    state = model.model.layers[0].self_attn.graph.kvpop_attention_0
    assert state.scorer.num_kv_heads == 8 and state.scorer.head_dim == 128


def test_transform_errors():
    with pytest.raises(ValueError, match="LlamaForCausalLM .* has no Qwen3-style attention"):
        llama = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=32,
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
            )
        )
        kc.transform(llama, ROOMY)
    with pytest.raises(ValueError, match="capacity 4096 .* exceeds the model's max_position"):
        kc.transform(tiny_qwen3(max_position_embeddings=1024), kc.KVpopConfig())
    twice = kc.transform(tiny_qwen3(), ROOMY)
    with pytest.raises(ValueError, match="already transformed"):
        kc.transform(twice, ROOMY)
    with pytest.raises(ValueError, match="already compiled"):
        kc.transform(torch.compile(tiny_qwen3()), ROOMY)
    with pytest.raises(ValueError, match="sliding-window attention"):
        kc.transform(tiny_qwen3(use_sliding_window=True, sliding_window=8), ROOMY)
    with pytest.raises(TypeError, match="config must be a KVpopConfig, got dict"):
        kc.transform(tiny_qwen3(), {"window": 4})
    with pytest.raises(ValueError, match="is not transformed"):
        kc.compile(tiny_qwen3())
    with pytest.raises(ValueError, match="backend must be one of inductor, tensorrt; got 'xla'"):
        kc.compile(kc.transform(tiny_qwen3(), ROOMY), backend="xla")


def test_a_filled_foreign_cache_is_refused():
    from transformers import DynamicCache

    original = tiny_qwen3()
    filled = original(
        prompt(length=4), **cache_kwargs(DynamicCache(config=original.config))
    ).past_key_values
    model = kc.transform(original, ROOMY)
    with pytest.raises(TypeError, match="keeps its KV state in a KVpopCache, got a filled Dyn"):
        model(prompt(length=1, batch=2), **cache_kwargs(filled))


def test_training_mode_is_refused():
    model = kc.transform(tiny_qwen3(), ROOMY).train()
    with pytest.raises(RuntimeError, match="runs inference only"):
        model(prompt(length=3))


def test_masks_it_cannot_honour_are_refused():
    model = kc.transform(tiny_qwen3(), ROOMY)
    ids = prompt(length=6)
    padded = torch.ones_like(ids)
    padded[0, -2:] = 0
    with pytest.raises(ValueError, match="row 0 has padding after a token"):
        model(ids, padded)  # positional, right padding
    with pytest.raises(ValueError, match="ignores custom or prepared attention masks"):
        model(ids, attention_mask=torch.ones(2, 1, 6, 6))
    with pytest.raises(ValueError, match="not a StaticCache .*cache_implementation='static'"):
        model.generate(ids, max_new_tokens=2, cache_implementation="static")
    model(ids, torch.ones_like(ids))  # an all-ones mask is fine


def test_decoder_stack_called_directly_keeps_its_cache():
    original = tiny_qwen3()
    ids = prompt(length=10)
    with torch.no_grad():
        expected = original.model(ids).last_hidden_state[:, -1]
        model = kc.transform(original, ROOMY)
        first = model.model(ids[:, :6])
        assert isinstance(first.past_key_values, kc.KVpopCache)
        rest = model.model(ids[:, 6:], **cache_kwargs(first.past_key_values))
    torch.testing.assert_close(rest.last_hidden_state[:, -1], expected, rtol=1e-4, atol=1e-4)


def test_generate_continues_a_cache_at_the_right_positions():
    original = tiny_qwen3()
    ids = prompt(length=8)
    with torch.no_grad():
        expected = original.generate(ids, max_new_tokens=15, do_sample=False)
    model = kc.transform(original, ROOMY)
    cache = kc.new_cache(model)
    first = kc.generate(model, ids, 5, cache=cache)
    # The cache holds all but the last generated token: continue from that token.
    rest = kc.generate(model, first[:, -1:], 10, cache=cache)
    assert torch.equal(torch.cat([first, rest[:, 1:]], dim=1), expected)


def test_state_dict_keeps_the_original_names_and_the_model_pickles(tmp_path):
    original = tiny_qwen3()
    names = set(original.state_dict())
    model = kc.transform(original, ROOMY)
    transformed_names = set(model.state_dict())
    assert names <= transformed_names
    assert all(".self_attn.scorer." in n for n in transformed_names - names)
    torch.save(model, tmp_path / "model.pt")
    reloaded = torch.load(tmp_path / "model.pt", weights_only=False)
    ids = prompt(length=6)
    assert torch.equal(kc.generate(reloaded, ids, 8), kc.generate(model, ids, 8))


def test_dtype_change_after_transform_is_refused():
    model = kc.transform(tiny_qwen3(), ROOMY).to(torch.bfloat16)
    with pytest.raises(ValueError, match="transformed in torch.float32 and now runs in torch.bf"):
        model(prompt(length=3))


def test_bad_generation_inputs_are_refused():
    model = kc.transform(tiny_qwen3(), ROOMY)
    with pytest.raises(ValueError, match=r"input_ids must be integer token ids of shape"):
        kc.generate(model, torch.tensor([1, 2, 3]), 2)
    with pytest.raises(ValueError, match=r"input_ids must be integer token ids of shape"):
        kc.generate(model, torch.zeros(1, 0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"expected position of shape \(1, 1\), got \(\)"):
        kc.decode_one_token(model, torch.tensor([[1]]), torch.tensor(3), kc.new_cache(model))
    with pytest.raises(ValueError, match=r"expected token of shape \(batch, 1\), got \(1, 2\)"):
        kc.decode_one_token(model, torch.tensor([[1, 2]]), None, kc.new_cache(model))
    other = kc.KVpopCache(2, kc.KVpopConfig(sinks=1, window=2, topk=3))
    with pytest.raises(ValueError, match="this KVpopCache was made for"):
        kc.generate(model, prompt(length=3), 2, cache=other)
