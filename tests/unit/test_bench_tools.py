"""The bench's own arithmetic: stage quantiles from two /metrics scrapes, the table's spread."""

from __future__ import annotations

import math

from tools.bench_engine import _int, _spread
from tools.bench_latency import quantile


def test_quantile_interpolates_within_the_bucket_of_the_increase_only() -> None:
    before = {0.01: 100.0, 0.1: 100.0, float("inf"): 100.0}  # all before the run: ignored
    after = {0.01: 150.0, 0.1: 200.0, float("inf"): 200.0}  # +50 under 10 ms, +50 in 10-100 ms
    assert math.isclose(quantile(0.5, before, after) or 0.0, 0.01)
    assert math.isclose(quantile(0.75, before, after) or 0.0, 0.055)
    assert math.isclose(quantile(0.99, before, after) or 0.0, 0.0982)


def test_quantile_of_nothing_new_is_unknown_and_above_the_last_bound_is_that_bound() -> None:
    same = {0.5: 3.0, float("inf"): 3.0}
    assert quantile(0.5, same, same) is None
    assert quantile(0.99, {}, {0.5: 0.0, float("inf"): 4.0}) == 0.5


def test_spread_is_the_median_and_range() -> None:
    assert _spread([3000.0, 1000.0, 2000.0], _int) == "2,000 (1,000-3,000)"
    assert _spread([5.0], _int) == "5"
    assert _spread([], _int) == "n/a"
