"""With Kafka: two engines started with one instance id (one group.instance.id, one
transactional.id) stop fencing each other. One of them names the other in an error line, its
metrics and /readyz, and waits while the other runs, so the fatal aborts of both stay few in
a 30 s window (without the wait they fence each other every few seconds); every input is
still answered exactly once. The successor of a killed engine is no duplicate, even when a
fatal error makes it rejoin while the coordinator's member still carries the dead process's
client.id."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from engine.runtime.commit.fencing import transactional_id
from engine.runtime.engine import Engine
from engine.runtime.process.metrics import EngineMetrics
from tests.integration.engine_harness import (
    EngineProcess,
    engine_settings,
    produce,
    read_decisions,
)
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload
from tests.integration.group_probes import member_ids

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""  # between two engine processes nothing listens


def _wait_for(what: str, done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f}s"
        time.sleep(0.1)


def _sample(metrics: str, name: str) -> float:
    line = next(line for line in metrics.splitlines() if line.startswith(f"{name} "))
    return float(line.split()[1])


def test_a_static_join_keeps_the_client_id_of_the_first_process_under_the_id(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    """What the duplicate check reads: the coordinator's member for a group.instance.id gets
    each new join's member id, but keeps the client.id of the first process that joined."""
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path)
    group_id = f"{unique_name}-probe"

    def joined(client_id: str) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": group_id,
                "group.instance.id": "probe-0",
                "client.id": client_id,
                "session.timeout.ms": 6_000,
            }
        )
        consumer.subscribe([settings.topics.intents])
        _wait_for(
            f"{client_id} joined", lambda: bool(consumer.poll(0.2) or consumer.assignment()), 30
        )
        return consumer

    first = joined("first-process")
    second = joined("second-process")
    try:
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        group = admin.describe_consumer_groups([group_id])[group_id].result(10)
        listed = [(m.group_instance_id, m.member_id, m.client_id) for m in group.members]
        assert listed == [("probe-0", second.memberid(), "first-process")]
        assert second.memberid() != first.memberid()
    finally:
        second.close()
        with contextlib.suppress(KafkaException):  # fenced: a fatal error on close
            first.close()


def test_the_successor_of_a_killed_engine_that_rejoins_is_no_duplicate(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    port = _free_port()
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state", metrics_port=port)
    events = workload(40, seed=23)
    half = len(events) // 2
    log_path = tmp_path / "engine.log"
    engine = EngineProcess(settings, log_path).start()
    try:
        produce(kafka_bootstrap, settings, events[:half])
        _wait_for("the first engine ready", lambda: _get(port, "/readyz")[0] == 200, 60)
        before = member_ids(kafka_bootstrap, settings)[settings.instance_id]
        engine.kill()  # kill -9; the supervisor starts the successor at once
        _wait_for(
            "the successor's join",
            lambda: (
                member_ids(kafka_bootstrap, settings).get(settings.instance_id, before) != before
            ),
            60,
        )
        _wait_for("the successor ready", lambda: _get(port, "/readyz")[0] == 200, 60)
        # A fatal error in the successor: its producer fenced (as a transaction timeout or
        # another instance's step A0 would). It rejoins and asks who holds its id.
        fencer = Producer(
            {"bootstrap.servers": kafka_bootstrap, "transactional.id": transactional_id(settings)}
        )
        fencer.init_transactions(30)
        produce(kafka_bootstrap, settings, events[half:])
        seen = read_decisions(
            kafka_bootstrap, settings, until=len(events), timeout_s=120, inputs=True
        )
        status, metrics = _get(port, "/metrics")
        assert status == 200
        assert engine.terminate() == 0
    finally:
        if engine.alive():
            engine.kill_all()
    log = log_path.read_text()
    assert "fatal Kafka error, recreating clients and rejoining" in log, "no rejoin to check"
    assert _sample(metrics, "reconciler_rejoins_total") >= 1
    assert "duplicate instance id" not in log
    assert _sample(metrics, "reconciler_duplicate_instance_detections_total") == 0
    assert _sample(metrics, "reconciler_duplicate_instance") == 0
    assert_exactly_once(events, seen, read_inputs(kafka_bootstrap, settings))
