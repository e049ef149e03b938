"""A KVpopCache's rows as transformers' generation handles them: re-arranged (a beam reorder, a
row repeated per returned sequence, a subset), each row continues the sequence it was given;
and a left-padded batch's cache, continued by ``generate()``, counts the columns run so far."""

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.kv_cache import cache_kwargs

CONFIG = kc.KVpopConfig(sinks=2, window=4, topk=10, scorer="memory")  # capacity 16 < 20


@pytest.fixture(scope="module")
def model():
    return kc.transform(tiny_qwen3(), CONFIG)


def next_logits_alone(model, ids: torch.Tensor, token: int) -> torch.Tensor:
    """``ids (1, N)`` prefilled into a cache of its own, then ``token``: logits ``(1, vocab)``."""
    cache = kc.new_cache(model)
    kc.prefill(model, ids, cache)
    return kc.decode_one_token(model, torch.tensor([[token]]), None, cache)


@pytest.mark.parametrize(
    ("rearrange", "rows"),
    [
        (lambda cache: cache.batch_repeat_interleave(2), [0, 0, 1, 1, 2, 2]),
        (lambda cache: cache.reorder_cache(torch.tensor([2, 0, 1])), [2, 0, 1]),
        (lambda cache: cache.batch_select_indices(torch.tensor([2, 1])), [2, 1]),
    ],
    ids=["repeat_interleave", "reorder", "select"],
)
@torch.no_grad()
def test_rearranged_rows_continue_their_own_sequences(model, rearrange, rows):
    """Three different 20-token prompts (each past the capacity, so each cache has evicted):
    after the rearrangement, row ``i`` decodes as prompt ``rows[i]`` alone does."""
    ids = prompt(seed=3, batch=3, length=20)
    cache = kc.new_cache(model)
    kc.prefill(model, ids, cache)
    rearrange(cache)
    tokens = [5 + 2 * i for i in range(len(rows))]
    logits = kc.decode_one_token(model, torch.tensor(tokens).view(-1, 1), None, cache)
    for i, (row, token) in enumerate(zip(rows, tokens, strict=True)):
        alone = next_logits_alone(model, ids[row : row + 1], token)
        # A batch and a single row sum the same float32 terms in another order (a few ulps of
        # unit-scale logits); another row's cache moves them by O(1).
        torch.testing.assert_close(logits[i : i + 1], alone, rtol=1e-5, atol=1e-5)


def test_generate_continues_a_left_padded_cache_from_the_columns_it_holds(model):
    """Rows of 19 and 6 tokens, left-padded; the first 15 columns prefilled (row 1 holds 2
    tokens, row 0 15). ``generate()`` given the whole batch and that cache runs only the
    columns after the 15th and gives the tokens of a run from an empty cache."""
    lengths = (19, 6)
    ids = torch.zeros(2, 19, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, -n:], mask[row, -n:] = prompt(seed=7 + row, batch=1, length=n)[0], 1
    options = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None,
                   pad_token_id=0)  # fmt: skip
    expected = model.generate(ids, **options)
    cache = kc.new_cache(model)
    kc.prefill(model, ids[:, :15], cache, attention_mask=mask[:, :15])
    assert [int(seen) for seen in cache.layers[0].state.seen] == [15, 2]
    assert torch.equal(model.generate(ids, **options, **cache_kwargs(cache)), expected)
