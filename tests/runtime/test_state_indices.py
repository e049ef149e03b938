"""The decode step's state-index indirection: ``decode_step(..., rows=rows)`` on a state of
``P`` pages ≡ gathering pages ``rows`` into a dense batch, stepping it, and scattering it back
(the oracle), bit for bit, on the reference and on the Triton kernels, for every scorer; pages
not in ``rows`` keep every bit. The same for the three ops that take ``rows`` against the dense
op on the gathered pages; and bad ``rows`` are refused with a message naming them."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import kernel_devices, kernels_enabled

from kvpop_compile.config import KVpopConfig, ScorerKind
from kvpop_compile.runtime import ops  # noqa: F401
from kvpop_compile.runtime.cache import BoundedCacheState
from kvpop_compile.runtime.decode_step import decode_step
from kvpop_compile.runtime.scorers.registry import build_scorer
from kvpop_compile.vllm.pages import bind_pages, page_bytes, page_layout, pool_state

HEADS, Q_HEADS, HEAD_DIM = 2, 4, 8
FIELDS = [f.name for f in fields(BoundedCacheState)]
# Capacity 1 + 3 + 2 = 6: a page past 6 tokens has tokens leave its window, kept or evicted.
SINKS, TOPK, WINDOW = 1, 3, 2


def backends() -> list:
    """``(backend, device)``: the PyTorch reference on the CPU, and the Triton kernels wherever
    :func:`kernel_devices` runs them (skipped where nothing does)."""
    triton = [
        pytest.param("triton", d, id=f"triton-{d}")
        if isinstance(d, str)
        else pytest.param("triton", *d.values, marks=d.marks, id="triton")
        for d in kernel_devices()
    ]
    return [pytest.param("torch", "cpu", id="torch"), *triton]


on_backends = pytest.mark.parametrize(("backend", "device"), backends())


def backend_context(backend: str, device: str):
    return kernels_enabled(device) if backend == "triton" else torch.no_grad()


def gather(state: BoundedCacheState, rows: list[int]) -> BoundedCacheState:
    """The oracle's dense batch: pages ``rows`` copied out one by one."""
    return BoundedCacheState(
        **{name: torch.stack([getattr(state, name)[r] for r in rows]) for name in FIELDS}
    )


def scatter_(state: BoundedCacheState, rows: list[int], dense: BoundedCacheState) -> None:
    for i, r in enumerate(rows):
        for name in FIELDS:
            getattr(state, name)[r].copy_(getattr(dense, name)[i])


def paged_state(config, scorer, pages: int, strided: bool, device: str) -> BoundedCacheState:
    """An empty state of ``pages`` pages: dense tensors, or (``strided``) views of one raw byte
    pool as vLLM's state pages are, whose page stride is the whole page's size."""
    if not strided:
        return BoundedCacheState.empty(config, scorer, batch=pages, head_dim=HEAD_DIM,
                                       device=device)  # fmt: skip
    layout = page_layout(config, scorer, HEAD_DIM, torch.float32)
    raw = torch.zeros(pages, page_bytes(layout), dtype=torch.uint8, device=device)
    return pool_state(bind_pages(raw, layout)).reset_()


def config_for(kind: ScorerKind, span: int) -> KVpopConfig:
    # The attention-fed scorers rescore their pool every step: no spreading with them.
    span = 0 if kind in (ScorerKind.H2O, ScorerKind.TOVA) else span
    return KVpopConfig(sinks=SINKS, window=WINDOW, topk=TOPK, lam=0.01, scorer=kind.value,
                       priority_span=span)  # fmt: skip


def step_inputs(g: torch.Generator, batch: int, device: str) -> list[torch.Tensor]:
    q = torch.randn(batch, Q_HEADS, 1, HEAD_DIM, generator=g)
    k, raw_k, v = torch.randn(3, batch, HEADS, 1, HEAD_DIM, generator=g)
    return [t.to(device) for t in (q, k, raw_k, v)]


