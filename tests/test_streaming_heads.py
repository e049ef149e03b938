"""Streaming heads: a head whose scorer output is zeroed keeps exactly the most recent tokens,
in prefill and decode, and every other head keeps what it kept."""

import pytest
import torch
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.streaming_heads import make_streaming_heads, streaming_heads

SINKS, WINDOW, TOPK = 2, 3, 6


def _config(scorer: str = "memory", lam: float = 0.01, **fields) -> kc.KVpopConfig:
    return kc.KVpopConfig(sinks=SINKS, window=WINDOW, topk=TOPK, scorer=scorer, lam=lam,
                          memory_dim=8, memory_value_dim=8, scorer_hidden=16, **fields)  # fmt: skip


def _transformed(scorer: str = "memory", lam: float = 0.01, seed: int = 3, **fields):
    model = kc.transform(tiny_qwen3(), _config(scorer, lam, **fields))
    torch.manual_seed(seed)
    with torch.no_grad():  # trained-looking readouts: a random nonzero bias per head
        for layer in model.model.layers:
            layer.self_attn.scorer.readout_mlp().b2.normal_()
    return model


def _kept(model, ids: torch.Tensor, decode_steps: int) -> tuple[list, torch.Tensor]:
    """Each layer's cached positions ``(B, H, capacity)`` after a prefill of ``ids`` less its
    last ``decode_steps`` tokens and those fed one at a time (fixed tokens, not generated ones,
    so that every model sees the same input), and the last logits."""
    prefill = ids.shape[1] - decode_steps
    with torch.no_grad():
        out = model(ids[:, :prefill], use_cache=True)
        cache = out.past_key_values
        for step in range(prefill, ids.shape[1]):
            out = model(ids[:, step : step + 1], past_key_values=cache, use_cache=True)
    return [layer.state.positions.clone() for layer in cache.layers], out.logits[:, -1]


def _recent(seen: int) -> set[int]:
    """What a streaming head holds after ``seen`` tokens: the sinks and the newest rest."""
    return set(range(SINKS)) | set(range(seen - WINDOW - TOPK, seen))


# Streaming heads in the last layer only, and in both layers with a spread of scores, a chunked
# prefill and the smallest recency term the selection uses.
SETTINGS = [
    ([(1, 0)], {"lam": 0.01}),
    ([(1, 0), (0, 1)], {"lam": 1e-6, "priority_span": 3, "prefill_chunk": 5}),
]


@pytest.mark.parametrize("scorer", ["memory", "mlp"])
@pytest.mark.parametrize("decode_steps", [0, 7])
@pytest.mark.parametrize("heads, settings", SETTINGS, ids=["last-layer", "spread-chunked"])
def test_a_streaming_head_keeps_the_newest_tokens_and_the_others_are_unchanged(
    scorer, decode_steps, heads, settings
):
    ids = prompt(seed=5, batch=2, length=40)
    before, _ = _kept(_transformed(scorer, **settings), ids, decode_steps)
    model = _transformed(scorer, **settings)
    assert make_streaming_heads(model, heads) == sorted(heads)
    assert streaming_heads(model) == sorted(heads)
    after, _ = _kept(model, ids, decode_steps)
    seen = ids.shape[1]
    # A head's inputs change once an earlier layer keeps other tokens; up to the first layer
    # with a streaming head, the learned heads see the same keys and keep the same tokens.
    first = min(layer for layer, _ in heads)
    for layer in range(2):
        for head in range(2):
            for row in range(2):
                kept = after[layer][row, head].tolist()
                if (layer, head) in heads:
                    assert set(kept) == _recent(seen), (layer, head, row)
                elif layer <= first:
                    assert kept == before[layer][row, head].tolist(), (layer, head, row)
    # The learned heads kept something other than the newest tokens: the test tells them apart.
    for layer, head in heads:
        assert any(set(before[layer][row, head].tolist()) != _recent(seen) for row in range(2))


def test_every_head_streaming_is_the_window_policy_at_the_same_capacity():
    ids = prompt(seed=6, batch=2, length=33)
    model = _transformed("memory")
    make_streaming_heads(model, [(layer, head) for layer in range(2) for head in range(2)])
    same_capacity = kc.KVpopConfig(sinks=SINKS, window=1, topk=WINDOW + TOPK - 1, scorer="window")
    window = kc.transform(tiny_qwen3(), same_capacity)
    kept, logits = _kept(model, ids, 5)
    window_kept, window_logits = _kept(window, ids, 5)
    for ours, theirs in zip(kept, window_kept, strict=True):
        assert torch.equal(ours.sort(-1).values, theirs.sort(-1).values)
    torch.testing.assert_close(logits, window_logits)


