"""Chunked prefill (design.md §2, the chunked rule; §6): a prompt entering the bounded cache
in chunks of any size gives the same outputs, the same held tokens and the same state as the
one-shot prefill and as one decode step per token, for every scorer."""

import contextlib
import copy
from functools import partial

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_support import kernel_devices, kernels_enabled
from test_cache import TOLERANCE, make_inputs
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile import KVpopConfig, ScorerKind
from kvpop_compile.runtime import BoundedCacheState, build_scorer, chunk_step, decode_tokens

HEAD_DIM = 8


def _config(kind, sinks, window, topk, lam, span=0):
    return KVpopConfig(
        sinks=sinks, window=window, topk=topk, lam=lam, scorer=kind, memory_dim=4,
        memory_value_dim=4, scorer_hidden=8, prefill_block=5, priority_span=span,
    )  # fmt: skip


def _chunk_bounds(n: int, cuts: list[int]) -> list[tuple[int, int]]:
    """``[0, n)`` cut at the distinct positions ``cuts`` (each in ``1..n-1``)."""
    edges = [0, *sorted({c for c in cuts if 0 < c < n}), n]
    return list(zip(edges[:-1], edges[1:], strict=False))


def _held(state: BoundedCacheState):
    """What a later step can read, by position, independent of the pool's slot order:
    per (batch, head) the sorted positions with their keys, values and pool priorities."""
    order = torch.sort(state.positions, dim=-1).indices
    keys = state.keys.gather(2, order.unsqueeze(-1).expand_as(state.keys))
    values = state.values.gather(2, order.unsqueeze(-1).expand_as(state.values))
    held = torch.sort(state.positions, dim=-1).values >= 0
    return (
        torch.sort(state.positions, dim=-1).values,
        torch.where(held.unsqueeze(-1), keys, 0),
        torch.where(held.unsqueeze(-1), values, 0),
        torch.sort(state.priorities, dim=-1).values,
    )


def _assert_same_state(a: BoundedCacheState, b: BoundedCacheState) -> None:
    assert a.cached_positions() == b.cached_positions()
    assert torch.equal(a.seen, b.seen)
    for x, y in zip(_held(a), _held(b), strict=True):
        torch.testing.assert_close(x, y, **TOLERANCE)
    torch.testing.assert_close(a.scorer_state, b.scorer_state, **TOLERANCE)
    torch.testing.assert_close(a.recent_scores, b.recent_scores, **TOLERANCE)
    # Pre-RoPE keys of the ring's held tokens (an empty ring slot's row is never read).
    window = a.window_keys.shape[2]
    held = (a.positions[..., -window:] >= 0).unsqueeze(-1)
    torch.testing.assert_close(
        torch.where(held, a.window_keys, 0), torch.where(held, b.window_keys, 0), **TOLERANCE
    )


def _run(kind, sinks, window, topk, lam, n, cuts, extra, batch, kv_heads, group, seed, span=0):
    config = _config(kind, sinks, window, topk, lam, span)
    scorer = build_scorer(config, kv_heads, HEAD_DIM)
    q, k, raw_k, v = make_inputs(seed, batch, kv_heads, group, n + extra, HEAD_DIM)
    kwargs = {"scorer": scorer, "config": config, "scale": HEAD_DIM**-0.5}

    def empty():
        return BoundedCacheState.empty(config, scorer, batch=batch, head_dim=HEAD_DIM)

    def part(lo, hi):
        return tuple(x[:, :, lo:hi] for x in (q, k, raw_k, v))

    chunked, whole, stepped = empty(), empty(), empty()
    out_chunked = torch.cat(
        [chunk_step(chunked, *part(lo, hi), **kwargs) for lo, hi in _chunk_bounds(n, cuts)], dim=2
    )
    out_whole = chunk_step(whole, *part(0, n), **kwargs)
    out_stepped = decode_tokens(stepped, *part(0, n), **kwargs)
    torch.testing.assert_close(out_chunked, out_stepped, **TOLERANCE)
    torch.testing.assert_close(out_whole, out_stepped, **TOLERANCE)
    _assert_same_state(chunked, stepped)
    _assert_same_state(whole, stepped)
    # The caches decode on identically: nothing a later step reads differs.
    rest = part(n, n + extra)
    if extra:
        torch.testing.assert_close(
            decode_tokens(chunked, *rest, **kwargs),
            decode_tokens(stepped, *rest, **kwargs),
            **TOLERANCE,
        )
        assert chunked.cached_positions() == stepped.cached_positions()


@given(
    kind=st.sampled_from([k for k in ScorerKind if not k.attention_fed]),
    sinks=st.integers(0, 3),
    window=st.integers(1, 6),
    topk=st.integers(0, 6),
    lam=st.sampled_from([0.0, 0.05]),
    span=st.sampled_from([0, 1, 3]),
    n=st.integers(2, 40),
    cuts=st.lists(st.integers(1, 39), min_size=1, max_size=5),
    extra=st.integers(0, 3),
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 2),
    group=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**31 - 1),
)
def test_chunked_prefill_equals_one_shot_and_decode_steps(
    kind, sinks, window, topk, lam, span, n, cuts, extra, batch, kv_heads, group, seed
):
    """Invariant 2, with and without ``priority_span`` (the spread carries across chunks)."""
    _run(kind, sinks, window, topk, lam, n, cuts, extra, batch, kv_heads, group, seed, span)


