"""Pooled figures' 95% percentile-bootstrap intervals, recomputed in plain Python from the
shared resampling draws."""

import pytest
from bootstrap_oracles import DEN, NUM, OTHER_NUM, REF_DEN, REF_NUM, percentile, pooled

from kvpop_compile.evaluation.statistics import RESAMPLES, draws, ratio, ratio_difference


def test_bootstrap_interval_brackets_the_pooled_value():
    est = ratio([3.0, 5.0, 9.0, 1.0], [10.0, 10.0, 10.0, 10.0])
    assert est.value == pytest.approx(0.45) and est.low <= est.value <= est.high
    assert est.low >= 0.1 and est.high <= 0.9
    same = ratio([3.0, 5.0], [10.0, 10.0], [3.0, 5.0], [10.0, 10.0])
    assert (same.value, same.low, same.high) == (1.0, 1.0, 1.0)


def test_interval_is_the_2_5_and_97_5_percentiles_of_the_resampled_ratio():
    resampled = draws(len(NUM)).tolist()
    assert len(resampled) == RESAMPLES
    boot = [pooled(NUM, DEN, rows) for rows in resampled]
    estimate = ratio(NUM, DEN)
    assert estimate.value == pytest.approx(sum(NUM) / sum(DEN), rel=1e-12)
    assert estimate.low == pytest.approx(percentile(boot, 0.025), rel=1e-12)
    assert estimate.high == pytest.approx(percentile(boot, 0.975), rel=1e-12)


def test_retention_resamples_the_method_and_the_reference_with_the_same_draws():
    resampled = draws(len(NUM)).tolist()
    boot = [pooled(NUM, DEN, rows) / pooled(REF_NUM, REF_DEN, rows) for rows in resampled]
    estimate = ratio(NUM, DEN, REF_NUM, REF_DEN)
    value = (sum(NUM) / sum(DEN)) / (sum(REF_NUM) / sum(REF_DEN))
    assert estimate.value == pytest.approx(value, rel=1e-12)
    assert estimate.low == pytest.approx(percentile(boot, 0.025), rel=1e-12)
    assert estimate.high == pytest.approx(percentile(boot, 0.975), rel=1e-12)


def test_a_difference_resamples_both_ratios_and_the_reference_with_the_same_draws():
    resampled = draws(len(NUM)).tolist()
    boot = [(pooled(NUM, DEN, rows) - pooled(OTHER_NUM, DEN, rows)) / pooled(REF_NUM, REF_DEN, rows)
            for rows in resampled]  # fmt: skip
    d = ratio_difference(NUM, DEN, OTHER_NUM, DEN, REF_NUM, REF_DEN)
    assert d.value == pytest.approx((sum(NUM) - sum(OTHER_NUM)) / sum(REF_NUM), rel=1e-12)
    assert d.low == pytest.approx(percentile(boot, 0.025), rel=1e-12)
    assert d.high == pytest.approx(percentile(boot, 0.975), rel=1e-12)
    same = ratio_difference(NUM, DEN, NUM, DEN)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)
