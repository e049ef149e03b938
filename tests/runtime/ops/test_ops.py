"""The kvpop custom ops: registered, consistent with their fake implementations, and equal to
the references they wrap."""

import pytest
import torch

from kvpop_compile import KVpopConfig
from kvpop_compile.runtime import (
    BoundedCacheState,
    build_scorer,
    eviction_steps,
    ops,  # noqa: F401
)
from kvpop_compile.runtime.reference.decode_attention import decode_attention
from kvpop_compile.runtime.reference.masked_attention import masked_attention


def cache_after_a_few_tokens(topk=3):
    config = KVpopConfig(sinks=1, window=2, topk=topk, scorer="h2o")
    scorer = build_scorer(config, 2, 4)
    state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=4)
    state.keys.normal_()
    state.values.normal_()
    state.positions.copy_(torch.tensor([0, 3, -1, 5, 6, 7][: config.capacity]).expand(2, 2, -1))
    state.priorities.copy_(torch.tensor([0.5, float("-inf"), 0.1][:topk]).expand(2, 2, -1))
    state.statistic.uniform_()
    state.seen.fill_(8)
    return config, state


def memory_step_case():
    """The ``memory`` scorer's state, a new and a leaving token, and its weights (detached: the
    op runs in the decode step, under ``no_grad``)."""
    scorer = build_scorer(KVpopConfig(memory_dim=3, memory_value_dim=2, scorer_hidden=5), 2, 4)
    state = torch.randn(2, 2, *scorer.state_shape)
    weights = [w.detach() for w in scorer.step_weights()]
    return (state, *(torch.randn(2, 2, 4) for _ in range(4)), weights)


def op_cases():
    config, state = cache_after_a_few_tokens()
    leaving = [torch.randn(2, 2, 4), torch.randn(2, 2, 4), torch.full((2, 2), 6), torch.rand(2, 2)]
    new_token = [torch.randn(2, 2, 1, 4) for _ in range(3)]
    q = torch.randn(2, 4, 5, 4)
    k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    steps = eviction_steps(torch.randn(2, 2, 5), sinks=1, window=2, topk=1)
    return {
        "eviction_steps": (torch.randn(2, 3, 9), 1, 2, 3),
        "masked_attention": (q, k, v, steps, 0.5, 2),
        "decode_attention": (q[:, :, :1], state.keys, state.values, state.positions, 0.5),
        "update_cache": (state.keys, state.values, state.positions, state.priorities,
                         state.window_keys, state.statistic, *leaving, torch.randn(2, 2),
                         state.seen, *new_token, 1, 3, 2),
        "memory_scorer_step": memory_step_case(),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(op_cases()))
def test_opcheck(name):
    # Schema, fake (meta) implementation and dispatch are consistent, mutations declared.
    torch.library.opcheck(getattr(torch.ops.kvpop, name), op_cases()[name])


def test_attention_ops_equal_references():
    cases = op_cases()
    q, k, v, steps, scale, block = cases["masked_attention"]
    for got, expected in zip(
        torch.ops.kvpop.masked_attention(*cases["masked_attention"]),
        masked_attention(q, k, v, steps, scale=scale, block=block),
        strict=True,
    ):
        assert torch.equal(got, expected)
    q1, keys, values, positions, scale = cases["decode_attention"]
    for got, expected in zip(
        torch.ops.kvpop.decode_attention(*cases["decode_attention"]),
        decode_attention(q1, keys, values, positions, scale=scale),
        strict=True,
    ):
        assert torch.equal(got, expected)


def test_update_cache_op_takes_the_free_slot_then_writes_the_new_token():
    config, state = cache_after_a_few_tokens()
    key, value = torch.ones(2, 2, 4), torch.ones(2, 2, 4) * 2
    position, statistic = torch.full((2, 2), 6), torch.zeros(2, 2)
    new_key = torch.full((2, 2, 1, 4), 3.0)
    torch.ops.kvpop.update_cache(
        state.keys, state.values, state.positions, state.priorities, state.window_keys,
        state.statistic, key, value, position, statistic, torch.full((2, 2), -5.0), state.seen,
        new_key, new_key, new_key, 1, 3, 2,
    )  # fmt: skip
    # Pool slots are 1..3 with positions [3, -1, 5]: the empty slot 2 is taken despite -5.
    assert state.positions[0, 0, 1:4].tolist() == [3, 6, 5]
    assert torch.equal(state.priorities[0, 0], torch.tensor([0.5, -5.0, 0.1]))
    assert torch.equal(state.keys[:, :, 2], key) and torch.equal(state.values[:, :, 2], value)
    # Then position 8 goes into its ring slot: sinks + topk + (8 - sinks) % window = 4 + 1.
    assert state.positions[0, 0, 5].item() == 8
    assert torch.equal(state.keys[:, :, 5], new_key[:, :, 0])
    assert torch.equal(state.window_keys[:, :, 1], new_key[:, :, 0])


def test_decode_attention_on_a_bf16_cache_computes_in_float32():
    """bf16 queries and cache: the op (and the reference it wraps on the CPU) computes in
    float32 and rounds once, so its output is the float64 truth rounded to bf16. A float32
    result lies within a few float32 ulps of the truth, 2**16 times finer than a bf16 ulp: it
    rounds as the truth does (none of these 512 outputs lies that close to a rounding
    midpoint), where a weighted sum in bf16 is a bf16 ulp off on a large share of them."""
    from kernel_support import attention_truth

    g = torch.Generator().manual_seed(0)
    batch, kv_heads, group, capacity, dim = 2, 2, 2, 40, 64
    q = torch.randn(batch, kv_heads * group, 1, dim, generator=g).bfloat16()
    keys, values = (torch.randn(batch, kv_heads, capacity, dim, generator=g).bfloat16()
                    for _ in range(2))  # fmt: skip
    positions = torch.randint(0, 500, (batch, kv_heads, capacity), generator=g)
    positions = torch.where(torch.rand(positions.shape, generator=g) < 0.3, -1, positions)
    scale = dim**-0.5
    visible = (positions >= 0)[:, :, None, None, :]
    qg = q.reshape(batch, kv_heads, group, 1, dim)
    truth, _, _ = attention_truth(qg, keys, values, visible, scale)
    truth = truth.reshape(q.shape).to(torch.bfloat16)
    for out, got_probs in (
        torch.ops.kvpop.decode_attention(q, keys, values, positions, scale, True),
        decode_attention(q, keys, values, positions, scale=scale),
    ):
        assert out.dtype == torch.bfloat16 and got_probs.dtype == torch.float32
        assert torch.equal(out, truth)
