"""A request's bounded cache as one vLLM state page per layer, and batched access to the pool.

vLLM gives each request of a state-holding ("Mamba-like") layer one fixed-size page of a pool
per layer, and hands the model ``state_indices``: row ``b`` of a step owns page
``state_indices[b]``. A page here holds one row of a :class:`~kvpop_compile.runtime.cache.
BoundedCacheState`: every field without its batch dimension. Its size depends on the budget,
never on how many tokens the request has seen, so vLLM's admission control counts requests by
``pool / (layers * page bytes)`` whatever their length.

Fields are laid out widest element first (int64, then 4-byte, then 2-byte types) and the page
is padded to 8 bytes, so every field's view of the raw byte page is aligned.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from math import prod

import torch

from ..config import KVpopConfig
from ..runtime.cache import EMPTY_FILL, BoundedCacheState
from ..runtime.scorers.base import Scorer

PAD_FIELD = "padding"
ALIGNMENT = 8


@dataclass(frozen=True)
class PageField:
    """One field of a page: ``shape`` without the batch dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize


def page_layout(
    config: KVpopConfig, scorer: Scorer, head_dim: int, dtype: torch.dtype
) -> tuple[PageField, ...]:
    """The fields of one page in layout order, ending with byte padding to :data:`ALIGNMENT`.

    ``dtype`` is the keys' and values' type (the model's); the scorer state and priorities are
    float32 and positions int64, as in :class:`BoundedCacheState`."""
    row = BoundedCacheState.empty(
        config, scorer, batch=1, head_dim=head_dim, dtype=dtype, device="meta"
    )
    found = [PageField(f.name, tuple(getattr(row, f.name).shape[1:]), getattr(row, f.name).dtype)
             for f in fields(BoundedCacheState)]  # fmt: skip
    # Stable sort: fields of one width keep the state's own order.
    ordered = sorted(found, key=lambda f: -f.dtype.itemsize)
    size = sum(f.nbytes for f in ordered)
    pad = -size % ALIGNMENT
    return (*ordered, PageField(PAD_FIELD, (pad,), torch.uint8))


def page_bytes(layout: tuple[PageField, ...]) -> int:
    """Bytes of one page of ``layout`` (a multiple of :data:`ALIGNMENT`)."""
    return sum(f.nbytes for f in layout)


def bind_pages(raw: torch.Tensor, layout: tuple[PageField, ...]) -> dict[str, torch.Tensor]:
    """Views of a raw pool ``raw`` (``(N, page_bytes)`` bytes, or vLLM's ``(N, 1, 1, bytes)``),
    one per field: ``{name: (N, *shape)}``. They share ``raw``'s memory."""
    pages = raw.reshape(raw.shape[0], -1)
    if pages.dtype != torch.int8 and pages.dtype != torch.uint8:
        raise TypeError(f"a raw page pool holds bytes (int8 or uint8), got {pages.dtype}")
    width = page_bytes(layout)
    if pages.shape[1] < width:
        raise ValueError(f"pages of {pages.shape[1]} bytes cannot hold this layout's {width}")
    views, offset = {}, 0
    for f in layout:
        flat = pages[:, offset : offset + f.nbytes].view(f.dtype)
        views[f.name] = flat.view(pages.shape[0], *f.shape)
        offset += f.nbytes
    return views


def pool_state(pool: dict[str, torch.Tensor]) -> BoundedCacheState:
    """The whole pool as a state of ``P`` pages, made of the views themselves (no copy): what
    :func:`~kvpop_compile.runtime.decode_step.decode_step` steps in place with ``rows``."""
    return BoundedCacheState(**{f.name: pool[f.name] for f in fields(BoundedCacheState)})


def gather_rows(pool: dict[str, torch.Tensor], index: torch.Tensor) -> BoundedCacheState:
    """The state of pages ``index`` (``(B,)`` int64) as a batch of ``B`` rows (a copy)."""
    return BoundedCacheState(**{f.name: pool[f.name][index] for f in fields(BoundedCacheState)})


def scatter_rows_(
    pool: dict[str, torch.Tensor], index: torch.Tensor, state: BoundedCacheState
) -> None:
    """Write the ``B`` rows of ``state`` back to pages ``index`` (``(B,)`` int64)."""
    for f in fields(BoundedCacheState):
        pool[f.name].index_copy_(0, index, getattr(state, f.name))


def reset_rows_(pool: dict[str, torch.Tensor], index: torch.Tensor) -> None:
    """Empty pages ``index``: what a request that starts (or restarts after preemption) reads."""
    for f in fields(BoundedCacheState):
        pool[f.name].index_fill_(0, index, EMPTY_FILL.get(f.name, 0))