def test_streaming_heads_survive_saving_and_loading(tmp_path):
    model = _transformed("memory")
    make_streaming_heads(model, [(1, 1)])
    kc.save_scorer(model, tmp_path / "scorer")
    loaded = kc.load_scorer(kc.transform(tiny_qwen3(), _config()), tmp_path / "scorer")
    assert streaming_heads(loaded) == [(1, 1)]
    assert streaming_heads(_transformed("memory")) == []


def test_a_head_is_streaming_only_when_its_whole_readout_layer_is_zero():
    model = _transformed("mlp")
    readout = model.model.layers[1].self_attn.scorer.readout_mlp()
    with torch.no_grad():
        readout.w2[0].zero_()  # a constant score, b2's, is not zero: not a streaming head
    assert streaming_heads(model) == []
    with torch.no_grad():
        readout.b2[0].zero_()
    assert streaming_heads(model) == [(1, 0)]
    # A heuristic scorer has no readout and so no streaming heads.
    assert streaming_heads(kc.transform(tiny_qwen3(), _config("knorm"))) == []


@pytest.mark.parametrize(
    "heads, message",
    [
        ([(2, 0)], r"streaming head \(2, 0\) is out of range: layers 0..1, KV heads 0..1"),
        ([(0, -1)], r"streaming head \(0, -1\) is out of range"),
        ([(0, 1, 2)], r"a \(layer, kv_head\) pair of ints, got \(0, 1, 2\)"),
        ([(0, 1.0)], r"a \(layer, kv_head\) pair of ints, got \(0, 1.0\)"),
        ([(0, True)], r"pair of ints, got \(0, True\)"),
        ([(1, 1), (0, 1), [0, 1]], r"streaming heads name \(0, 1\) twice"),
        ((0, 1), r"got the pair \(0, 1\) alone: write \[\(0, 1\)\]"),
        (5, r"heads must be a list of \(layer, kv_head\) pairs, got 5"),
        ("01", r"heads must be a list of \(layer, kv_head\) pairs, got '01'"),
    ],
)
def test_bad_heads_are_refused_by_name(heads, message):
    with pytest.raises(ValueError, match=message):
        make_streaming_heads(_transformed(), heads)


@pytest.mark.parametrize("lam", [0.0, 1e-50])
def test_streaming_heads_need_a_recency_term_that_orders_positions_in_float32(lam):
    # 1e-50 is > 0 in Python but 0 in float32: every token would tie and the oldest stay.
    with pytest.raises(ValueError, match=rf"need lam > 0 in float32 .*got lam={lam!r}: a head"):
        make_streaming_heads(_transformed(lam=lam), [(0, 0)])


def test_a_saved_scorer_with_streaming_heads_is_refused_where_lam_is_zero(tmp_path):
    model = _transformed("memory")
    make_streaming_heads(model, [(0, 1)])
    kc.save_scorer(model, tmp_path / "scorer")
    # The saved lam is not part of what must match (a user may choose it); with lam = 0 the
    # streaming head would keep the oldest tokens, so loading says so instead.
    zero_lam = kc.transform(tiny_qwen3(), _config(lam=0.0))
    with pytest.raises(ValueError, match=r"this scorer has streaming heads \[\(0, 1\)\], which "
                                         r"need lam > 0 in float32 .*got lam=0.0"):  # fmt: skip
        kc.load_scorer(zero_lam, tmp_path / "scorer")
    # The model's scorer was left as it was: the refusal comes before any tensor is loaded.
    assert streaming_heads(zero_lam) == []


def test_streaming_heads_need_a_learned_scorer_and_a_transformed_model():
    with pytest.raises(ValueError, match=r"need a learned scorer \(memory or mlp\); this model's "
                                         r"scorer is 'knorm'"):  # fmt: skip
        make_streaming_heads(kc.transform(tiny_qwen3(), _config("knorm")), [(0, 0)])
    with pytest.raises(ValueError, match="is not transformed: call kvpop_compile.transform"):
        make_streaming_heads(tiny_qwen3(), [(0, 0)])
