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


def test_rows_that_stop_at_different_steps_are_padded_with_the_first_stop_id(model):
    """Several stop ids, no pad id: row 0 stops on the second id after 2 tokens, row 1 on the
    first id after 6, so row 0 is padded for 4 steps, with the first id (as transformers'
    ``generate()`` pads when no pad id is set), not with the one that stopped it."""
    ids = prompt(length=20, batch=2)
    free = kc.generate(model, ids, 12, eos_token_id=None)
    stops = [int(free[1, 20 + 5]), int(free[0, 20 + 1])]
    assert stops[0] != stops[1] and model.generation_config.pad_token_id is None
    ends = [free[row, 20:].tolist().index(stop) for row, stop in ((0, stops[1]), (1, stops[0]))]
    assert ends == [1, 5]  # neither row meets the other's stop id before its own
    expected = free[:, : 20 + 6].clone()
    expected[0, 20 + 2 :] = stops[0]
    ours = kc.generate(model, ids, 12, eos_token_id=stops)
    assert torch.equal(ours, expected)
    theirs = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=stops)
    assert torch.equal(ours, theirs)


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


def test_sampling_defaults_to_the_generation_configs_settings(model):
    """With no setting in the call, sampling takes the model's generation config's (here top-k
    3 at temperature 0.5, as a model's shipped config may set them), as ``model.generate()``
    does; they are not transformers' global defaults (top-k 50, temperature 1)."""
    ids = prompt(length=24, batch=2)
    config = model.generation_config
    saved = config.top_k, config.temperature
    config.top_k, config.temperature = 3, 0.5
    try:
        ours = kc.generate(model, ids, 20, do_sample=True, seed=5)
        torch.manual_seed(5)
        theirs = model.generate(ids, max_new_tokens=20, do_sample=True)
    finally:
        config.top_k, config.temperature = saved
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, kc.generate(model, ids, 20, do_sample=True, seed=5))


def test_seed_zero_seeds_its_own_generator(model):
    """``seed=0`` is a seed like any other: with the global generator elsewhere, the tokens are
    ``model.generate()``'s after ``torch.manual_seed(0)``, and the global state is untouched."""
    ids = prompt(length=24, batch=2)
    torch.manual_seed(123)
    ours = kc.generate(model, ids, 20, do_sample=True, seed=0)
    global_draw = torch.rand(1)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), global_draw)
    torch.manual_seed(0)
    theirs = model.generate(ids, max_new_tokens=20, do_sample=True)
    assert torch.equal(ours, theirs)
    torch.manual_seed(123)
    assert not torch.equal(theirs, model.generate(ids, max_new_tokens=20, do_sample=True))


@pytest.mark.parametrize("full_mask", [True, False], ids=["ones_mask", "no_mask"])
def test_a_continued_prefill_of_a_padded_batch_counts_on_from_each_rows_length(model, full_mask):
    """A left-padded batch (rows of 19 and 6 tokens), then a second chunk of 7 tokens per row
    (its mask all ones, or none) and greedy decoding from the same cache: each row's logits
    and tokens are those of its own prompt run alone through the same two calls."""
    lengths, more = (19, 6), prompt(seed=9, batch=2, length=7)
    ids = torch.zeros(2, max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    rows = [prompt(seed=4 + row, batch=1, length=n) for row, n in enumerate(lengths)]
    for row, (n, own) in enumerate(zip(lengths, rows, strict=True)):
        ids[row, -n:], mask[row, -n:] = own[0], 1
    cache = kc.new_cache(model)
    kc.prefill(model, ids, cache, attention_mask=mask)
    more_mask = torch.ones_like(more) if full_mask else None
    logits = kc.prefill(model, more, cache, attention_mask=more_mask)
    tokens = kc.generate(model, logits.argmax(-1, keepdim=True), 10, cache=cache, eos_token_id=None)
    for row, own in enumerate(rows):
        alone = kc.new_cache(model)
        kc.prefill(model, own, alone)
        own_logits = kc.prefill(model, more[row : row + 1], alone)
        own_tokens = kc.generate(model, own_logits.argmax(-1, keepdim=True), 10, cache=alone,
                                 eos_token_id=None)  # fmt: skip
        assert [int(layer.state.seen[row]) for layer in cache.layers] == [lengths[row] + 7 + 10] * 2
        # A batch of two rows and a single row sum the same float32 terms in another order
        # (a few ulps of unit-scale logits); a wrong position moves them by O(1).
        torch.testing.assert_close(logits[row : row + 1], own_logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(tokens[row : row + 1], own_tokens)


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
