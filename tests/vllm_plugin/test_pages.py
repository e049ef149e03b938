"""A request's bounded cache as a vLLM state page: the layout is aligned and holds every field,
views share the raw pool, and gathering, stepping and scattering rows through arbitrary page
indices equals stepping the same rows as a dense batch."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from kvpop_compile.config import KVpopConfig
from kvpop_compile.runtime.cache import BoundedCacheState
from kvpop_compile.runtime.decode_step import decode_step
from kvpop_compile.runtime.scorers.registry import build_scorer
from kvpop_compile.vllm.pages import (
    ALIGNMENT,
    PAD_FIELD,
    bind_pages,
    gather_rows,
    page_bytes,
    page_layout,
    reset_rows_,
    scatter_rows_,
)

HEADS, HEAD_DIM, Q_HEADS = 2, 8, 4
CONFIG = KVpopConfig(sinks=2, window=3, topk=5, scorer="memory", priority_span=2)


def _scorer(config=CONFIG):
    return build_scorer(config, HEADS, HEAD_DIM, layer_idx=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scorer", ["memory", "mlp", "tova", "window"])
def test_layout_holds_every_field_aligned(dtype, scorer):
    config = KVpopConfig(sinks=1, window=3, topk=2, scorer=scorer)
    layout = page_layout(config, _scorer(config), HEAD_DIM, dtype)
    names = [f.name for f in layout]
    assert sorted(names[:-1]) == sorted(f.name for f in fields(BoundedCacheState))
    assert names[-1] == PAD_FIELD
    offset = 0
    for f in layout:
        assert offset % f.dtype.itemsize == 0, (f.name, offset)
        offset += f.nbytes
    assert offset == page_bytes(layout) and offset % ALIGNMENT == 0
    empty = BoundedCacheState.empty(config, _scorer(config), batch=1, head_dim=HEAD_DIM,
                                    dtype=dtype)  # fmt: skip
    assert offset - layout[-1].nbytes == empty.nbytes  # one row of the dense state, no more


def _pool(pages: int, dtype=torch.float32):
    layout = page_layout(CONFIG, _scorer(), HEAD_DIM, dtype)
    # vLLM hands a state layer its pool as (pages, 1, 1, bytes) int8.
    raw = torch.zeros(pages, 1, 1, page_bytes(layout), dtype=torch.int8)
    return raw, bind_pages(raw, layout)


def test_views_share_the_raw_pool_and_pages_do_not_overlap():
    raw, pool = _pool(3)
    pool["positions"][1].fill_(7)
    pool["seen"][2] = 5
    assert int(pool["positions"][0].abs().sum()) == 0 and int(pool["seen"][1]) == 0
    before = raw.clone()
    pool["keys"][0, 1, 2, 3] = 1.5
    changed = (raw != before).nonzero()[:, 0].unique().tolist()
    assert changed == [0]  # only page 0's bytes moved


def test_reset_rows_empties_exactly_those_pages():
    raw, pool = _pool(4)
    raw.fill_(3)
    reset_rows_(pool, torch.tensor([2, 0]))
    empty = BoundedCacheState.empty(CONFIG, _scorer(), batch=1, head_dim=HEAD_DIM)
    for f in fields(BoundedCacheState):
        for page in (0, 2):
            assert torch.equal(pool[f.name][page], getattr(empty, f.name)[0]), f.name
        if pool[f.name][1].numel():  # (a field of zero size is equal everywhere)
            assert not torch.equal(pool[f.name][1], getattr(empty, f.name)[0]), f.name


def test_steps_through_page_indices_equal_dense_rows():
    # Rows 0, 1, 2 of a dense batch live in pages 4, 1, 3 of a pool of 6; pages 0, 2, 5 belong
    # to other requests and must not change.
    torch.manual_seed(3)
    scorer, index = _scorer(), torch.tensor([4, 1, 3])
    dense = BoundedCacheState.empty(CONFIG, scorer, batch=3, head_dim=HEAD_DIM)
    _, pool = _pool(6)
    reset_rows_(pool, torch.arange(6))
    for view in pool.values():  # other requests' pages hold something else
        view[[0, 2, 5]] = view[[0, 2, 5]] + 1
    others = {name: view[[0, 2, 5]].clone() for name, view in pool.items()}
    kwargs = {"scorer": scorer, "config": CONFIG, "scale": HEAD_DIM**-0.5}
    for _ in range(CONFIG.capacity + 6):  # past the capacity: evictions happen
        q = torch.randn(3, Q_HEADS, 1, HEAD_DIM)
        k, raw_k, v = (torch.randn(3, HEADS, 1, HEAD_DIM) for _ in range(3))
        want = decode_step(dense, q, k, raw_k, v, **kwargs)
        state = gather_rows(pool, index)
        got = decode_step(state, q, k, raw_k, v, **kwargs)
        scatter_rows_(pool, index, state)
        assert torch.equal(got, want)
    for f in fields(BoundedCacheState):
        assert torch.equal(pool[f.name][index], getattr(dense, f.name)), f.name
    for name, view in others.items():
        assert torch.equal(pool[name][[0, 2, 5]], view), name


def test_bind_pages_refuses_a_pool_it_cannot_hold():
    layout = page_layout(CONFIG, _scorer(), HEAD_DIM, torch.float32)
    with pytest.raises(ValueError, match=f"cannot hold this layout's {page_bytes(layout)}"):
        bind_pages(torch.zeros(2, page_bytes(layout) - 8, dtype=torch.int8), layout)
    with pytest.raises(TypeError, match="holds bytes"):
        bind_pages(torch.zeros(2, page_bytes(layout), dtype=torch.float32), layout)
