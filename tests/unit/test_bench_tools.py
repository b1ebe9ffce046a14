"""The bench's own arithmetic: stage quantiles from two /metrics scrapes, the table's spread,
CPU between two instants, the ceiling, the profile's breakdown."""

from __future__ import annotations

import math
from pathlib import Path

from tools.bench_engine import Run, _int, _spread
from tools.bench_kafka import CpuSampler
from tools.bench_latency import percentile, quantile
from tools.profile_engine import breakdown


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


def test_percentile_of_samples_is_the_sample_at_that_rank() -> None:
    samples = [float(n) for n in range(200, 0, -1)]  # 200 .. 1, unsorted on purpose
    assert percentile(samples, 0.5) == 101.0
    assert percentile(samples, 0.99) == 199.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_spread_is_the_median_and_range() -> None:
    assert _spread([3000.0, 1000.0, 2000.0], _int) == "2,000 (1,000-3,000)"
    assert _spread([5.0], _int) == "5"
    assert _spread([], _int) == "n/a"


def test_cpu_sampler_interpolates_between_samples_and_holds_at_the_ends() -> None:
    sampler = CpuSampler(lambda: 0.0)
    sampler.samples = [(10.0, 1.0), (12.0, 2.0), (14.0, 6.0)]
    assert sampler.at(11.0) == 1.5
    assert sampler.at(13.5) == 5.0
    assert (sampler.at(9.0), sampler.at(20.0)) == (1.0, 6.0)


def test_ceiling_is_the_cores_over_all_cpu_per_input() -> None:
    run = Run(1.0, 1.0, cpu_us=100.0, broker_us=60.0, client_us=40.0, decisions_per_input=1.0)
    assert run.ceiling(2) == 10_000.0


def test_profile_breakdown_counts_samples_under_the_loop_by_callee(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    loop = "main (engine/cli.py:3);Loop.run (engine/runtime/loop.py:48)"
    raw.write_text(
        f"{loop};Loop.iterate (engine/runtime/loop.py:64);fold (core/fold.py:9) 6\n"
        f"{loop};Loop.iterate (engine/runtime/loop.py:70) 2\n"
        f"{loop};Loop.commit (engine/runtime/loop.py:140) 3\n"
        f"{loop} 1\n"
        "Thread.run (threading.py:975);Event.wait (threading.py:629) 50\n"
    )
    total, shares = breakdown(raw)
    assert total == 12
    assert shares == {
        "Loop.iterate (loop.py)": 8,
        "Loop.commit (loop.py)": 3,
        "<self>": 1,
    }
