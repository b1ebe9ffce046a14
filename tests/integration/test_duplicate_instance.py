"""With Kafka: two engines started with one instance id (one group.instance.id, one
transactional.id) stop fencing each other. One of them names the other in an error line, its
metrics and /readyz, and waits while the other runs, so the fatal aborts of both stay few in
a 30 s window (without the wait they fence each other every few seconds); every input is
still answered exactly once."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from engine.runtime.engine import Engine
from engine.runtime.process.metrics import EngineMetrics
from tests.integration.engine_harness import engine_settings, produce, read_decisions
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload

pytestmark = pytest.mark.kafka

WINDOW_S = 30.0
MOST_FATAL = 4  # both engines together in the window: 2 measured; fighting made 10
READY_S = 30.0


def _fatal(metrics: EngineMetrics) -> float:
    return float(metrics.aborts.labels(kind="fatal")._value.get())


def test_a_second_engine_with_the_same_instance_id_is_named_and_waits(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "a")
    # the same instance id, its own disk: a second host or pod started with the same name
    twin = settings.model_copy(update={"state_dir": tmp_path / "b"})
    events = workload(40, seed=17)
    half = len(events) // 2
    produce(kafka_bootstrap, settings, events[:half])
    engines = [Engine(s, metrics=EngineMetrics()) for s in (settings, twin)]
    threads = [threading.Thread(target=e.run, name=f"engine-{i}") for i, e in enumerate(engines)]
    caplog.set_level(logging.INFO, logger="reconciler.engine")
    try:
        threads[0].start()
        deadline = time.monotonic() + READY_S
        while not engines[0].metrics.is_ready and time.monotonic() < deadline:
            time.sleep(0.1)
        assert engines[0].metrics.is_ready, f"the first engine not ready within {READY_S}s"
        threads[1].start()
        window_ends = time.monotonic() + WINDOW_S
        produce(kafka_bootstrap, settings, events[half:])
        time.sleep(max(0.0, window_ends - time.monotonic()))
        fatal = [_fatal(e.metrics) for e in engines]
        waiting = [e for e in engines if e.metrics.duplicate_instance._value.get() == 1]
        seen = read_decisions(
            kafka_bootstrap, settings, until=len(events), timeout_s=20, inputs=True
        )
    finally:
        for engine in engines:
            engine.stop()
        for thread in threads:
            if thread.is_alive():
                thread.join(timeout=40)
    assert not any(t.is_alive() for t in threads), "an engine did not stop within 40 s"
    print(f"fatal aborts in {WINDOW_S}s per engine: {fatal}")
    assert sum(fatal) <= MOST_FATAL, f"fatal aborts in {WINDOW_S}s: {fatal}"
    assert len(waiting) == 1, "exactly one engine waits while the other runs"
    assert waiting[0].metrics.duplicate_detections._value.get() >= 1
    reason = waiting[0].metrics.unready_reason
    assert reason.startswith(
        f"duplicate instance id: two processes run with --instance-id {settings.instance_id}"
    )
    assert reason.endswith("stop one or give each its own id")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(line.startswith("duplicate instance id: two processes run with") for line in lines)
    assert_exactly_once(events, seen, read_inputs(kafka_bootstrap, settings))
