"""The ``future_attention_target`` op: transposed ≡ dense (invariant 5), hand-computed and
loop oracles, no N x N allocation; the Triton kernel ≡ the reference."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import (
    assert_as_accurate_as_reference,
    attention_truth,
    kernel_devices,
    kernels_enabled,
)
from strategies import draw_dtype, heads
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kvpop_compile.runtime import (
    future_attention_target,
    future_attention_target_dense,
    masked_attention,
    ops,  # noqa: F401
)
from kvpop_compile.training.losses import (
    boundary_decisions,
    boundary_loss,
    quantile_bce_loss,
)


def make_qk(seed, batch, kv_heads, group, n, head_dim):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, n, head_dim, generator=generator)
    k = torch.randn(batch, kv_heads, n, head_dim, generator=generator)
    return q, k


@given(
    n=st.integers(1, 70),
    window=st.integers(1, 12),
    group=st.sampled_from([1, 2, 4]),
    kv_heads=st.integers(1, 2),
    block=st.integers(1, 33),
    seed=st.integers(0, 2**31 - 1),
)
def test_transposed_target_equals_dense(n, window, group, kv_heads, block, seed):
    q, k = make_qk(seed, 2, kv_heads, group, n, 16)
    _, lse = masked_attention(q, k, k, None, scale=0.25)
    dense, dense_valid = future_attention_target_dense(q, k, window=window, scale=0.25)
    transposed, valid = future_attention_target(q, k, lse, window=window, scale=0.25, block=block)
    assert torch.equal(valid, dense_valid)
    assert valid.tolist() == [t + window < n for t in range(n)]
    # Both are float32 logs of sums of at most n probabilities; the transposed form adds them in
    # log space. Relative error of a sum of n float32 terms is <= n * eps (n <= 70 here), i.e.
    # an absolute error in log space below 70 * 1.2e-7 ~ 1e-5.
    torch.testing.assert_close(transposed, dense, rtol=0, atol=2e-5)


def test_target_values_on_a_hand_computed_case():
    # One head, keys all equal: causal attention is uniform, p_{d->t} = 1 / (d + 1).
    n, window = 6, 2
    q = torch.zeros(1, 1, n, 4)
    k = torch.zeros(1, 1, n, 4)
    target, valid = future_attention_target_dense(q, k, window=window, scale=1.0)
    for t in range(n - window):
        future = range(t + window, n)
        expected = torch.tensor(sum(1 / (d + 1) for d in future) / len(future)).log()
        torch.testing.assert_close(target[0, 0, t], expected)
    assert not valid[n - window :].any() and (target[0, 0, n - window :] == 0).all()


def target_by_loops(q, k, window, scale, aggregate="mean", power=1.0):
    """The future-attention target written out one query at a time in float64, from design.md §4:
    ``r_t = log max_g mean_{d in [t + W, N)} p^g_{d->t}`` (``max`` in place of the mean for
    ``aggregate="max"``; ``(mean p^a)^(1/a)`` with ``a = power`` for ``"power_mean"``).
    ``(B, Hkv, N)``, 0 where no query counts."""
    batch, q_heads, n, _ = q.shape
    kv_heads = k.shape[1]
    group = q_heads // kv_heads
    target = torch.zeros(batch, kv_heads, n, dtype=torch.float64)
    for b in range(batch):
        for h in range(kv_heads):
            received = torch.zeros(group, n, dtype=torch.float64)  # sum over d of p^g_{d->t}
            for g in range(group):
                query_head = h * group + g  # query heads of KV head h are contiguous
                for d in range(n):
                    scores = k[b, h, : d + 1].double() @ q[b, query_head, d].double() * scale
                    probs = torch.softmax(scores, dim=0)
                    for t in range(d - window + 1):  # d >= t + W
                        if aggregate == "max":
                            received[g, t] = max(received[g, t], probs[t])
                        else:
                            received[g, t] += probs[t] ** power
            for t in range(n - window):
                count = 1 if aggregate == "max" else n - t - window
                target[b, h, t] = torch.log(received[:, t].max() / count) / power
    return target


@pytest.mark.parametrize(("group", "kv_heads"), [(2, 1), (3, 2), (4, 1)])
def test_targets_take_the_max_over_a_group_whose_heads_attend_differently(group, kv_heads):
    n, window = 24, 3
    q, k = make_qk(group, 2, kv_heads, group, n, 8)
    # Sharp, different attention per query head: the mean over the group is far from its max.
    q = q * 2.0
    q[:, ::group] *= -1
    expected = target_by_loops(q, k, window, 0.5)
    _, lse = masked_attention(q, k, k, None, scale=0.5)
    dense, _ = future_attention_target_dense(q, k, window=window, scale=0.5)
    transposed, _ = future_attention_target(q, k, lse, window=window, scale=0.5, block=5)
    # The heads' targets differ by far more than rounding, so a mean would be caught.
    per_head = [target_by_loops(q[:, g::group], k, window, 0.5) for g in range(group)]
    assert (per_head[0] - per_head[1]).abs().max() > 0.5
    # float32 logs of sums of at most 24 probabilities (see above): 2e-5 in log space.
    torch.testing.assert_close(dense.double(), expected, rtol=0, atol=2e-5)
    torch.testing.assert_close(transposed.double(), expected, rtol=0, atol=2e-5)


@given(
    n=st.integers(1, 40),
    window=st.integers(1, 8),
    group=st.sampled_from([1, 2, 3]),
    block=st.integers(1, 17),
    seed=st.integers(0, 2**31 - 1),
)
def test_max_target_is_the_strongest_single_future_attention(n, window, group, block, seed):
    q, k = make_qk(seed, 1, 2, group, n, 8)
    q = q * 1.5  # sharp enough that a max and a mean disagree on the order
    expected = target_by_loops(q, k, window, 0.5, aggregate="max")
    _, lse = masked_attention(q, k, k, None, scale=0.5)
    dense, dense_valid = future_attention_target_dense(q, k, window=window, scale=0.5,
                                                       aggregate="max")  # fmt: skip
    transposed, valid = future_attention_target(q, k, lse, window=window, scale=0.5,
                                                block=block, aggregate="max")  # fmt: skip
    assert torch.equal(valid, dense_valid)
    # One probability each, in float32: its log is exact to a few ulps of the score.
    torch.testing.assert_close(dense.double(), expected, rtol=0, atol=2e-5)
    torch.testing.assert_close(transposed.double(), expected, rtol=0, atol=2e-5)


@settings(max_examples=30)
@given(
    n=st.integers(1, 36),
    window=st.integers(1, 8),
    group=st.sampled_from([1, 2, 3]),
    block=st.integers(1, 17),
    power=st.sampled_from([1.5, 2.0, 4.0, 7.25]),
    seed=st.integers(0, 2**31 - 1),
)
def test_power_mean_target_is_the_power_mean_of_future_attention(
    n, window, group, block, power, seed
):
    q, k = make_qk(seed, 1, 2, group, n, 8)
    q = q * 1.5  # sharp, so that the mean, the power mean and the max all differ
    expected = target_by_loops(q, k, window, 0.5, aggregate="power_mean", power=power)
    _, lse = masked_attention(q, k, k, None, scale=0.5)
    dense, dense_valid = future_attention_target_dense(
        q, k, window=window, scale=0.5, aggregate="power_mean", power=power
    )
    transposed, valid = future_attention_target(
        q, k, lse, window=window, scale=0.5, block=block, aggregate="power_mean", power=power
    )
    assert torch.equal(valid, dense_valid)
    # float32 logs of sums of at most 36 terms, divided by a power > 1 (see above).
    torch.testing.assert_close(dense.double(), expected, rtol=0, atol=2e-5)
    torch.testing.assert_close(transposed.double(), expected, rtol=0, atol=2e-5)


def test_the_power_mean_lies_between_the_mean_and_the_max_and_tends_to_each():
    """The power-mean inequality, and its limits: near 1 it is the mean, for a large power it is
    within ``log(N_t) / a`` of the max (a bound, not a tolerance: the largest of ``N_t`` terms
    is at least their power mean and at most ``N_t ** (1 / a)`` times it)."""
    n, window = 48, 3
    q, k = make_qk(7, 2, 2, 2, n, 8)
    q = q * 2.0
    _, lse = masked_attention(q, k, k, None, scale=0.5)

    def target(aggregate, power=1.0):
        return future_attention_target(
            q, k, lse, window=window, scale=0.5, aggregate=aggregate, power=power
        )

    mean, valid = target("mean")
    top, _ = target("max")
    log_count = torch.log((n - window - torch.arange(n)).clamp(min=1).float())
    for power in (1.5, 3.0, 12.0):
        between, _ = target("power_mean", power)
        assert (between[..., valid] >= mean[..., valid] - 1e-5).all()
        assert (between[..., valid] <= top[..., valid] + 1e-5).all()
        assert (between[..., valid] >= (top - log_count / power)[..., valid] - 1e-5).all()
    # Strictly inside on sharp attention: neither end is what the power mean computes.
    middle, _ = target("power_mean", 3.0)
    assert (middle - mean)[..., valid].max() > 0.5 and (top - middle)[..., valid].max() > 0.5
    near_mean, _ = target("power_mean", 1.0 + 1e-4)
    torch.testing.assert_close(near_mean[..., valid], mean[..., valid], rtol=0, atol=2e-3)
    near_max, _ = target("power_mean", 400.0)
    assert ((top - near_max)[..., valid] <= log_count[valid] / 400 + 1e-5).all()


def test_a_token_several_queries_need_outranks_one_a_single_query_needs_under_the_power_mean():
    """Keys 0 and 1 get equal single strongest attentions, key 1 from four queries, key 0 from
    one: the max ties them, the power mean ranks key 1 above key 0 by ``log(4) / a`` (and by
    ``log(N_0 / N_1) / a`` more, as key 0 has one more future query to share its one with)."""
    n, window, dim, power = 40, 2, 4, 4.0
    k = torch.zeros(1, 1, n, dim)
    k[0, 0, 0, 0] = 1.0
    k[0, 0, 1, 1] = 1.0
    q = torch.zeros(1, 1, n, dim)
    q[0, 0, :, :2] = -30.0  # every query avoids keys 0 and 1 ...
    q[0, 0, -1] = torch.tensor([30.0, -30.0, 0.0, 0.0])  # ... but the last, which reads key 0
    q[0, 0, -5:-1] = torch.tensor([-30.0, 30.0, 0.0, 0.0])  # and four before it, key 1
    top, _ = future_attention_target_dense(q, k, window=window, scale=1.0, aggregate="max")
    between, _ = future_attention_target_dense(
        q, k, window=window, scale=1.0, aggregate="power_mean", power=power
    )
    torch.testing.assert_close(top[0, 0, 0], top[0, 0, 1], rtol=0, atol=1e-6)
    gap = between[0, 0, 1] - between[0, 0, 0]
    expected = (math.log(4) + math.log((n - window) / (n - window - 1))) / power
    torch.testing.assert_close(gap, torch.tensor(expected), rtol=0, atol=1e-5)


def test_a_token_one_late_query_needs_ranks_first_under_max_and_low_under_mean():
    """Key 0 is ignored by every query but the last, which attends to it alone: the mean
    spreads that over all future queries, the max keeps it whole."""
    n, window, dim = 40, 2, 4
    k = torch.zeros(1, 1, n, dim)
    k[0, 0, 0, 0] = 1.0
    q = torch.zeros(1, 1, n, dim)
    q[0, 0, :-1, 0] = -30.0  # every query but the last avoids key 0
    q[0, 0, -1, 0] = 30.0  # the last query attends to key 0 alone
    mean, valid = future_attention_target_dense(q, k, window=window, scale=1.0)
    top, _ = future_attention_target_dense(q, k, window=window, scale=1.0, aggregate="max")
    ranked = valid.nonzero().squeeze(1)
    assert int(top[0, 0, ranked].argmax()) == 0
    assert int(mean[0, 0, ranked].argsort(descending=True).tolist().index(0)) > n // 2
    assert top[0, 0, 0] > -1e-4  # log of a probability of ~1


class LargestAllocation(TorchDispatchMode):
    """Records the element count of the largest tensor any op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.largest = max(self.largest, leaf.numel())
        return out


