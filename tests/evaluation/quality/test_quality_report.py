"""The quality report's paired differences between methods, recomputed in plain Python from the
shared resampling draws, and the paired targets judged on them."""

import pytest
from bootstrap_oracles import DEN, NUM, OTHER_NUM, REF_DEN, REF_NUM, percentile, pooled

from kvpop_compile.evaluation.quality.report import paired_difference, paired_targets
from kvpop_compile.evaluation.statistics import draws, ratio


def results_of(**methods) -> dict:
    """A run's results with the teacher-forced ``correct`` and ``count`` of each method."""
    return {"methods": {name: {"teacher_forced": {"correct": num, "count": DEN}}
                        for name, num in methods.items()}}  # fmt: skip


def test_paired_difference_resamples_both_methods_and_the_reference_with_the_same_draws():
    resampled = draws(len(NUM)).tolist()
    results = results_of(full=REF_NUM, mine=NUM, rival=OTHER_NUM)
    boot = [(pooled(NUM, DEN, rows) - pooled(OTHER_NUM, DEN, rows)) / pooled(REF_NUM, REF_DEN, rows)
            for rows in resampled]  # fmt: skip
    d = paired_difference(results, "mine", "rival", "retention")
    value = (sum(NUM) - sum(OTHER_NUM)) / sum(REF_NUM)
    assert d.value == pytest.approx(value, rel=1e-12)
    assert d.low == pytest.approx(percentile(boot, 0.025), rel=1e-12)
    assert d.high == pytest.approx(percentile(boot, 0.975), rel=1e-12)
    # Against the two methods' own (unpaired) intervals: the pairing is what narrows it here.
    a, b = ratio(NUM, DEN, REF_NUM, REF_DEN), ratio(OTHER_NUM, DEN, REF_NUM, REF_DEN)
    assert d.value == pytest.approx(a.value - b.value, rel=1e-12)


def test_a_shift_every_sequence_shares_has_a_point_interval():
    # With one count per sequence, one more correct target in each gives the same accuracy
    # difference under every draw, however the sequences differ from each other.
    count = [8.0] * 6
    base = [1.0, 7.0, 0.0, 4.0, 6.0, 2.0]
    results = {"methods": {
        "a": {"teacher_forced": {"correct": [x + 1 for x in base], "count": count}},
        "b": {"teacher_forced": {"correct": base, "count": count}},
    }}  # fmt: skip
    d = paired_difference(results, "a", "b", "accuracy")
    assert (d.value, d.low, d.high) == pytest.approx((1 / 8, 1 / 8, 1 / 8), rel=1e-12)
    same = paired_difference(results, "b", "b", "accuracy")
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)


def test_paired_difference_refuses_a_figure_or_method_it_cannot_pair():
    results = results_of(full=REF_NUM, mine=NUM)
    with pytest.raises(
        ValueError, match="figure must be one of .*'retention'.*got 'first_difference'"
    ):
        paired_difference(results, "mine", "full", "first_difference")
    with pytest.raises(ValueError, match="no 'retention' for method 'rival'"):
        paired_difference(results, "mine", "rival", "retention")
    with pytest.raises(ValueError, match="no 'lr_retention' for method 'mine'"):
        paired_difference(results, "mine", "full", "lr_retention")


def test_a_learned_policy_meets_its_heuristic_target_where_the_interval_reaches_zero():
    # Fewer correct in every sequence but the last (0 in both): a difference below zero under
    # every draw but one of only the last sequence; swapped at the other budget.
    worse = [0.0, 1.0, 2.0, 0.0, 1.0, 0.0]
    methods = {
        "memory @ 88%": worse,
        "window @ 88%": NUM,
        "memory @ 75%": NUM,
        "window @ 75%": worse,
    }
    # Nearly alike: an interval across zero, which meets the target (not shown to be worse).
    methods |= {"mlp @ 88%": OTHER_NUM, "random @ 88%": NUM}
    lines = paired_targets(results_of(full=REF_NUM, **methods))
    assert len(lines) == 3, lines  # no long-range figures in this run
    at_75, at_88, mlp = lines
    assert at_75.endswith("— met") and at_88.endswith("— missed"), lines
    assert "`mlp` keeps at least `random`'s" in mlp and mlp.endswith("— met"), mlp
    assert "interval [-" in mlp and ", +" in mlp, mlp
    gap = 100 * (sum(NUM) - sum(worse)) / sum(REF_NUM)
    assert f"difference +{gap:.1f} points" in at_75 and f"difference -{gap:.1f} points" in at_88
