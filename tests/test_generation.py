"""``kc.generate`` and ``kc.decode_one_token``: stop ids and sampling as transformers'
``generate()`` does them, and a decode position that must agree with the cache."""

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc

CONFIG = kc.KVpopConfig(sinks=2, window=4, topk=10, scorer="memory")  # capacity 16


@pytest.fixture(scope="module")
def model():
    return kc.transform(tiny_qwen3(), CONFIG)


def test_a_position_that_disagrees_with_the_cache_is_refused(model):
    ids = prompt(length=40, batch=1)
    cache = kc.new_cache(model)
    kc.prefill(model, ids, cache)
    token = torch.tensor([[5]])
    disagrees = r"position \[7\] disagrees with the cache, whose rows hold \[40\] tokens"
    with pytest.raises(ValueError, match=disagrees):
        kc.decode_one_token(model, token, torch.tensor([[7]]), cache)
    with pytest.raises(ValueError, match=r"expected position of shape \(1, 1\), got \(1,\)"):
        kc.decode_one_token(model, token, torch.tensor([40]), cache)
    assert int(cache.get_seq_length()) == 40  # a refused step changes nothing
    stated = kc.decode_one_token(model, token, torch.tensor([[40]]), cache)
    other = kc.new_cache(model)
    kc.prefill(model, ids, other)
    from_cache = kc.decode_one_token(model, token, None, other)
    torch.testing.assert_close(stated, from_cache, rtol=0, atol=0)


def test_generation_stops_at_eos_like_transformers(model):
    """Two rows; the stop id is one that row 0 emits early: row 0 ends and is padded, row 1
    goes on, and the output equals ``model.generate()``'s."""
    ids = prompt(length=20, batch=2)
    free = kc.generate(model, ids, 12, eos_token_id=None)
    eos = int(free[0, 20 + 3])
    ours = kc.generate(model, ids, 12, eos_token_id=eos, pad_token_id=0)
    theirs = model.generate(
        ids, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    assert torch.equal(ours, theirs)
    first = free[0, 20:].tolist().index(eos)
    assert ours[0, 20 + first + 1 :].eq(0).all()
    # Several stop ids, the model's default pad (the first of them); all rows ending stops it.
    stops = [int(free[0, 21]), int(free[1, 21])]
    ours = kc.generate(model, ids, 12, eos_token_id=stops)
    theirs = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=stops)
    assert torch.equal(ours, theirs)
    assert ours.shape[1] < 20 + 12


def test_eos_defaults_to_the_generation_config(model):
    ids = prompt(length=20, batch=1)
    free = kc.generate(model, ids, 8, eos_token_id=None)
    model.generation_config.eos_token_id = int(free[0, 22])
    try:
        assert kc.generate(model, ids, 8).shape[1] == 23
    finally:
        model.generation_config.eos_token_id = None


@pytest.mark.parametrize(
    "settings",
    [
        {},  # the generation config's: temperature 1, top-k 50
        {"temperature": 0.7},
        {"top_k": 5},
        {"top_p": 0.9, "temperature": 1.3},
        {"top_k": 0, "top_p": 0.5},
    ],
)
def test_sampling_equals_transformers_with_the_same_seed(model, settings):
    ids = prompt(length=24, batch=2)
    ours = kc.generate(model, ids, 20, do_sample=True, seed=3, **settings)
    torch.manual_seed(3)
    theirs = model.generate(ids, max_new_tokens=20, do_sample=True, **settings)
    assert torch.equal(ours, theirs)
    again = kc.generate(model, ids, 20, do_sample=True, seed=3, **settings)
    assert torch.equal(ours, again)
    assert not torch.equal(ours, kc.generate(model, ids, 20, do_sample=True, seed=4, **settings))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.5}, r"temperature=0.5 needs do_sample=True"),
        ({"do_sample": True, "temperature": 0.0}, "temperature must be > 0, got 0.0"),
        ({"do_sample": True, "top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"do_sample": True, "top_k": -2}, "top_k must be an integer >= 1, got -2"),
        ({"do_sample": "yes"}, "do_sample must be True or False, got 'yes'"),
        ({"eos_token_id": -1}, "eos_token_id must be an integer >= 0, got -1"),
        ({"do_sample": True, "seed": 1.5}, "seed must be an integer >= 0, got 1.5"),
    ],
)
def test_bad_generation_options_are_named(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        kc.generate(model, prompt(length=5, batch=1), 3, **kwargs)
