"""Batches of prompts of different lengths, left-padded: every row gets exactly what it gets
alone, through ``model.generate()``, ``kc.generate`` (eager and compiled) and an engine, and
padding never reaches a cache or a scorer's state."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import TINY, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.config import ScorerKind

# Capacity 16: every prompt here longer than 16 tokens has evicted before it ends.
TIGHT = {"sinks": 2, "window": 4, "topk": 10}
PAD = 0
SCORERS = [kind.value for kind in ScorerKind]


def left_padded(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of ``lengths`` as ``(ids, attention_mask)``, left-padded to the longest."""
    generator = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    ids = torch.full((len(lengths), longest), PAD)
    mask = torch.zeros(len(lengths), longest, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, longest - length :] = torch.randint(1, TINY["vocab_size"], (length,),
                                                     generator=generator)  # fmt: skip
        mask[row, longest - length :] = 1
    return ids, mask


def alone(ids: torch.Tensor, mask: torch.Tensor, row: int) -> torch.Tensor:
    """Row ``row``'s prompt without its padding: ``(1, length)``."""
    return ids[row : row + 1, int((mask[row] == 0).sum()) :]


def pool_by_position(state, row: int) -> torch.Tensor:
    """Row ``row``'s pool priorities ``(H, K)`` in position order (a pool's slot order is free)."""
    sinks, topk = TIGHT["sinks"], TIGHT["topk"]
    positions = state.positions[row, :, sinks : sinks + topk]
    return state.priorities[row].gather(-1, positions.argsort(dim=-1))


@pytest.fixture(scope="module")
def models():
    return {
        scorer: kc.transform(tiny_qwen3(), kc.KVpopConfig(scorer=scorer, **TIGHT))
        for scorer in SCORERS
    }


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    scorer=st.sampled_from(SCORERS),
    lengths=st.lists(st.integers(1, 45), min_size=2, max_size=4),
    chunk=st.sampled_from([None, 1, 7, 64]),
    seed=st.integers(0, 1000),
)
def test_each_row_of_a_padded_batch_decodes_as_it_does_alone(models, scorer, lengths, chunk, seed):
    """Prefill (in chunks that cut the padding anywhere) then decode: each row's logits and
    cached state equal those of its prompt run alone."""
    model = models[scorer]
    ids, mask = left_padded(lengths, seed)
    cache = kc.new_cache(model)
    logits = kc.prefill(model, ids, cache, chunk=chunk, attention_mask=mask)
    token = logits.argmax(-1, keepdim=True)
    after = kc.decode_one_token(model, token, None, cache)
    for row in range(len(lengths)):
        own = kc.new_cache(model)
        own_logits = kc.prefill(model, alone(ids, mask, row), own, chunk=chunk)
        own_after = kc.decode_one_token(model, token[row : row + 1], None, own)
        torch.testing.assert_close(logits[row : row + 1], own_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(after[row : row + 1], own_after, rtol=1e-5, atol=1e-5)
        for batched, single in zip(cache.layers, own.layers, strict=True):
            b, s = batched.state, single.state
            assert b.seen[row].item() == s.seen.item() == lengths[row] + 1
            assert b.cached_positions()[row] == s.cached_positions()[0]
            torch.testing.assert_close(b.scorer_state[row : row + 1], s.scorer_state)
            torch.testing.assert_close(pool_by_position(b, row), pool_by_position(s, 0))


@pytest.mark.parametrize("scorer", ["memory", "h2o"])
def test_model_generate_with_left_padding_gives_each_row_its_own_tokens(models, scorer):
    """transformers' ``generate()`` with a padded batch, prefilling in chunks: the tokens of
    each row equal its own ``generate()``'s, and ``kc.generate`` gives the same batch."""
    model = models[scorer]
    ids, mask = left_padded([40, 9, 23], seed=3)
    theirs = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                            pad_token_id=PAD, eos_token_id=None)  # fmt: skip
    ours = kc.generate(model, ids, 20, attention_mask=mask, eos_token_id=None)
    assert torch.equal(ours, theirs)
    for row in range(3):
        prompt = alone(ids, mask, row)
        own = model.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None,
                             pad_token_id=PAD)  # fmt: skip
        assert torch.equal(theirs[row, ids.shape[1] :], own[0, prompt.shape[1] :])


def test_compiled_step_decodes_rows_at_their_own_positions(models):
    model = models["memory"]
    ids, mask = left_padded([30, 5], seed=1)
    step = kc.compile(model)
    compiled = kc.generate(model, ids, 12, attention_mask=mask, step=step, eos_token_id=None)
    eager = kc.generate(model, ids, 12, attention_mask=mask, eos_token_id=None)
    assert torch.equal(compiled, eager)
    own = kc.generate(model, alone(ids, mask, 1), 12, eos_token_id=None)
    assert torch.equal(compiled[1, ids.shape[1] :], own[0, 5:])


def test_onnx_engine_generates_each_row_as_alone(models, tmp_path):
    model = models["memory"]
    ids, mask = left_padded([26, 7, 15], seed=2)
    runner = kc.load(kc.export(model, tmp_path / "onnx", "onnx", batch=3))
    tokens = runner.generate(ids, 10, attention_mask=mask)
    assert torch.equal(tokens, kc.generate(model, ids, 10, attention_mask=mask, eos_token_id=None))
    with pytest.raises(ValueError, match="padding after a token"):
        runner.generate(ids, 2, attention_mask=mask.flip(1))


def test_masks_that_are_not_left_padding_are_refused(models):
    model = models["memory"]
    ids, mask = left_padded([6, 4])
    with pytest.raises(ValueError, match="row 1 has padding after a token: KVpop takes left"):
        model(ids, attention_mask=mask.flip(1))
    with pytest.raises(ValueError, match="pads every row at its first column"):
        model(ids, attention_mask=torch.cat([torch.zeros(2, 1, dtype=torch.long), mask], 1)[:, 1:]
              * torch.tensor([0, 1, 1, 1, 1, 1]))  # fmt: skip
    with pytest.raises(ValueError, match=r"attention_mask must have input_ids' shape \(2, 6\)"):
        kc.prefill(model, ids, kc.new_cache(model), attention_mask=mask[:, 1:])


def test_a_forward_without_cache_honours_padding(models):
    """``model(ids, attention_mask)`` for logits, no cache kept: each row's last logits are its
    own."""
    model = models["window"]
    ids, mask = left_padded([12, 3], seed=5)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, use_cache=False).logits[:, -1]
        for row in range(2):
            own = model(alone(ids, mask, row), use_cache=False).logits[:, -1]
            torch.testing.assert_close(logits[row : row + 1], own, rtol=1e-5, atol=1e-5)
