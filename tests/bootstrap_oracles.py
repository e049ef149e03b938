"""A plain-Python oracle of the percentile bootstrap, and the per-row sums its tests pool."""


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
OTHER_NUM = [4.0, 2.0, 9.0, 3.0, 5.0, 1.0]
