"""A histogram filled once per commit reads exactly as one filled value by value."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from engine.runtime.process.metrics import LATENCY_BUCKETS, EngineMetrics, observe_many

# On a bound, just past it, between bounds, beyond the last, zero and a clamped negative.
VALUES = [0.005, 0.0051, 0.3, 31.0, 0.0, 0.0, 2.5, 2.5000001, 0.01, 7.0]


def _histogram(values: list[float], batched: bool) -> list[str]:
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", buckets=LATENCY_BUCKETS, registry=registry)
    if batched:
        observe_many(histogram, values)
    else:
        for value in values:
            histogram.observe(value)
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if not line.startswith("h_created")]


def test_observe_many_equals_one_observe_per_value() -> None:
    assert _histogram(VALUES, batched=True) == _histogram(VALUES, batched=False)
    assert _histogram([], batched=True) == _histogram([], batched=False)


def test_decision_latencies_are_seconds_from_event_time_to_commit() -> None:
    metrics = EngineMetrics()
    metrics.observe_decision_latencies(10_000.0, [10_000, 9_995, 9_700, 12_000])
    text = generate_latest(metrics.registry).decode()
    assert 'reconciler_decision_latency_seconds_bucket{le="0.005"} 3.0' in text
    assert 'reconciler_decision_latency_seconds_bucket{le="0.25"} 3.0' in text
    assert 'reconciler_decision_latency_seconds_bucket{le="0.5"} 4.0' in text
    assert "reconciler_decision_latency_seconds_sum 0.305" in text
