"""Scorer losses against the future-attention target (design.md §4), and the ranking diagnostic.

The default, the boundary pairwise logistic loss, trains exactly the decisions the streaming
rule takes: at query ``q`` the token leaving the window is compared with the weakest entry of
the full pool; under the target priorities it either wins (``y = +1``) or loses (``y = -1``),
and the scorer is pushed to order the pair the same way. O(1) per query. The same pairs weighted
by their gap under the target, regression on the log target and BCE on quantile labels are the
alternatives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime import ops  # noqa: F401  (registers the kvpop ops)
from ..runtime.policy import BoundaryDecisions, beats, token_priority

MAX_TARGET_GAP = 10.0  # nats: the widest gap a decision of the weighted loss counts


def boundary_decisions(
    log_target: torch.Tensor, *, sinks: int, window: int, topk: int, lam: float
) -> BoundaryDecisions:
    """The target policy's keep-or-drop decision at every query (running top-k on
    ``r_t + lam * t``, ``kvpop::running_topk_boundary``). Tokens without a target never take
    part: they are still in the window at the last query."""
    priority = token_priority(log_target, lam)
    decisions = torch.ops.kvpop.running_topk_boundary(priority, sinks, window, topk)
    return BoundaryDecisions(*decisions)


def _pair(pred_priority: torch.Tensor, decisions: BoundaryDecisions):
    new = pred_priority.gather(-1, decisions.new)
    boundary = pred_priority.gather(-1, decisions.boundary)
    return new, boundary


def boundary_loss(
    pred_priority: torch.Tensor,
    decisions: BoundaryDecisions,
    *,
    tau: float = 1.0,
    target_priority: torch.Tensor | None = None,
) -> torch.Tensor:
    """``mean softplus(-y * (pihat_new - pihat_bnd) / tau)`` over valid decisions; with
    ``target_priority``, the mean weighted by each pair's gap under the target,
    ``|pi_new - pi_bnd|``.

    The unweighted loss counts every decision once, and nearly all of them are near-ties among
    ordinary tokens, where either choice costs little. The one decision about a definition that
    a question will ask for 1,000 tokens later is a wide gap; weighting by the gap makes it
    count as much as the error would cost.

    Args:
        pred_priority: ``(..., N)`` the scorer's priorities ``rhat_t + lam * t``.
        decisions: from :func:`boundary_decisions`, same leading shape.
        target_priority: ``(..., N)`` the target's priorities ``r_t + lam * t``, or None.
    """
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    new, boundary = _pair(pred_priority, decisions)
    sign = decisions.keep.float() * 2 - 1
    valid = decisions.valid
    # Invalid queries point at arbitrary tokens; `where` (not a product) keeps an infinite
    # priority there from turning the mean into NaN. With nothing valid the loss is a zero that
    # still backpropagates.
    margin = torch.where(valid, new - boundary, torch.zeros_like(new))
    losses = torch.where(valid, F.softplus(-sign * margin / tau), torch.zeros_like(new))
    if target_priority is None:
        return losses.sum() / valid.sum().clamp(min=1)
    target_new, target_boundary = _pair(target_priority.detach(), decisions)
    gap = torch.where(valid, (target_new - target_boundary).abs(), torch.zeros_like(new))
    # A token no later query attends to has a log target of -inf: its gap counts as
    # MAX_TARGET_GAP, a factor e^10 in attention, which already dwarfs the near-ties.
    gap = gap.nan_to_num(nan=0.0).clamp(max=MAX_TARGET_GAP)
    return (losses * gap).sum() / gap.sum().clamp(min=1e-12)


def boundary_accuracy(pred_priority: torch.Tensor, decisions: BoundaryDecisions) -> torch.Tensor:
    """Fraction of valid decisions the predicted priorities take as the target does (ties broken
    by age, as the policy does). 0-d float; NaN when there is no decision."""
    new, boundary = _pair(pred_priority.detach(), decisions)
    predicted_keep = beats(new, decisions.new, boundary, decisions.boundary)
    agree = (predicted_keep == decisions.keep) & decisions.valid
    return agree.sum() / decisions.valid.sum()


def regression_loss(rhat: torch.Tensor, log_target: torch.Tensor, valid: torch.Tensor):
    """Mean squared error between ``rhat (..., N)`` and the log target on valid tokens."""
    errors = (rhat.float() - log_target.float()).pow(2) * valid
    return errors.sum() / (valid.sum() * errors[..., 0].numel()).clamp(min=1)


def quantile_bce_loss(
    rhat: torch.Tensor, log_target: torch.Tensor, valid: torch.Tensor, *, keep_fraction: float
) -> torch.Tensor:
    """BCE with logits ``rhat``: label 1 for tokens whose target is in the top ``keep_fraction``
    of their row (valid tokens only)."""
    if not 0 < keep_fraction < 1:
        raise ValueError(f"keep_fraction must be in (0, 1), got {keep_fraction}")
    if not valid.any():
        return rhat.sum() * 0.0
    scored = log_target[..., valid].float()
    threshold = torch.quantile(scored, 1 - keep_fraction, dim=-1, keepdim=True)
    labels = (scored >= threshold).float()
    return F.binary_cross_entropy_with_logits(rhat[..., valid].float(), labels)