def test_transposed_target_never_allocates_n_by_n():
    n, head_dim = 8192, 64
    q, k = make_qk(0, 1, 2, 1, n, head_dim)
    _, lse = masked_attention(q, k, k, None, scale=head_dim**-0.5, block=64)
    with LargestAllocation() as recorder:
        target, valid = future_attention_target(q, k, lse, window=32, scale=head_dim**-0.5)
    # Largest scratch: (B, Hkv, G, N, block) = 2 * 8192 * 64 elements; N x N is 64x larger.
    assert recorder.largest <= 2 * n * 64
    assert recorder.largest < n * n // 32
    assert torch.isfinite(target[..., valid]).all()


def test_bad_arguments_raise():
    q, k = make_qk(0, 1, 1, 1, 8, 4)
    _, lse = masked_attention(q, k, k, None, scale=0.5)
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        future_attention_target(q, k, lse, window=0, scale=0.5)
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        future_attention_target_dense(q, k, window=0, scale=0.5)
    with pytest.raises(
        ValueError, match="aggregate must be one of mean, max, power_mean; got 'sum'"
    ):
        future_attention_target_dense(q, k, window=1, scale=0.5, aggregate="sum")
    allowed = r"power must be a number in \(1, 1000\] for aggregate 'power_mean' \(1 is the mean"
    for power in (1.0, 0.5, 1000.5, 1e300, math.inf, math.nan):
        with pytest.raises(ValueError, match=f"{allowed}.*got {re.escape(str(power))}$"):
            future_attention_target(q, k, lse, window=1, scale=0.5, aggregate="power_mean",
                                    power=power)  # fmt: skip
    with pytest.raises(ValueError, match=f"{allowed}.*got True$"):
        future_attention_target_dense(q, k, window=1, scale=0.5, aggregate="power_mean",
                                      power=True)  # fmt: skip
    with pytest.raises(
        ValueError, match="power applies to aggregate 'power_mean' only; got power 2"
    ):
        future_attention_target(q, k, lse, window=1, scale=0.5, aggregate="max", power=2.0)
    with pytest.raises(ValueError, match="block must be >= 1, got 0"):
        future_attention_target(q, k, lse, window=1, scale=0.5, block=0)
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 1, 8\)"):
        future_attention_target(q, k, lse[..., :4], window=1, scale=0.5)
    decisions = boundary_decisions(torch.zeros(1, 8), sinks=0, window=1, topk=1, lam=0.0)
    with pytest.raises(ValueError, match="tau must be > 0, got 0"):
        boundary_loss(torch.zeros(1, 8), decisions, tau=0)
    with pytest.raises(ValueError, match=r"keep_fraction must be in \(0, 1\), got 1.5"):
        quantile_bce_loss(
            torch.zeros(8), torch.zeros(8), torch.ones(8, dtype=torch.bool), keep_fraction=1.5
        )


