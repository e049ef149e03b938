"""The bounded cache: prefill ≡ decode steps (invariant 2), the pool holds the running top-K
(invariant 3), capacity >= N gives full attention (invariant 1, at the op level), fixed size."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from policy_oracles import top_k_eligible

from kvpop_compile import KVpopConfig, ScorerKind
from kvpop_compile.runtime import (
    BoundedCacheState,
    WindowScorer,
    build_scorer,
    chunk_step,
    decode_step,
    decode_tokens,
    masked_attention,
)

# Outputs of prefill and of decode sum the same float32 terms (at most a few dozen per query,
# values of unit scale) in a different order: each differs from the exact sum by a few ulps
# (~1e-7) times the number of terms, so 1e-5 bounds the difference with margin.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def make_inputs(seed, batch, kv_heads, group, n, head_dim, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, kv_heads, n, head_dim)
    q = torch.randn(batch, kv_heads * group, n, head_dim, generator=generator)
    k, raw_k, v = (torch.randn(*shape, generator=generator) for _ in range(3))
    return tuple(x.to(dtype) for x in (q, k, raw_k, v))


@given(
    kind=st.sampled_from(list(ScorerKind)),
    sinks=st.integers(0, 3),
    window=st.integers(1, 5),
    topk=st.integers(0, 6),
    lam=st.sampled_from([0.0, 0.05]),
    n=st.integers(1, 30),
    extra=st.integers(0, 4),
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 2),
    group=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_prefill_equals_decode_steps(
    kind, sinks, window, topk, lam, n, extra, batch, kv_heads, group, seed
):
    config = KVpopConfig(
        sinks=sinks,
        window=window,
        topk=topk,
        lam=lam,
        scorer=kind,
        memory_dim=4,
        memory_value_dim=4,
        scorer_hidden=8,
        prefill_block=7,
    )
    head_dim = 8
    scorer = build_scorer(config, kv_heads, head_dim)
    q, k, raw_k, v = make_inputs(seed, batch, kv_heads, group, n + extra, head_dim)
    kwargs = {"scorer": scorer, "config": config, "scale": head_dim**-0.5}
    parallel = BoundedCacheState.empty(config, scorer, batch=batch, head_dim=head_dim)
    stepped = BoundedCacheState.empty(config, scorer, batch=batch, head_dim=head_dim)
    out_parallel = chunk_step(
        parallel, q[:, :, :n], k[:, :, :n], raw_k[:, :, :n], v[:, :, :n], **kwargs
    )
    out_stepped = decode_tokens(
        stepped, q[:, :, :n], k[:, :, :n], raw_k[:, :, :n], v[:, :, :n], **kwargs
    )
    torch.testing.assert_close(out_parallel, out_stepped, **TOLERANCE)
    assert parallel.cached_positions() == stepped.cached_positions()
    assert parallel.seen.tolist() == stepped.seen.tolist() == [n] * batch
    # Decoding on from both caches stays identical: the state, not only the set, matches.
    if extra == 0:
        return
    rest = tuple(x[:, :, n:] for x in (q, k, raw_k, v))
    torch.testing.assert_close(
        decode_tokens(parallel, *rest, **kwargs),
        decode_tokens(stepped, *rest, **kwargs),
        **TOLERANCE,
    )
    assert parallel.cached_positions() == stepped.cached_positions()


@pytest.mark.parametrize("kind", ["mlp", "knorm", "window", "random"])
@given(
    sinks=st.integers(0, 3),
    window=st.integers(1, 4),
    topk=st.integers(1, 6),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
)
def test_pool_holds_the_top_k_eligible_tokens(kind, sinks, window, topk, n, seed):
    config = KVpopConfig(sinks=sinks, window=window, topk=topk, lam=0.01, scorer=kind)
    scorer = build_scorer(config, 2, 4)
    q, k, raw_k, v = make_inputs(seed, 1, 2, 1, n, 4)
    with torch.no_grad():
        rhat = scorer.score_tokens(raw_k, v, torch.arange(n))
    priority = rhat + 0.01 * torch.arange(n)
    state = BoundedCacheState.empty(config, scorer, batch=1, head_dim=4)
    kwargs = {"scorer": scorer, "config": config, "scale": 0.5}
    for step in range(n):
        decode_step(
            state,
            q[:, :, step : step + 1],
            k[:, :, step : step + 1],
            raw_k[:, :, step : step + 1],
            v[:, :, step : step + 1],
            **kwargs,
        )
        for head in range(2):
            pool_positions = state.positions[0, head, sinks : sinks + topk]
            held = {int(p) for p in pool_positions if p >= 0}
            expected = top_k_eligible(
                priority[0, head].tolist(), step=step, sinks=sinks, window=window, topk=topk
            )
            assert held == expected
            stored = state.priorities[0, head][pool_positions >= 0]
            torch.testing.assert_close(
                stored, priority[0, head, pool_positions[pool_positions >= 0]]
            )


@pytest.mark.parametrize("kind", list(ScorerKind))
@pytest.mark.parametrize("group", [1, 4])
def test_capacity_at_least_sequence_gives_full_causal_attention(kind, group):
    n, head_dim = 24, 8
    config = KVpopConfig(sinks=2, window=4, topk=n - 6, scorer=kind)
    scorer = build_scorer(config, 2, head_dim)
    q, k, raw_k, v = make_inputs(1, 2, 2, group, n, head_dim)
    full, _ = masked_attention(q, k, v, None, scale=0.3)
    state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=head_dim)
    out = chunk_step(state, q, k, raw_k, v, scorer=scorer, config=config, scale=0.3)
    torch.testing.assert_close(out, full, **TOLERANCE)
    state.reset_()
    stepped = decode_tokens(state, q, k, raw_k, v, scorer=scorer, config=config, scale=0.3)
    torch.testing.assert_close(stepped, full, **TOLERANCE)


def test_masked_attention_equals_sdpa_without_eviction():
    q, k, _, v = make_inputs(3, 1, 2, 3, 50, 16)
    ours, _ = masked_attention(q, k, v, None, scale=0.25, block=16)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), is_causal=True, scale=0.25
    )
    torch.testing.assert_close(ours, reference, **TOLERANCE)


def test_cache_size_is_fixed_and_bounded():
    config = KVpopConfig(sinks=2, window=4, topk=6)
    scorer = build_scorer(config, 2, 8)
    state = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8)
    before = state.nbytes
    shapes = [t.shape for t in state.tensors()]
    q, k, raw_k, v = make_inputs(0, 1, 2, 2, 60, 8)
    decode_tokens(state, q, k, raw_k, v, scorer=scorer, config=config, scale=0.3)
    assert state.nbytes == before
    assert [t.shape for t in state.tensors()] == shapes
    held = state.cached_positions()[0][0]
    assert len(held) == config.capacity and held[:2] == [0, 1] and held[-4:] == [56, 57, 58, 59]


@pytest.mark.parametrize("kind", ["memory", "mlp", "knorm"])
def test_prefill_equals_decode_with_float32_inputs_into_a_bf16_cache(kind):
    # Decode scores a leaving token from the cache's bf16 copies; prefill must round its inputs
    # the same way or the two paths keep different tokens.
    config = KVpopConfig(sinks=1, window=3, topk=4, scorer=kind)
    scorer = build_scorer(config, 2, 8)
    for seed in range(40):
        q, k, raw_k, v = make_inputs(seed, 1, 2, 1, 30, 8)
        kwargs = {"scorer": scorer, "config": config, "scale": 0.3}
        parallel = BoundedCacheState.empty(
            config, scorer, batch=1, head_dim=8, dtype=torch.bfloat16
        )
        stepped = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8, dtype=torch.bfloat16)
        chunk_step(parallel, q, k, raw_k, v, **kwargs)
        decode_tokens(stepped, q, k, raw_k, v, **kwargs)
        assert parallel.cached_positions() == stepped.cached_positions(), seed


class MinusInfinityEveryThirdToken(WindowScorer):
    """Newest wins, except that every third token is never worth keeping."""

    def score_tokens(self, k, v, position):
        score = super().score_tokens(k, v, position)
        return score.masked_fill(position % 3 == 2, float("-inf"))


def test_minus_infinity_scores_still_fill_free_pool_slots():
    config = KVpopConfig(sinks=0, window=1, topk=4, scorer="window")
    scorer = MinusInfinityEveryThirdToken(2, 8)
    q, k, raw_k, v = make_inputs(0, 1, 2, 1, 6, 8)
    kwargs = {"scorer": scorer, "config": config, "scale": 0.3}
    parallel = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8)
    stepped = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8)
    first5 = tuple(x[:, :, :5] for x in (q, k, raw_k, v))
    out = chunk_step(parallel, *first5, **kwargs)
    torch.testing.assert_close(out, decode_tokens(stepped, *first5, **kwargs), **TOLERANCE)
    # Token 2 scores -inf but found a free pool slot, so it is still held after 5 tokens.
    assert parallel.cached_positions()[0] == stepped.cached_positions()[0] == [[0, 1, 2, 3, 4]] * 2
    # Token 4 then takes the slot of the weakest entry, token 2.
    last = tuple(x[:, :, 5:] for x in (q, k, raw_k, v))
    decode_tokens(stepped, *last, **kwargs)
    assert stepped.cached_positions()[0] == [[0, 1, 3, 4, 5]] * 2


@pytest.mark.parametrize("kind", ["memory", "h2o"])
def test_prefill_of_no_tokens_leaves_an_empty_cache(kind):
    config = KVpopConfig(sinks=1, window=2, topk=2, scorer=kind)
    scorer = build_scorer(config, 2, 8)
    state = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8)
    q, k, raw_k, v = make_inputs(0, 1, 2, 1, 0, 8)
    out = chunk_step(state, q, k, raw_k, v, scorer=scorer, config=config, scale=0.3)
    assert out.shape == (1, 2, 0, 8) and state.seen.tolist() == [0]
    assert state.cached_positions() == [[[], []]]


def test_bf16_cache_keeps_dtype_and_matches_float32():
    config = KVpopConfig(sinks=1, window=3, topk=4, scorer="knorm")
    scorer = build_scorer(config, 2, 8)
    q, k, raw_k, v = make_inputs(5, 1, 2, 2, 20, 8, dtype=torch.bfloat16)
    state = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8, dtype=torch.bfloat16)
    out = chunk_step(state, q, k, raw_k, v, scorer=scorer, config=config, scale=0.3)
    assert out.dtype == torch.bfloat16 and state.keys.dtype == torch.bfloat16
    reference_state = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8)
    inputs32 = [x.float() for x in (q, k, raw_k, v)]
    reference = chunk_step(reference_state, *inputs32, scorer=scorer, config=config, scale=0.3)
    assert state.cached_positions() == reference_state.cached_positions()
    # The only difference is rounding the float32 result to bfloat16 (8 mantissa bits).
    torch.testing.assert_close(out.float(), reference, rtol=2**-8, atol=2**-8)


def test_bad_inputs_raise_clear_errors():
    config = KVpopConfig(sinks=1, window=2, topk=2)
    scorer = build_scorer(config, 2, 8)
    state = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8)
    q, k, raw_k, v = make_inputs(0, 1, 2, 2, 3, 8)
    kwargs = {"scorer": scorer, "config": config, "scale": 0.3}
    with pytest.raises(ValueError, match="decode_step takes one token, got 3"):
        decode_step(state, q, k, raw_k, v, **kwargs)
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a positive multiple"):
        chunk_step(state, q[:, :3], k, raw_k, v, **kwargs)
    with pytest.raises(ValueError, match="do not match the cache"):
        chunk_step(state, q[..., :4], k[..., :4], raw_k[..., :4], v[..., :4], **kwargs)
    with pytest.raises(ValueError, match="expected q"):
        chunk_step(state, q, k, raw_k[:, :, :2], v, **kwargs)
    with pytest.raises(ValueError, match="batch must be >= 1, got 0"):
        BoundedCacheState.empty(config, scorer, batch=0, head_dim=8)


def test_masked_attention_rejects_bad_block():
    q, k, _, v = make_inputs(0, 1, 1, 1, 4, 4)
    with pytest.raises(ValueError, match="block must be >= 1, got 0"):
        masked_attention(q, k, v, None, scale=0.5, block=0)


@pytest.mark.parametrize("group", [1, 3])
def test_h2o_statistic_is_the_cumulative_attention_the_held_keys_received(group):
    """Oracle: each step's attention recomputed in float64 over the keys the cache holds, averaged
    over the KV head's query group, summed per token since it arrived."""
    n, lam, scale = 25, 0.01, 0.3
    config = KVpopConfig(sinks=1, window=2, topk=3, lam=lam, scorer="h2o")
    scorer = build_scorer(config, 2, 8)
    q, k, raw_k, v = make_inputs(4, 2, 2, group, n, 8)
    state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=8)
    received = {}  # (batch, head, position) -> attention received so far
    for i in range(n):
        step = slice(i, i + 1)
        decode_step(state, q[:, :, step], k[:, :, step], raw_k[:, :, step], v[:, :, step],
                    scorer=scorer, config=config, scale=scale)  # fmt: skip
        for b in range(2):
            for h in range(2):
                slots = [c for c in range(config.capacity) if state.positions[b, h, c] >= 0]
                held = state.positions[b, h, slots]
                queries = q[b, h * group : (h + 1) * group, i].double()  # (group, D)
                scores = queries @ k[b, h, held].double().T * scale  # (group, held)
                attention = torch.softmax(scores, dim=-1).mean(dim=0)
                for position, p in zip(held.tolist(), attention.tolist(), strict=True):
                    received[b, h, position] = received.get((b, h, position), 0.0) + p
                expected = torch.tensor(
                    [received[b, h, p] for p in held.tolist()], dtype=torch.float64
                )
                # float32 sums of at most 25 probabilities against float64 ones.
                torch.testing.assert_close(
                    state.statistic[b, h, slots].double(), expected, rtol=1e-5, atol=1e-6
                )
                pool = range(config.sinks, config.sinks + config.topk)
                for j, slot in enumerate(pool):
                    position = int(state.positions[b, h, slot])
                    if position >= 0:
                        torch.testing.assert_close(
                            float(state.priorities[b, h, j]),
                            received[b, h, position] + lam * position, rtol=1e-5, atol=1e-6,
                        )  # fmt: skip
    assert len(received) > config.capacity  # tokens were evicted along the way