@pytest.mark.parametrize("kind", [k.value for k in ScorerKind])
@pytest.mark.parametrize(
    "cuts",
    [
        [1, 2, 3],  # single tokens through the sinks
        [3, 7],  # a chunk ending exactly where the sinks end, one where the window fills
        [2, 5, 9, 13, 17],  # chunks shorter than the window
        [12],  # one chunk ending where the pool is full (sinks 3 + window 4 + topk 5)
        [13, 26],  # chunks longer than the capacity
    ],
)
def test_chunks_ending_on_sink_window_and_pool_boundaries(kind, cuts):
    """Sinks 3, window 4, pool 5: chunk edges on each region's boundary, for every scorer
    (the attention-fed ones run their chunks step by step)."""
    _run(kind, 3, 4, 5, 0.0, 30, cuts, 2, 1, 2, 2, seed=7)


@pytest.mark.parametrize("device", kernel_devices())
def test_chunked_prefill_on_the_triton_kernels_matches_the_reference(device):
    """The chunks' attention and eviction steps through the Triton kernels (interpreted on the
    CPU, compiled on a GPU): the same outputs and cache as the plain-PyTorch path on the CPU."""
    config = _config("memory", 2, 3, 4, 0.0)
    scorer = build_scorer(config, 2, HEAD_DIM)
    inputs = make_inputs(3, 1, 2, 2, 24, HEAD_DIM)
    kwargs = {"config": config, "scale": HEAD_DIM**-0.5}
    states, outs = [], []
    for where, context in (
        ("cpu", contextlib.nullcontext),
        (device, partial(kernels_enabled, device)),
    ):
        on = copy.deepcopy(scorer).to(where)
        state = BoundedCacheState.empty(config, on, batch=1, head_dim=HEAD_DIM, device=where)
        parts = []
        for lo, hi in _chunk_bounds(24, [5, 11, 18]):
            chunk = tuple(x[:, :, lo:hi].to(where) for x in inputs)
            with context():
                parts.append(chunk_step(state, *chunk, scorer=on, **kwargs).cpu())
        states.append(BoundedCacheState(*(t.cpu() for t in state.tensors())))
        outs.append(torch.cat(parts, dim=2))
    torch.testing.assert_close(outs[1], outs[0], **TOLERANCE)
    _assert_same_state(states[1], states[0])


def _lm_head_rows(model) -> list[int]:
    """Record how many positions each forward's ``lm_head`` computes logits for."""
    rows: list[int] = []
    model.lm_head.register_forward_hook(lambda module, args, out: rows.append(out.shape[1]))
    return rows


@pytest.mark.parametrize("chunk", [1, 3, 16, 17, 40])
def test_model_prefill_in_chunks_gives_the_one_shot_logits_and_cache(chunk):
    """``kc.prefill`` of a 40-token prompt (capacity 16) in chunks of any size: the last
    position's logits and the cache of the one-shot prefill; the logits of no other position
    are computed."""
    config = KVpopConfig(sinks=2, window=4, topk=10, scorer="memory")
    model = kc.transform(tiny_qwen3(), config)
    ids = prompt(length=40)
    whole = kc.new_cache(model)
    with torch.no_grad():
        expected = model(input_ids=ids, cache=whole, use_cache=True).logits[:, -1]
    rows = _lm_head_rows(model)
    chunked = kc.new_cache(model)
    logits = kc.prefill(model, ids, chunked, chunk=chunk)
    torch.testing.assert_close(logits, expected, **TOLERANCE)
    assert rows == [1] * -(-40 // chunk)
    for a, b in zip(chunked.layers, whole.layers, strict=True):
        _assert_same_state(a.state, b.state)


def test_generate_prefills_in_chunks_of_the_configured_length():
    """``KVpopConfig.prefill_chunk`` sets the chunk of ``kc.prefill`` and of transformers'
    ``generate()``; the tokens are those of the one-shot prefill."""
    config = KVpopConfig(sinks=2, window=4, topk=10, scorer="memory", prefill_chunk=7)
    model = kc.transform(tiny_qwen3(), config)
    assert config.chunk_length == 7
    assert model.generation_config.prefill_chunk_size is None  # saved as the original's
    ids = prompt(length=30, batch=1)
    rows = _lm_head_rows(model)
    tokens = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert rows[:5] == [1, 1, 1, 1, 1]  # five chunks of at most 7 tokens, one row each
    assert torch.equal(tokens, kc.generate(model, ids, 12))


def test_prefill_chunk_is_checked():
    with pytest.raises(ValueError, match="prefill_chunk must be an integer >= 1, got 0"):
        KVpopConfig(prefill_chunk=0)
    model = kc.transform(tiny_qwen3(), KVpopConfig(sinks=2, window=4, topk=10))
    with pytest.raises(ValueError, match="chunk must be an integer >= 1, got 0"):
        kc.prefill(model, prompt(), kc.new_cache(model), chunk=0)


@pytest.mark.parametrize("span", [0, 3])
def test_the_distillation_student_sees_what_the_bounded_cache_keeps(span):
    """The student's mask (parallel rule over the whole sequence) is the cache's: the same
    attention outputs as the one-shot prefill, spread scores included."""
    from kvpop_compile.training.student_attention import StudentAttention

    config = _config("memory", 2, 3, 4, 0.0, span)
    scorer = build_scorer(config, 2, HEAD_DIM)
    q, k, raw_k, v = make_inputs(11, 2, 2, 2, 30, HEAD_DIM)
    student = StudentAttention(config, HEAD_DIM**-0.5)
    student.scorer = scorer
    state = BoundedCacheState.empty(config, scorer, batch=2, head_dim=HEAD_DIM)
    expected = chunk_step(state, q, k, raw_k, v, scorer=scorer, config=config,
                          scale=HEAD_DIM**-0.5)  # fmt: skip
    torch.testing.assert_close(student(q, k, v, raw_k), expected, **TOLERANCE)