def check_steps_on_rows(backend, device, *, kind, span, lengths, steps, strided, seed):
    """Fill page ``p`` with ``lengths[p]`` tokens (densely, one page at a time), then run one
    decode step on rows ``steps[i]`` after another, against the gather-step-scatter oracle.
    Returns the final state."""
    config = config_for(kind, span)
    scorer = build_scorer(config, HEADS, HEAD_DIM, layer_idx=1).to(device)
    g = torch.Generator().manual_seed(seed)
    settings_ = dict(scorer=scorer, config=config, scale=0.3)
    state = paged_state(config, scorer, len(lengths), strided, device)
    for page, length in enumerate(lengths):
        row = gather(state, [page])
        for _ in range(length):
            decode_step(row, *step_inputs(g, 1, device), **settings_)
        scatter_(state, [page], row)
    oracle = BoundedCacheState(**{name: getattr(state, name).clone() for name in FIELDS})
    for rows in steps:
        inputs = step_inputs(g, len(rows), device)
        before = {name: getattr(state, name).clone() for name in FIELDS}
        index = torch.tensor(rows, device=device)
        with backend_context(backend, device):
            out = decode_step(state, *inputs, rows=index, **settings_)
            dense = gather(oracle, rows)
            expected = decode_step(dense, *inputs, **settings_)
        scatter_(oracle, rows, dense)
        assert torch.equal(out, expected)
        untouched = [p for p in range(len(lengths)) if p not in rows]
        for name in FIELDS:
            got = getattr(state, name)
            assert torch.equal(got, getattr(oracle, name)), name
            assert torch.equal(got[untouched], before[name][untouched]), name
    return state