def target_truth(q, k, window, scale, aggregate="mean", power=1.0):
    """Dense float64 future-attention target: ``log max_g mean_{d >= t + W} p_{d->t}`` (or the
    max over ``d`` for ``aggregate="max"``, the power mean of ``power`` for ``"power_mean"``)."""
    batch, q_heads, n, dim = q.shape
    kv_heads = k.shape[1]
    qg = q.reshape(batch, kv_heads, q_heads // kv_heads, n, dim)
    position = torch.arange(n, device=q.device)
    _, _, probs = attention_truth(qg, k, k, position[None, :] <= position[:, None], scale)
    future = position[:, None] >= position[None, :] + window  # (d, t)
    if aggregate == "max":
        received = (probs * future).amax(dim=-2).amax(dim=2)  # (B, Hkv, N)
        count = torch.ones(n, dtype=torch.float64, device=q.device)
    else:
        received = (probs.pow(power) * future).sum(dim=-2).amax(dim=2)
        count = (n - window - position).clamp(min=1).double()
    valid = n - window - position > 0
    log_target = (received.log() - count.log()) / power
    return torch.where(valid, log_target, torch.zeros_like(received)), valid


@pytest.mark.parametrize("device", kernel_devices())
@settings(max_examples=15)
@given(shape=heads(), n=st.integers(1, 90), window=st.integers(1, 12))
def test_target_kernel_matches_reference(device, shape, n, window):
    _check_target_kernel(device, shape, n, window, "mean")


@pytest.mark.parametrize("device", kernel_devices())
@settings(max_examples=8)
@given(shape=heads(), n=st.integers(1, 60), window=st.integers(1, 8))
def test_max_target_kernel_matches_reference(device, shape, n, window):
    _check_target_kernel(device, shape, n, window, "max")


@pytest.mark.parametrize("device", kernel_devices())
@settings(max_examples=8)
@given(
    shape=heads(), n=st.integers(1, 60), window=st.integers(1, 8),
    power=st.sampled_from([1.5, 3.0, 6.5]),
)  # fmt: skip
def test_power_mean_target_kernel_matches_reference(device, shape, n, window, power):
    _check_target_kernel(device, shape, n, window, "power_mean", power)


def _check_target_kernel(device, shape, n, window, aggregate, power=1.0):
    batch, kv_heads, group, dim, seed, dtype_index = shape
    dtype = draw_dtype(device, dtype_index)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, n, dim, generator=g).to(device, dtype)
    k = torch.randn(batch, kv_heads, n, dim, generator=g).to(device, dtype)
    scale = dim**-0.5
    _, lse = masked_attention(q, k, k, None, scale=scale)
    reference = future_attention_target(q, k, lse, window=window, scale=scale, block=16,
                                        aggregate=aggregate, power=power)  # fmt: skip
    with kernels_enabled(device):
        got = torch.ops.kvpop.future_attention_target(
            q, k, lse, window, scale, 16, aggregate, power
        )
    truth, valid = target_truth(q, k, window, scale, aggregate, power)
    assert torch.equal(got[1], valid) and torch.equal(reference[1], valid)
    # The truth uses the exact lse; both implementations share the float32 lse given to them,
    # whose own rounding is part of the reference's error.
    assert_as_accurate_as_reference(got[0], reference[0], truth, dtype=torch.float32)
    assert math.isfinite(got[0].abs().max().item() if got[0].numel() else 0.0)
