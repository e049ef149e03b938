"""Hypothesis strategies and seeded draws shared by the tests of the ops and the policy."""

import torch
from hypothesis import strategies as st
from kernel_support import kernel_dtypes

budgets = st.fixed_dictionaries(
    {
        "sinks": st.integers(0, 4),
        "window": st.integers(1, 6),
        "topk": st.integers(0, 8),
    }
)


def draw_priority(seed: int, rows: int, n: int, distinct: int | None) -> torch.Tensor:
    """Priorities from a seed: continuous (``distinct=None``), or ``distinct`` values only to
    force ties, the lowest of them ``-inf`` (a score a user may give to never keep a token)."""
    generator = torch.Generator().manual_seed(seed)
    if distinct is None:
        return torch.randn(rows, n, generator=generator)
    levels = torch.randint(0, distinct, (rows, n), generator=generator).float()
    return levels.masked_fill(levels == 0, float("-inf")) if distinct > 1 else levels


@st.composite
def policies(draw):
    n = draw(st.integers(0, 80))
    ties = draw(st.booleans())
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), n)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    if ties:  # small integers: many equal priorities, resolved by age
        priority = torch.randint(0, 4, shape, generator=g).to(dtype)
    else:
        priority = torch.randn(shape, generator=g, dtype=dtype)
    if draw(st.booleans()):
        priority = torch.where(torch.rand(shape, generator=g) < 0.2, float("-inf"), priority)
    budget = dict(sinks=draw(st.integers(0, 4)), window=draw(st.integers(1, 6)),
                  topk=draw(st.integers(0, 12)))  # fmt: skip
    return priority, budget


HEAD_DIMS = [8, 24, 64, 128]  # 24: not a power of two, padded to 32 and masked


@st.composite
def heads(draw):
    """(batch, kv_heads, group, head_dim, seed, dtype index)."""
    return (draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 5)),
            draw(st.sampled_from(HEAD_DIMS)), draw(st.integers(0, 2**16)),
            draw(st.integers(0, 2)))  # fmt: skip


def draw_dtype(device, index):
    dtypes = kernel_dtypes(device)
    return dtypes[index % len(dtypes)]
