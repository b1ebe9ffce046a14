"""Rebalances and a broker restart under load keep exactly-once (see exactly_once.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from msgspec.structs import replace

from engine.core.events import Decision, Event
from engine.settings import Settings
from engine.wire import RecordType
from tests.integration.engine_harness import (
    CODEC,
    EngineProcess,
    engine_settings,
    produce,
    read_decisions,
)
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload
from tools import kafka_local

pytestmark = pytest.mark.kafka

# Two by default: the stale-coordinator hang (clients.py, metadata.recovery.strategy) showed on
# the first restart only in some runs, on the second in most.
RESTARTS = int(os.environ.get("RECONCILER_SOAK_RESTARTS", "2"))
RECOVERY_MARGIN_S = 10.0
"""Beyond the group session timeout: the engine's consumer may be evicted just after the broker
is back (its heartbeats failed while it was away), then new clients, the rejoin backoff (0.5 s),
the join, the restore, one commit and this test's own tail consumer. It was the watchdog's
budget (transaction timeout + margin, 40 s here) while send_offsets hung."""


def _steady_load(
    bootstrap: str, settings: Settings, events: list[Event], chunks: int, pause_s: float
) -> threading.Thread:
    def load() -> None:
        size = max(1, len(events) // chunks)
        for start in range(0, len(events), size):
            for _attempt in range(60):  # the broker may be restarting
                try:
                    produce(bootstrap, settings, events[start : start + size])
                    break
                except AssertionError:
                    time.sleep(1)
            time.sleep(pause_s)

    thread = threading.Thread(target=load)
    thread.start()
    return thread


def test_three_engines_one_killed_one_added(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    base = engine_settings(kafka_bootstrap, unique_name, tmp_path / "unused")
    engines = [
        EngineProcess(
            base.model_copy(
                update={"instance_id": f"engine-{i}", "state_dir": tmp_path / f"pod-{i}"}
            ),
            tmp_path / f"engine-{i}.log",
        )
        for i in range(4)
    ]
    events = workload(240, seed=11)
    for engine in engines[:3]:
        engine.start()
    load = _steady_load(kafka_bootstrap, base, events, chunks=30, pause_s=0.4)
    try:
        time.sleep(5)
        engines[1].kill_all()  # the pod is gone: its partitions move once its session times out
        time.sleep(3)
        engines[3].start()  # a new member joins: another rebalance
        load.join()
        seen = read_decisions(kafka_bootstrap, base, until=len(events), timeout_s=180, inputs=True)
        for engine in (engines[0], engines[2], engines[3]):
            assert engine.terminate() == 0
    finally:
        for engine in engines:
            if engine.alive():
                engine.kill_all()
        load.join()
    assert_exactly_once(events, seen, read_inputs(kafka_bootstrap, base))
    logs = [(tmp_path / f"engine-{i}.log").read_text() for i in (0, 2, 3)]
    assert any("step A2" in log for log in logs[2:]), "the added engine never took a partition"


class _DecisionTail:
    """A read_committed reader of the decisions topic that remembers every decision id."""

    def __init__(self, bootstrap: str, settings: Settings) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"tail-{time.time_ns()}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.consumer.subscribe([settings.topics.decisions])
        self.ids: set[str] = set()

    def wait_for(self, wanted: set[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not wanted <= self.ids:
            for message in self.consumer.consume(500, timeout=0.3):
                if message.error() is None:
                    decision = CODEC.decode(RecordType.DECISION, message.value() or b"")
                    assert isinstance(decision, Decision)
                    self.ids.add(decision.decision_id)
        return wanted <= self.ids


def _probe(
    bootstrap: str, settings: Settings, n: int, timeout_s: float
) -> tuple[list[Event], bool]:
    """Fresh sessions produced now; True once all of their decisions are readable."""
    probe = [
        replace(e, session_id=f"probe-{n}-{e.session_id}", event_id=f"probe-{n}-{e.event_id}")
        for e in workload(2, seed=1_000 + n)
    ]
    produce(bootstrap, settings, probe)
    tail = _DecisionTail(bootstrap, settings)
    try:
        return probe, tail.wait_for({e.event_id for e in probe}, timeout_s)
    finally:
        tail.consumer.close()


# Each restart takes the broker ~10 s and recovery up to RECOVERY_MARGIN_S + the session
# timeout: the soak's size scales the time.
@pytest.mark.timeout(max(300, 180 + 45 * RESTARTS))
def test_broker_restart_under_load(
    kafka_bootstrap: str, kafka_instance: str, unique_name: str, tmp_path: Path
) -> None:
    """`make test`: two restarts. `make soak`: RECONCILER_SOAK_RESTARTS restarts under a steady
    load, each followed by fresh sessions that must be decided within the session timeout +
    RECOVERY_MARGIN_S of the broker answering again, no manual step."""
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    bound_s = settings.session_timeout_ms / 1000 + RECOVERY_MARGIN_S
    events = workload(120 * max(1, RESTARTS // 4), seed=23)
    engine = EngineProcess(settings, tmp_path / "engine.log").start()
    load = _steady_load(kafka_bootstrap, settings, events, chunks=20 * RESTARTS, pause_s=0.3)
    recoveries: list[float] = []
    try:
        # The first restart hits a running engine, not one still joining its group.
        probes, flowing = _probe(kafka_bootstrap, settings, -1, timeout_s=60)
        assert flowing, "the engine answered nothing within 60 s of its start"
        for n in range(RESTARTS):
            kafka_local.restart(kafka_instance)
            back = time.monotonic()
            probe, flowing = _probe(kafka_bootstrap, settings, n, bound_s)
            probes += probe
            if not flowing:
                engine.dump_stacks()
            assert flowing, f"restart {n + 1}: no decisions within {bound_s:.0f}s of broker up"
            recoveries.append(time.monotonic() - back)
            print(f"restart {n + 1}: decisions again {recoveries[-1]:.1f}s after broker up")
        load.join()
        everything = events + probes
        seen = read_decisions(
            kafka_bootstrap, settings, until=len(everything), timeout_s=240, inputs=True
        )
        assert engine.alive(), "the engine must survive a broker restart on its own"
        assert engine.terminate() == 0
    finally:
        if engine.alive():
            engine.kill_all()
        load.join()
    assert_exactly_once(everything, seen, read_inputs(kafka_bootstrap, settings))
    print(
        f"broker restarts: {RESTARTS}; decisions again after each within "
        f"max {max(recoveries):.1f}s, mean {sum(recoveries) / len(recoveries):.1f}s "
        f"(from broker up; bound {bound_s:.0f}s); {len(everything)} inputs exactly once"
    )
