"""Scorers: shapes, detached inputs, determinism, and memory parallel ≡ recurrent."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvpop_compile import KVpopConfig, ScorerKind
from kvpop_compile.runtime import MemoryScorer, build_scorer

STATIC = [kind for kind in ScorerKind if not kind.attention_fed]


def recurrent_scores(scorer, k, v, window):
    """Token t scored at step t + window, as decode does: ``(B, H, N)``, 0 for the tail."""
    batch, heads, n, _ = k.shape
    state = scorer.init_state(batch)
    scores = torch.zeros(batch, heads, n)
    for step in range(n):
        state = scorer.update_state(state, k[:, :, step], v[:, :, step])
        t = step - window
        if t >= 0:
            scores[:, :, t] = scorer.score(state, k[:, :, t], v[:, :, t], torch.tensor(t))
    return scores, state


@pytest.mark.parametrize("kind", STATIC)
@given(
    n=st.integers(1, 150),
    window=st.integers(1, 9),
    heads=st.integers(1, 3),
    head_dim=st.sampled_from([4, 16]),
    seed=st.integers(0, 2**31 - 1),
)
def test_parallel_scores_equal_recurrent_scores(kind, n, window, heads, head_dim, seed):
    generator = torch.Generator().manual_seed(seed)
    scorer = build_scorer(
        KVpopConfig(scorer=kind, memory_dim=8, memory_value_dim=6), heads, head_dim
    )
    k = torch.randn(2, heads, n, head_dim, generator=generator)
    v = torch.randn(2, heads, n, head_dim, generator=generator)
    with torch.no_grad():
        parallel, final = scorer.score_sequence(k, v, window)
        recurrent, state = recurrent_scores(scorer, k, v, window)
    assert parallel.shape == (2, heads, n) and parallel.dtype == torch.float32
    # Both forms sum the same float32 terms in a different order: error of a few ulps of the
    # memory's magnitude, far below any score difference that matters.
    torch.testing.assert_close(parallel, recurrent, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final, state, rtol=1e-4, atol=1e-5)


def test_memory_scorer_chunking_does_not_change_scores():
    scorer = build_scorer(KVpopConfig(scorer="memory"), 2, 8)
    k, v = torch.randn(1, 2, 200, 8), torch.randn(1, 2, 200, 8)
    with torch.no_grad():
        reference, _ = scorer.score_sequence(k, v, 5)
        scorer.chunk_size = 7
        chunked, _ = scorer.score_sequence(k, v, 5)
    torch.testing.assert_close(chunked, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", [ScorerKind.MEMORY, ScorerKind.MLP])
def test_learned_scorers_detach_inputs_and_train_their_parameters(kind):
    scorer = build_scorer(KVpopConfig(scorer=kind), 2, 8)
    k = torch.randn(1, 2, 30, 8, requires_grad=True)
    v = torch.randn(1, 2, 30, 8, requires_grad=True)
    scores, _ = scorer.score_sequence(k, v, 4)
    scores.sum().backward()
    assert k.grad is None and v.grad is None
    assert all(p.grad is not None for p in scorer.parameters())


def test_memory_scorer_sees_tokens_after_the_one_it_scores():
    # Changing a token inside the window after t changes t's score: the delay is real.
    scorer = build_scorer(KVpopConfig(scorer="memory"), 1, 8)
    k, v = torch.randn(1, 1, 20, 8), torch.randn(1, 1, 20, 8)
    with torch.no_grad():
        before, _ = scorer.score_sequence(k, v, 5)
        k[:, :, 8] += 3.0
        after, _ = scorer.score_sequence(k, v, 5)
    assert torch.equal(before[..., :3], after[..., :3])  # t + 5 < 8: not yet seen
    assert not torch.allclose(before[..., 3:8], after[..., 3:8])


def test_baseline_scores():
    k = torch.randn(1, 2, 10, 4)
    v = torch.randn(1, 2, 10, 4)
    window = build_scorer(KVpopConfig(scorer="window"), 2, 4).score_sequence(k, v, 1)[0]
    assert window[0, 0, :9].tolist() == [float(t) for t in range(9)]
    knorm = build_scorer(KVpopConfig(scorer="knorm"), 2, 4).score_sequence(k, v, 1)[0]
    torch.testing.assert_close(knorm[..., :9], -k.norm(dim=-1)[..., :9])


def test_random_scorer_is_seeded_and_varies_by_head_and_layer():
    k = torch.randn(1, 2, 64, 4)
    draw = lambda seed, layer: build_scorer(  # noqa: E731
        KVpopConfig(scorer="random", seed=seed), 2, 4, layer_idx=layer
    ).score_sequence(k, k, 1)[0]
    first = draw(0, 0)
    assert torch.equal(first, draw(0, 0))
    assert not torch.equal(first, draw(1, 0))
    assert not torch.equal(first, draw(0, 1))
    assert not torch.equal(first[0, 0], first[0, 1])
    assert ((first >= 0) & (first < 1)).all()


def test_learned_scorer_initialisation_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_scorer(KVpopConfig(scorer="mlp", seed=3), 2, 8, layer_idx=1)
    assert torch.equal(torch.rand(1), expected_next)
    b = build_scorer(KVpopConfig(scorer="mlp", seed=3), 2, 8, layer_idx=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert isinstance(build_scorer(KVpopConfig(), 2, 8), MemoryScorer)


@pytest.mark.parametrize("kind", ["memory", "mlp"])
def test_learned_scorer_initialisation_differs_by_seed_and_by_layer(kind):
    """Seed 0 or 5, layer 0 or 1: four different initialisations, each reproduced exactly."""

    def weights(seed, layer):
        scorer = build_scorer(KVpopConfig(scorer=kind, seed=seed), 2, 8, layer_idx=layer)
        return torch.cat([p.detach().flatten() for p in scorer.parameters()])

    drawn = {(seed, layer): weights(seed, layer) for seed in (0, 5) for layer in (0, 1)}
    for (seed, layer), tensor in drawn.items():
        assert torch.equal(tensor, weights(seed, layer))
        others = [other for key, other in drawn.items() if key != (seed, layer)]
        assert not any(torch.equal(tensor, other) for other in others), (seed, layer)


@pytest.mark.parametrize("kind", ["h2o", "tova"])
def test_attention_fed_scorers_have_no_per_token_score(kind):
    scorer = build_scorer(KVpopConfig(scorer=kind), 1, 4)
    with pytest.raises(ValueError, match="attention-fed"):
        scorer.score_sequence(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4), 1)


def test_tova_scores_each_token_by_the_latest_querys_attention_alone():
    """One key dimension, scale 1, a pool of one slot and a window of one: keys 0, 1, 0. At
    step 1 the query is 2 in row 0 and -2 in row 1, so token 0 gets ``1 / (1 + e^2)`` (row 0)
    or ``e^2 / (1 + e^2)`` (row 1) and token 1 the rest; at step 2 token 1 leaves the window
    with that attention as its priority against token 0's. TOVA scores token 0 by step 1's
    attention alone, so row 0 keeps token 1 and row 1 keeps token 0; an accumulating score
    (token 0's 1 from step 0 added) would keep token 0 in both rows. At step 2 the query is 0:
    both held tokens get attention 1/2."""
    from kvpop_compile.runtime import BoundedCacheState, decode_step

    config = KVpopConfig(sinks=0, window=1, topk=1, lam=0.0, scorer="tova")
    scorer = build_scorer(config, 1, 1)
    state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=1)
    keys = [0.0, 1.0, 0.0]
    queries = [[0.0, 0.0], [2.0, -2.0], [0.0, 0.0]]  # per step, per row
    low = 1 / (1 + math.exp(2))
    # Per step and row: {position: attention that step's query gives it}.
    expected = [
        [{0: 1.0}, {0: 1.0}],
        [{0: low, 1: 1 - low}, {0: 1 - low, 1: low}],
        [{1: 0.5, 2: 0.5}, {0: 0.5, 2: 0.5}],
    ]
    for step, (key, query) in enumerate(zip(keys, queries, strict=True)):
        k = torch.full((2, 1, 1, 1), key)
        q = torch.tensor(query).view(2, 1, 1, 1)
        decode_step(state, q, k, k, k, scorer=scorer, config=config, scale=1.0)
        for row in range(2):
            held = {
                int(p): float(a)
                for p, a in zip(state.positions[row, 0], state.statistic[row, 0], strict=True)
                if p >= 0
            }
            assert held.keys() == expected[step][row].keys()
            # A float32 softmax of two scores: a few float32 ulps from the exact value.
            for position, attention in expected[step][row].items():
                assert held[position] == pytest.approx(attention, rel=1e-6)
            pool = int(state.positions[row, 0, 0])
            if pool >= 0:
                assert float(state.priorities[row, 0, 0]) == pytest.approx(held[pool], rel=1e-6)


def test_build_scorer_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_kv_heads must be an integer >= 1, got 0"):
        build_scorer(KVpopConfig(), 0, 8)
    with pytest.raises(ValueError, match="head_dim must be an integer >= 1, got -4"):
        build_scorer(KVpopConfig(), 2, -4)
