"""transformers' ``generate()`` on a transformed model with the inputs the chunked prefill does
not cover (``inputs_embeds``, ``use_cache=False``), and saving: the tokens are the bounded
cache's (``kc.generate``), and ``save_pretrained``, which would lose the scorer, is refused."""

import copy
import pickle

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.scorer_io import saved_config

TIGHT = kc.KVpopConfig(sinks=2, window=4, topk=6, scorer="memory", prefill_chunk=5)  # cap 12
NEW = 20


@pytest.fixture(scope="module")
def model():
    return kc.transform(tiny_qwen3(), TIGHT)


def test_generate_from_embeddings_gives_the_tokens_of_the_ids(model):
    ids = prompt(length=17)
    expected = kc.generate(model, ids, NEW, eos_token_id=None)[:, ids.shape[1] :]
    with torch.no_grad():
        embeddings = model.model.embed_tokens(ids)
    tokens = model.generate(inputs_embeds=embeddings, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(tokens, expected)


def test_generate_without_a_cache_gives_the_bounded_caches_tokens(model):
    """Without a cache every step runs the whole sequence through the bounded attention's
    parallel rule, which keeps what the streaming rule keeps: the same tokens."""
    ids = prompt(seed=3, length=17)
    expected = kc.generate(model, ids, NEW, eos_token_id=None)
    tokens = model.generate(ids, max_new_tokens=NEW, do_sample=False, use_cache=False)
    assert torch.equal(tokens, expected)


def test_a_chunk_size_the_caller_passes_is_used(model):
    ids = prompt(seed=4, length=17)
    expected = kc.generate(model, ids, NEW, eos_token_id=None)
    for chunk in (3, 100):
        tokens = model.generate(ids, max_new_tokens=NEW, do_sample=False, prefill_chunk_size=chunk)
        assert torch.equal(tokens, expected)


def test_copies_generate_with_their_own_weights(model):
    ids = prompt(seed=5, length=9)
    expected = kc.generate(model, ids, 8, eos_token_id=None)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert other.generate.model is other
        assert torch.equal(other.generate(ids, max_new_tokens=8, do_sample=False), expected)
        with torch.no_grad():
            for p in other.parameters():
                p.add_(0.5)
        assert not torch.equal(other.generate(ids, max_new_tokens=8, do_sample=False), expected)


def test_save_pretrained_is_refused_and_the_documented_round_trip_keeps_the_scorer(tmp_path):
    original = tiny_qwen3()
    original.save_pretrained(tmp_path / "model")  # before transform, as the message says
    model = kc.transform(original, TIGHT)
    with torch.no_grad():
        for p in model.model.layers[0].self_attn.scorer.parameters():
            p.mul_(-3.0)  # a scorer unlike a fresh one
    with pytest.raises(ValueError, match="save_pretrained is not supported .* drop its scorer"):
        model.save_pretrained(tmp_path / "transformed")
    assert not (tmp_path / "transformed").exists()
    assert model.generation_config.prefill_chunk_size is None
    kc.save_scorer(model, tmp_path / "scorer")
    ids = prompt(seed=6, length=30)
    expected = kc.generate(model, ids, NEW, eos_token_id=None)

    reloaded = type(original).from_pretrained(tmp_path / "model").eval()
    reloaded = kc.transform(reloaded, saved_config(tmp_path / "scorer"))
    fresh = kc.generate(reloaded, ids, NEW, eos_token_id=None)
    kc.load_scorer(reloaded, tmp_path / "scorer")
    assert torch.equal(kc.generate(reloaded, ids, NEW, eos_token_id=None), expected)
    assert not torch.equal(fresh, expected)  # the scorer, not the weights, decides
