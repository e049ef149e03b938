"""Pooled figures with 95% percentile-bootstrap intervals, shared by every report.

A pooled figure is a ratio of sums over units (sequences or items; e.g. correct / count), so
units with more targets weigh more there. Its interval resamples *units* with replacement
(percentile bootstrap, seeded); every figure over ``n`` units uses the same :func:`draws`, so a
retention (a method's figure divided by full attention's) and a paired difference of two
methods resample both with the same draw, and the per-unit difficulty they share cancels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

RESAMPLES = 2000


@dataclass(frozen=True)
class Estimate:
    """A pooled figure and its 95% interval."""

    value: float
    low: float
    high: float

    def format(self, scale: float = 1.0, digits: int = 3) -> str:
        v, lo, hi = (x * scale for x in (self.value, self.low, self.high))
        return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


@functools.lru_cache(maxsize=8)
def draws(n: int, seed: int = 0) -> torch.Tensor:
    """(RESAMPLES, n) unit indices drawn with replacement, the same for every figure."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (RESAMPLES, n), generator=generator)


def ratio_draws(num, den, ref_num=None, ref_den=None) -> tuple[float, torch.Tensor]:
    """``sum(num) / sum(den)``, divided by the reference's when given, and its value under
    each of the :data:`RESAMPLES` draws of units ``(RESAMPLES,)``."""
    num, den = torch.tensor(num, dtype=torch.float64), torch.tensor(den, dtype=torch.float64)
    resampled = draws(num.numel())

    def stat(n, d):
        return n.sum(-1) / d.sum(-1)

    value, boot = stat(num, den), stat(num[resampled], den[resampled])
    if ref_num is not None:
        rn = torch.tensor(ref_num, dtype=torch.float64)
        rd = torch.tensor(ref_den, dtype=torch.float64)
        value, boot = value / stat(rn, rd), boot / stat(rn[resampled], rd[resampled])
    return float(value), boot


def interval(value: float, boot: torch.Tensor) -> Estimate:
    """``value`` with the 2.5 and 97.5 percentiles of its resampled values ``boot``."""
    low, high = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return Estimate(value, low, high)


def ratio(num, den, ref_num=None, ref_den=None) -> Estimate:
    """``sum(num) / sum(den)``, divided by the reference's when given, with its interval."""
    return interval(*ratio_draws(num, den, ref_num, ref_den))


def ratio_difference(num, den, other_num, other_den, ref_num=None, ref_den=None) -> Estimate:
    """``ratio(num, den)`` minus ``ratio(other_num, other_den)`` (each divided by the
    reference's when given) over the same units, with the 95% interval of the difference: both
    are resampled with the same draws (a paired bootstrap)."""
    value, boot = ratio_draws(num, den, ref_num, ref_den)
    other_value, other_boot = ratio_draws(other_num, other_den, ref_num, ref_den)
    return interval(value - other_value, boot - other_boot)
