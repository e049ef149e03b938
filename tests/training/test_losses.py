"""The training losses on the target: the boundary loss prefers the target's order, counts each
decision by its gap, ignores what is outside the decisions; the alternative losses."""

import torch
import torch.nn.functional as F

from kvpop_compile.runtime import (
    BoundaryDecisions,
    future_attention_target_dense,
)
from kvpop_compile.training.losses import (
    MAX_TARGET_GAP,
    boundary_accuracy,
    boundary_decisions,
    boundary_loss,
    quantile_bce_loss,
    regression_loss,
)


def make_qk(seed, batch, kv_heads, group, n, head_dim):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, n, head_dim, generator=generator)
    k = torch.randn(batch, kv_heads, n, head_dim, generator=generator)
    return q, k


def test_boundary_loss_prefers_the_target_order():
    q, k = make_qk(1, 1, 2, 2, 64, 16)
    target, valid = future_attention_target_dense(q, k, window=4, scale=0.25)
    decisions = boundary_decisions(target, sinks=2, window=4, topk=8, lam=0.0)
    assert decisions.valid.any()
    assert boundary_accuracy(target, decisions) == 1.0
    assert boundary_accuracy(-target, decisions) < 0.5
    assert boundary_loss(target * 10, decisions) < boundary_loss(-target * 10, decisions)
    # The loss is differentiable in the predicted priorities.
    predicted = torch.zeros_like(target, requires_grad=True)
    boundary_loss(predicted, decisions).backward()
    assert predicted.grad.abs().sum() > 0


def test_boundary_loss_without_decisions_is_zero_and_differentiable():
    target = torch.zeros(1, 1, 5)
    decisions = boundary_decisions(target, sinks=0, window=4, topk=0, lam=0.0)
    predicted = torch.randn(1, 1, 5, requires_grad=True)
    loss = boundary_loss(predicted, decisions)
    loss.backward()
    assert loss == 0 and torch.isnan(boundary_accuracy(predicted, decisions))


def test_boundary_loss_ignores_infinite_priorities_outside_decisions():
    target = torch.randn(1, 1, 12)
    target[0, 0, 0] = 10.0  # the strongest token is never the weakest of a full pool
    decisions = boundary_decisions(target, sinks=0, window=2, topk=2, lam=0.0)
    predicted = target.clone()
    predicted[0, 0, 0] = float("-inf")  # gathered only by queries without a decision
    valid_tokens = torch.cat([decisions.new[decisions.valid], decisions.boundary[decisions.valid]])
    assert 0 not in valid_tokens.tolist()
    assert torch.isfinite(boundary_loss(predicted, decisions))


def test_gap_weighted_boundary_loss_counts_each_decision_by_its_gap():
    # Two decisions by hand: at query 2 token 0 must beat token 1 (target gap 5), at query 3
    # token 2 must lose to token 3 (gap 1); queries 0 and 1 decide nothing.
    decisions = BoundaryDecisions(
        new=torch.tensor([[0, 0, 0, 2]]),
        boundary=torch.tensor([[0, 0, 1, 3]]),
        keep=torch.tensor([[False, False, True, False]]),
        valid=torch.tensor([[False, False, True, True]]),
    )
    target = torch.tensor([[5.0, 0.0, 0.0, 1.0]])
    predicted = torch.tensor([[0.3, 0.5, 0.2, -0.4]], requires_grad=True)
    first = F.softplus(-(predicted[0, 0] - predicted[0, 1]))  # y = +1
    second = F.softplus(predicted[0, 2] - predicted[0, 3])  # y = -1
    torch.testing.assert_close(boundary_loss(predicted, decisions), (first + second) / 2)
    weighted = boundary_loss(predicted, decisions, target_priority=target)
    torch.testing.assert_close(weighted, (5 * first + second) / 6)
    weighted.backward()
    assert predicted.grad.abs().sum() > 0
    # A token no later query attends to (log target -inf) counts at the capped gap.
    silent = torch.tensor([[5.0, float("-inf"), 0.0, 1.0]])
    torch.testing.assert_close(
        boundary_loss(predicted, decisions, target_priority=silent),
        (MAX_TARGET_GAP * first + second) / (MAX_TARGET_GAP + 1),
    )


def test_alternative_losses():
    target = torch.randn(2, 3, 20)
    valid = torch.arange(20) < 15
    assert regression_loss(target, target, valid) == 0
    torch.testing.assert_close(regression_loss(target + 2.0, target, valid), torch.tensor(4.0))
    good = quantile_bce_loss(target * 50, target, valid, keep_fraction=0.5)
    bad = quantile_bce_loss(-target * 50, target, valid, keep_fraction=0.5)
    assert good < bad
