"""The ways of running a model over a sequence: teacher-forced, greedy continuation and
prompt compression, each of a bounded cache that holds everything equal to full attention."""

import pytest
import torch
from tiny_models import tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.evaluation.protocols import (
    compressed_prompt,
    greedy_continuation,
    teacher_forced,
)


def test_bounded_cache_that_holds_everything_scores_like_full_attention():
    model = tiny_qwen3()
    ids = torch.randint(0, 256, (2, 97), generator=torch.Generator().manual_seed(0))
    roomy = kc.transform(tiny_qwen3(), kc.KVpopConfig(sinks=4, window=8, topk=100))
    full, bounded = teacher_forced(model, ids), teacher_forced(roomy, ids)
    assert torch.equal(full.correct, bounded.correct)
    torch.testing.assert_close(full.nll, bounded.nll, rtol=1e-4, atol=1e-5)


def test_compression_protocol_with_full_attention_is_teacher_forcing_of_the_suffix():
    model = tiny_qwen3()
    ids = torch.randint(0, 256, (2, 65), generator=torch.Generator().manual_seed(1))
    whole, suffix = teacher_forced(model, ids), compressed_prompt(model, model, ids, 40)
    assert suffix.correct.shape == (2, 24)
    assert torch.equal(whole.correct[:, 40:], suffix.correct)
    torch.testing.assert_close(whole.nll[:, 40:], suffix.nll, rtol=1e-4, atol=1e-5)


def test_compression_protocol_reads_each_layer_of_a_per_layer_budget_with_its_own_mask():
    model = tiny_qwen3()
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(3))
    one = kc.KVpopConfig(sinks=2, window=5, topk=17, scorer="window")
    listed = kc.KVpopConfig(sinks=2, window=(5, 5), topk=(17, 17), scorer="window")
    # Equal layers: the masks built per layer read exactly what transformers' one mask reads.
    got = compressed_prompt(model, kc.transform(tiny_qwen3(), listed), ids, 45)
    want = compressed_prompt(model, kc.transform(tiny_qwen3(), one), ids, 45)
    assert torch.equal(got.correct, want.correct)
    torch.testing.assert_close(got.nll, want.nll, rtol=0, atol=1e-6)
    # Layers of different sizes each read their own; the model's layer types are restored.
    types = list(model.config.layer_types)
    uneven = kc.KVpopConfig(sinks=2, window=(5, 9), topk=(17, 3), scorer="window")
    scores = compressed_prompt(model, kc.transform(tiny_qwen3(), uneven), ids, 45)
    assert scores.nll.shape == (2, 24) and bool(torch.isfinite(scores.nll).all())
    assert not torch.equal(scores.nll, want.nll)
    assert model.config.layer_types == types


def test_compression_protocol_needs_a_filled_cache_and_a_valid_prompt():
    model = tiny_qwen3()
    bounded = kc.transform(tiny_qwen3(), kc.KVpopConfig(sinks=2, window=4, topk=30))
    ids = torch.randint(0, 256, (1, 33))
    with pytest.raises(ValueError, match="empty slots: the prompt must be longer"):
        compressed_prompt(model, bounded, ids, 20)
    with pytest.raises(ValueError, match="prompt_length must be in 1..31, got 32"):
        compressed_prompt(model, bounded, ids, 32)


def test_greedy_continuation_of_a_roomy_bounded_cache_equals_full_cache():
    model = tiny_qwen3()
    roomy = kc.transform(tiny_qwen3(), kc.KVpopConfig(sinks=2, window=8, topk=60))
    prompt = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(2))
    full = greedy_continuation(model, prompt, 24, record_at={30, 40})
    bounded = greedy_continuation(roomy, prompt, 24, record_at={30, 40})
    assert torch.equal(full.tokens, bounded.tokens)
    assert full.cache_bytes[40] > full.cache_bytes[30]
    assert bounded.cache_bytes[40] == bounded.cache_bytes[30]
