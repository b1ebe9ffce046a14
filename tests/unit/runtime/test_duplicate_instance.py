"""A second live process with this engine's instance id: after a fencing, the engine names it
in one error line, the metrics and /readyz, and waits with a growing pause (1 s doubling to
30 s) until that process is gone, instead of fencing it again; a fencing with no other holder
(a successor after a crash) rejoins as before, with nothing said. Inputs stay exactly once."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message

from engine.runtime.clients import ConsumerLike
from engine.runtime.engine import Engine
from engine.runtime.process.duplicate import incarnation_of, others, with_incarnation
from engine.runtime.process.health import serve_health
from engine.runtime.process.metrics import EngineMetrics
from engine.settings import Settings
from tests.unit.runtime.fakes import FakeBroker, FakeClients, FakeConsumer
from tests.unit.runtime.test_faults import _check_replay, _done
from tests.unit.runtime.test_rejoin_backoff import _broker, _settings


class _FencedConsumer(FakeConsumer):
    """Another process joined with our group.instance.id: the member is fenced."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        error = KafkaError(KafkaError.FENCED_INSTANCE_ID, "static member fenced", fatal=True)
        return [Message(error=error)]


class _FencedFirst(FakeClients):
    def __init__(self, broker: FakeBroker) -> None:
        super().__init__(broker)
        self.client_ids: list[str] = []

    def consumer(self, settings: Settings) -> ConsumerLike:
        self.client_ids.append(str(settings.kafka["client.id"]))
        if len(self.client_ids) == 1:
            return _FencedConsumer(self.broker, lambda: None, self.batch)
        return super().consumer(settings)


def _run(
    tmp_path: Path, answers: list[list[str]], caplog: pytest.LogCaptureFixture
) -> tuple[Engine, _FencedFirst, list[tuple[float, float, str]], list[str]]:
    settings = _settings(tmp_path)
    broker = _broker(settings, 12)
    clients = _FencedFirst(broker)
    looked: list[str] = []

    def holders(s: Settings, incarnation: str, timeout_s: float) -> list[str]:
        looked.append(incarnation)
        return answers.pop(0) if answers else []

    pauses: list[tuple[float, float, str]] = []
    engine = Engine(settings, clients=clients, holders=holders, pause=lambda s: None)

    def pause(seconds: float) -> None:  # what an operator would see during each pause
        m = engine.metrics
        pauses.append((seconds, m.duplicate_instance._value.get(), m.unready_reason))

    engine.pause = engine.duplicates.pause = pause
    clients.on_idle = engine.stop
    with caplog.at_level(logging.INFO, logger="reconciler.engine"):
        engine.run()
    assert _done(broker, settings)
    _check_replay(broker, settings)
    return engine, clients, pauses, looked


def test_a_live_holder_of_the_id_is_named_and_waited_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = "reconciler#0123456789ab"
    engine, clients, pauses, looked = _run(tmp_path, [[other], [other], [other], []], caplog)
    # the ordinary rejoin pause, then 1 s doubling while the other process holds the id
    assert [p[0] for p in pauses] == [0.5, 1.0, 2.0, 4.0]
    assert [p[1] for p in pauses] == [0.0, 1.0, 1.0, 1.0]
    reason = pauses[1][2]
    assert "two processes run with --instance-id engine-0" in reason
    assert other in reason
    assert "stop one or give each its own id" in reason
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    duplicate_lines = [e for e in errors if e.startswith("duplicate instance id: ")]
    assert len(duplicate_lines) == 3
    assert duplicate_lines[0].endswith("not rejoining for 1s")
    assert engine.metrics.duplicate_detections._value.get() == 3
    # gone: the gauge and /readyz's reason clear, and the engine rejoined and finished
    assert engine.metrics.duplicate_instance._value.get() == 0
    assert engine.metrics.unready_reason == ""
    assert looked == [engine.incarnation] * 4
    assert len(clients.client_ids) == 2
    assert all(incarnation_of(c) == engine.incarnation for c in clients.client_ids)


def test_a_fencing_with_no_other_holder_rejoins_without_a_word(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine, _, pauses, looked = _run(tmp_path, [[]], caplog)
    assert pauses == [(0.5, 0.0, "")]
    assert not any(r.getMessage().startswith("duplicate") for r in caplog.records)
    assert engine.metrics.duplicate_detections._value.get() == 0
    assert len(looked) == 1


def test_the_wait_is_capped_at_30_s(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, _, pauses, _ = _run(tmp_path, [["x#other"]] * 8, caplog)
    assert [p[0] for p in pauses[1:]] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_only_members_holding_the_id_from_another_incarnation_count(tmp_path: Path) -> None:
    members: list[tuple[str | None, str]] = [
        ("engine-0", "reconciler#mine"),  # this process's own closed consumer
        ("engine-1", "reconciler#theirs"),  # another instance id: ordinary
        (None, "rdkafka"),  # a dynamic member
        ("engine-0", "app#theirs"),  # the duplicate
    ]
    assert others(members, "engine-0", "mine") == ["app#theirs"]
    settings = _settings(tmp_path)
    named = with_incarnation(settings.model_copy(update={"kafka": {"client.id": "app"}}), "ab")
    assert named.kafka["client.id"] == "app#ab"
    assert with_incarnation(settings, "ab").kafka["client.id"] == "reconciler#ab"


def test_readyz_names_the_duplicate() -> None:
    metrics = EngineMetrics()
    server = serve_health(metrics, 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/readyz"
    try:
        with pytest.raises(urllib.error.HTTPError) as plain:
            urllib.request.urlopen(url, timeout=5)
        assert plain.value.code == 503
        assert plain.value.read() == b"restoring or unassigned\n"
        metrics.unready_reason = "duplicate instance id: two processes run with --instance-id x"
        with pytest.raises(urllib.error.HTTPError) as named:
            urllib.request.urlopen(url, timeout=5)
        assert named.value.read() == f"{metrics.unready_reason}\n".encode()
    finally:
        server.shutdown()
        server.server_close()