@on_backends
@settings(max_examples=15)
@given(
    kind=st.sampled_from(list(ScorerKind)),
    span=st.sampled_from([0, 2]),
    lengths=st.lists(st.integers(0, 11), min_size=1, max_size=5),
    strided=st.booleans(),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_decode_step_on_rows_equals_gather_step_scatter(
    backend, device, kind, span, lengths, strided, data, seed
):
    """Pages at different lengths (0 to 11 tokens, past the capacity of 6), then three steps on
    drawn unsorted subsets of them (``B`` from 1 to ``P``)."""
    pages = len(lengths)
    subsets = st.permutations(range(pages)).flatmap(
        lambda order: st.integers(1, pages).map(lambda b: list(order[:b]))
    )
    steps = data.draw(st.lists(subsets, min_size=3, max_size=3))
    check_steps_on_rows(backend, device, kind=kind, span=span, lengths=lengths, steps=steps,
                        strided=strided, seed=seed)  # fmt: skip


@on_backends
@pytest.mark.parametrize("kind", list(ScorerKind))
def test_every_scorer_evicts_through_rows(backend, device, kind):
    """Every scorer kind, on a strided pool of 5 pages: full pages (11 and 9 tokens) and empty
    ones, eight steps on unsorted rows with ``P > B`` and ``B = 1``; the pages stepped end
    past the capacity, so tokens have left their window and been kept or evicted."""
    steps = [[3, 0], [4], [0, 3, 1], [1, 4, 0], [3, 0], [2], [0, 4, 3], [4, 0]]
    state = check_steps_on_rows(backend, device, kind=kind, span=2, lengths=[11, 0, 9, 2, 4],
                                steps=steps, strided=True, seed=5)  # fmt: skip
    capacity = SINKS + TOPK + WINDOW
    assert state.seen.tolist() == [17, 2, 10, 6, 8]
    for page in (0, 2, 4):  # a page that has seen more tokens than it holds holds a full cache
        held = state.positions[page]
        assert bool((held >= 0).all()) and int(state.seen[page]) > capacity
        assert int(held.min()) == 0  # the sink is never evicted


# The ops one by one: the op on pages ``rows`` of a P-page tensor ≡ the dense op on the gathered
# pages, and every other page keeps its bits.


def page_strided(tensor: torch.Tensor, strided: bool) -> torch.Tensor:
    """``tensor (P, ...)`` as is, or copied into a view whose pages lie further apart than
    their size (as vLLM's pool views do)."""
    if not strided:
        return tensor
    pages, size = tensor.shape[0], tensor[0].numel()
    wide = torch.full((pages, size + 3), -7, dtype=tensor.dtype, device=tensor.device)
    wide[:, :size] = tensor.reshape(pages, size)
    return wide[:, :size].view(tensor.shape)


@st.composite
def pages_and_rows(draw):
    pages = draw(st.integers(1, 5))
    rows = draw(st.permutations(range(pages)))[: draw(st.integers(1, pages))]
    return pages, list(rows)


@on_backends
@settings(max_examples=20)
@given(shape=pages_and_rows(), group=st.integers(1, 3), capacity=st.integers(1, 70),
       with_probs=st.booleans(), strided=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_decode_attention_on_rows_equals_dense_op_on_gathered_pages(
    backend, device, shape, group, capacity, with_probs, strided, seed
):
    """Capacities past 64 cover a second tile of the kernel's slots."""
    (pages, rows), g = shape, torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(pages, HEADS, capacity, HEAD_DIM, generator=g) for _ in range(2))
    positions = torch.randint(0, 99, (pages, HEADS, capacity), generator=g)
    positions = torch.where(torch.rand(positions.shape, generator=g) < 0.3, -1, positions)
    positions[..., 0] = 0  # every row sees a key
    q = torch.randn(len(rows), HEADS * group, 1, HEAD_DIM, generator=g).to(device)
    cache = [page_strided(t.to(device), strided) for t in (keys, values, positions)]
    index = torch.tensor(rows, device=device)
    with backend_context(backend, device):
        got = torch.ops.kvpop.decode_attention(q, *cache, 0.3, with_probs, index)
        want = torch.ops.kvpop.decode_attention(q, *(t[index] for t in cache), 0.3, with_probs)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def cache_pages(pages: int, capacity: int, statistic: bool, g: torch.Generator):
    """Cache tensors of ``pages`` pages with ties, empty slots and ``-inf`` priorities."""
    keys, values = (torch.randn(pages, HEADS, capacity, HEAD_DIM, generator=g) for _ in range(2))
    positions = torch.stack(
        [torch.randperm(60, generator=g)[:capacity] for _ in range(pages * HEADS)]
    ).view(pages, HEADS, capacity)
    positions = torch.where(torch.rand(positions.shape, generator=g) < 0.25, -1, positions)
    priorities = torch.randint(0, 3, (pages, HEADS, TOPK), generator=g).float()
    priorities = priorities.masked_fill(positions[..., SINKS : SINKS + TOPK] < 0, float("-inf"))
    window_keys = torch.randn(pages, HEADS, WINDOW, HEAD_DIM, generator=g)
    stat = torch.rand(pages, HEADS, capacity if statistic else 0, generator=g)
    return [keys, values, positions, priorities, window_keys, stat]


@on_backends
@settings(max_examples=20)
@given(shape=pages_and_rows(), statistic=st.booleans(), strided=st.booleans(),
       seen=st.integers(0, 30), seed=st.integers(0, 2**16))  # fmt: skip
def test_update_cache_on_rows_equals_dense_op_on_gathered_pages(
    backend, device, shape, statistic, strided, seen, seed
):
    """``seen`` below the sink count writes a sink slot, above it a ring slot."""
    (pages, rows), g = shape, torch.Generator().manual_seed(seed)
    batch, capacity = len(rows), SINKS + TOPK + WINDOW
    cache = [page_strided(t.to(device), strided)
             for t in cache_pages(pages, capacity, statistic, g)]  # fmt: skip
    leaving_position = torch.randint(60, 80, (batch, HEADS), generator=g)
    leaving_position = torch.where(torch.rand(batch, HEADS, generator=g) < 0.2, -1,
                                   leaving_position)  # fmt: skip
    inputs = [torch.randn(batch, HEADS, HEAD_DIM, generator=g),
              torch.randn(batch, HEADS, HEAD_DIM, generator=g), leaving_position,
              torch.rand(batch, HEADS, generator=g),
              torch.randint(0, 3, (batch, HEADS), generator=g).float(),
              seen + torch.arange(batch),
              *(torch.randn(batch, HEADS, 1, HEAD_DIM, generator=g) for _ in range(3))]  # fmt: skip
    inputs = [t.to(device) for t in inputs]
    index = torch.tensor(rows, device=device)
    before = [t.clone() for t in cache]
    dense = [t[index] for t in cache]
    with backend_context(backend, device):
        torch.ops.kvpop.update_cache(*cache, *inputs, SINKS, TOPK, WINDOW, index)
        torch.ops.kvpop.update_cache(*dense, *inputs, SINKS, TOPK, WINDOW)
    untouched = [p for p in range(pages) if p not in rows]
    for got, old, want in zip(cache, before, dense, strict=True):
        assert torch.equal(got[index], want)
        assert torch.equal(got[untouched], old[untouched])


@on_backends
@settings(max_examples=20)
@given(shape=pages_and_rows(), strided=st.booleans(), seed=st.integers(0, 2**16))
def test_memory_scorer_step_on_rows_equals_dense_op_on_gathered_pages(
    backend, device, shape, strided, seed
):
    (pages, rows), g = shape, torch.Generator().manual_seed(seed)
    config = KVpopConfig(memory_dim=3, memory_value_dim=5, scorer_hidden=7)
    scorer = build_scorer(config, HEADS, HEAD_DIM)
    weights = [w.detach().to(device) for w in scorer.step_weights()]
    state = torch.randn(pages, HEADS, *scorer.state_shape, generator=g)
    state = page_strided(state.to(device), strided)
    tokens = [torch.randn(len(rows), HEADS, HEAD_DIM, generator=g).to(device) for _ in range(4)]
    index = torch.tensor(rows, device=device)
    before, dense = state.clone(), state[index]
    with backend_context(backend, device):
        got = torch.ops.kvpop.memory_scorer_step(state, *tokens, weights, index)
        want = torch.ops.kvpop.memory_scorer_step(dense, *tokens, weights)
    assert torch.equal(got, want)
    assert torch.equal(state[index], dense)
    untouched = [p for p in range(pages) if p not in rows]
    assert torch.equal(state[untouched], before[untouched])


def op_cases_with_rows():
    """Each op on 3 pages, 2 of them stepped (rows ``[2, 0]``)."""
    g = torch.Generator().manual_seed(0)
    rows = torch.tensor([2, 0])
    cache = cache_pages(3, SINKS + TOPK + WINDOW, True, g)
    leaving = [torch.randn(2, HEADS, HEAD_DIM), torch.randn(2, HEADS, HEAD_DIM),
               torch.full((2, HEADS), 61), torch.rand(2, HEADS), torch.randn(2, HEADS)]  # fmt: skip
    token = [torch.randn(2, HEADS, 1, HEAD_DIM) for _ in range(3)]
    scorer = build_scorer(KVpopConfig(memory_dim=3, memory_value_dim=2), HEADS, HEAD_DIM)
    weights = [w.detach() for w in scorer.step_weights()]
    state = torch.randn(3, HEADS, *scorer.state_shape)
    tokens = [torch.randn(2, HEADS, HEAD_DIM) for _ in range(4)]
    q = torch.randn(2, Q_HEADS, 1, HEAD_DIM)
    return {
        "decode_attention": (q, *cache[:3], 0.3, True, rows),
        "update_cache": (
            *cache,
            *leaving,
            torch.tensor([7, 9]),
            *token,
            SINKS,
            TOPK,
            WINDOW,
            rows,
        ),  # fmt: skip
        "memory_scorer_step": (state, *tokens, weights, rows),
    }


@pytest.mark.parametrize("name", list(op_cases_with_rows()))
def test_opcheck_with_rows(name):
    # Schema, fake implementation and declared mutations hold with the indirection too.
    torch.library.opcheck(getattr(torch.ops.kvpop, name), op_cases_with_rows()[name])


BAD_ROWS = [
    (torch.tensor([2, 0], dtype=torch.int32), "int64 page indices, got torch.int32"),
    (torch.tensor([2.0, 0.0]), "int64 page indices, got torch.float32"),
    (torch.tensor([[2], [0]]), r"got shape \(2, 1\)"),
    (torch.tensor([2, 0, 1]), r"\(B,\) = \(2,\); got shape \(3,\)"),
    (torch.tensor([1]), r"\(B,\) = \(2,\); got shape \(1,\)"),
    (torch.tensor([2, 0], device="meta"), "on the state's device cpu, got meta"),
]


@pytest.mark.parametrize(("rows", "message"), BAD_ROWS)
@pytest.mark.parametrize("name", list(op_cases_with_rows()))
def test_ops_refuse_bad_rows(name, rows, message):
    *args, _ = op_cases_with_rows()[name]
    with pytest.raises(ValueError, match=message):
        getattr(torch.ops.kvpop, name)(*args, rows)


def decode_case():
    config = config_for(ScorerKind.MEMORY, 0)
    scorer = build_scorer(config, HEADS, HEAD_DIM)
    state = BoundedCacheState.empty(config, scorer, batch=4, head_dim=HEAD_DIM)
    inputs = step_inputs(torch.Generator().manual_seed(0), 2, "cpu")
    return state, inputs, dict(scorer=scorer, config=config, scale=0.3)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        *BAD_ROWS,
        (torch.tensor([3, 4]), r"pages in \[0, 4\), got \[4\] in \[3, 4\]"),
        (torch.tensor([-1, 0]), r"pages in \[0, 4\), got \[-1\] in \[-1, 0\]"),
        (torch.tensor([1, 1]), r"distinct pages, got \[1, 1\]"),
    ],
)
def test_decode_step_refuses_bad_rows_and_leaves_the_state(rows, message):
    state, inputs, settings_ = decode_case()
    before = {name: getattr(state, name).clone() for name in FIELDS}
    with pytest.raises(ValueError, match=message):
        decode_step(state, *inputs, rows=rows, **settings_)
    for name in FIELDS:
        assert torch.equal(getattr(state, name), before[name]), name


def test_decode_step_refuses_rows_that_are_not_a_tensor():
    state, inputs, settings_ = decode_case()
    with pytest.raises(TypeError, match="rows must be a tensor of page indices or None, got"):
        decode_step(state, *inputs, rows=[2, 0], **settings_)
