"""The benchmark report's 95% percentile-bootstrap intervals, recomputed in plain Python from
the report's shared resampling draws."""

import pytest

from kvpop_compile.evaluation.report import RESAMPLES, _draws, _ratio


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, interpolated linearly between order statistics."""
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    below = int(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (rank - below) * (ordered[above] - ordered[below])


def pooled(num: list[float], den: list[float], rows: list[int]) -> float:
    return sum(num[i] for i in rows) / sum(den[i] for i in rows)


NUM, DEN = [3.0, 5.0, 9.0, 1.0, 7.0, 0.0], [10.0, 8.0, 10.0, 4.0, 10.0, 6.0]
REF_NUM, REF_DEN = [6.0, 5.0, 10.0, 2.0, 9.0, 3.0], DEN


def test_interval_is_the_2_5_and_97_5_percentiles_of_the_resampled_ratio():
    draws = _draws(len(NUM)).tolist()
    assert len(draws) == RESAMPLES
    boot = [pooled(NUM, DEN, rows) for rows in draws]
    estimate = _ratio(NUM, DEN)
    assert estimate.value == pytest.approx(sum(NUM) / sum(DEN), rel=1e-12)
    assert estimate.low == pytest.approx(percentile(boot, 0.025), rel=1e-12)
    assert estimate.high == pytest.approx(percentile(boot, 0.975), rel=1e-12)


def test_retention_resamples_the_method_and_the_reference_with_the_same_draws():
    draws = _draws(len(NUM)).tolist()
    boot = [pooled(NUM, DEN, rows) / pooled(REF_NUM, REF_DEN, rows) for rows in draws]
    estimate = _ratio(NUM, DEN, REF_NUM, REF_DEN)
    value = (sum(NUM) / sum(DEN)) / (sum(REF_NUM) / sum(REF_DEN))
    assert estimate.value == pytest.approx(value, rel=1e-12)
    assert estimate.low == pytest.approx(percentile(boot, 0.025), rel=1e-12)
    assert estimate.high == pytest.approx(percentile(boot, 0.975), rel=1e-12)
