"""A second live process with this engine's instance id: after a fencing, the engine names it
in one error line, the metrics and /readyz, and waits with a growing pause (1 s doubling to
30 s) until that process is gone, instead of fencing it again; a fencing with no other holder
rejoins as before, with nothing said, and so does the successor of a killed process, whose
dead member the coordinator still lists. Inputs stay exactly once."""

from __future__ import annotations

import functools
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from engine.runtime.clients import ConsumerLike, ProducerLike
from engine.runtime.engine import Engine
from engine.runtime.process.duplicate import Joined, other_holders, others
from engine.runtime.process.health import serve_health
from engine.runtime.process.metrics import EngineMetrics
from engine.settings import Settings
from tests.unit.runtime.fakes import (
    FakeBroker,
    FakeClients,
    FakeConsumer,
    FakeGroup,
    Faults,
    GroupClients,
)
from tests.unit.runtime.test_faults import _check_replay, _done
from tests.unit.runtime.test_rejoin_backoff import _broker, _settings

MINE = "engine-0-mine"  # the member id this engine's first consumer joined as


class _FencedConsumer(FakeConsumer):
    """Another process joined with our group.instance.id after this consumer: it is fenced."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        error = KafkaError(KafkaError.FENCED_INSTANCE_ID, "static member fenced", fatal=True)
        return [Message(error=error)]

    def memberid(self) -> str | None:
        return MINE


class _FencedFirst(FakeClients):
    def __init__(self, broker: FakeBroker) -> None:
        super().__init__(broker)
        self.created = 0

    def consumer(self, settings: Settings) -> ConsumerLike:
        self.created += 1
        if self.created == 1:
            return _FencedConsumer(self.broker, lambda: None, self.batch)
        return super().consumer(settings)


def _run(
    tmp_path: Path, answers: list[list[str]], caplog: pytest.LogCaptureFixture
) -> tuple[Engine, _FencedFirst, list[tuple[float, float, str]], list[tuple[str, ...]]]:
    settings = _settings(tmp_path)
    broker = _broker(settings, 12)
    clients = _FencedFirst(broker)
    looked: list[tuple[str, ...]] = []

    def holders(s: Settings, own: Collection[str], timeout_s: float) -> list[str]:
        looked.append(tuple(own))
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
    other = "engine-0-theirs"
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
    assert looked == [(MINE,)] * 4
    assert clients.created == 2


def test_a_fencing_with_no_other_holder_rejoins_without_a_word(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine, _, pauses, looked = _run(tmp_path, [[]], caplog)
    assert pauses == [(0.5, 0.0, "")]
    assert not any(r.getMessage().startswith("duplicate") for r in caplog.records)
    assert engine.metrics.duplicate_detections._value.get() == 0
    assert len(looked) == 1


def test_the_wait_is_capped_at_30_s(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, _, pauses, _ = _run(tmp_path, [["engine-0-theirs"]] * 8, caplog)
    assert [p[0] for p in pauses[1:]] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_only_members_holding_the_id_under_a_member_id_not_ours_count() -> None:
    members: list[tuple[str | None, str]] = [
        ("engine-0", "engine-0-mine"),  # this process's own closed consumer
        ("engine-1", "engine-1-theirs"),  # another instance id: ordinary
        (None, "rdkafka-dynamic"),  # a dynamic member
        ("engine-0", "engine-0-theirs"),  # the duplicate
    ]
    assert others(members, "engine-0", ("engine-0-old", "engine-0-mine")) == ["engine-0-theirs"]


class _Member:
    def __init__(self, member_id: str | None) -> None:
        self.member_id = member_id

    def memberid(self) -> str | None:
        if self.member_id == "closed":
            raise RuntimeError("Consumer closed")
        return self.member_id


def test_joined_keeps_the_member_ids_of_the_last_joins() -> None:
    joined = Joined()
    assert not joined
    for member_id in (None, "", "closed", "m-1", "m-1", *(f"m-{i}" for i in range(2, 12))):
        joined.note(_Member(member_id))
    assert joined.latest == "m-11"
    assert list(joined.member_ids) == [f"m-{i}" for i in range(4, 12)]


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


# With the coordinator's own bookkeeping of static members (fakes.FakeGroup): a replaced member
# keeps the client.id of the process that first joined under the id, and a member that stopped
# heartbeating (its process killed) stays listed until its session times out.

TWIN = "reconciler#0123456789ab"  # the client.id of another process (a killed one, or a twin)


class _StartsSlowly(GroupClients):
    """The first clients cannot start (the broker not reachable yet): nothing joined."""

    def producer(self, settings: Settings) -> ProducerLike:
        if not self.broker.clients_created:
            self.broker.clients_created += 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down", fatal=False))
        return super().producer(settings)


def _world(
    tmp_path: Path, faults: Faults, killed_predecessor: bool
) -> tuple[Settings, FakeBroker, FakeGroup]:
    """The inputs, and the group; with `killed_predecessor`, a process with this instance id
    was just killed (kill -9): its member stays listed until its session times out."""
    settings = _settings(tmp_path)
    broker = _broker(settings, 12)
    broker.faults = faults
    group = FakeGroup(settings.session_timeout_ms / 1000)
    if killed_predecessor:
        group.silent(group.join(settings.instance_id, TWIN))
    return settings, broker, group


def _run_in_group(
    settings: Settings,
    clients: GroupClients,
    caplog: pytest.LogCaptureFixture,
    on_pause: Callable[[Engine], None] = lambda engine: None,
) -> tuple[Engine, list[float]]:
    """An engine in `clients.group`, its pauses advancing the group's clock, until done."""
    group = clients.group
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        group.now += seconds
        on_pause(engine)

    holders = functools.partial(other_holders, admin_client=group.admin)
    engine = Engine(settings, clients=clients, holders=holders, pause=pause)
    clients.on_idle = engine.stop
    with caplog.at_level(logging.INFO, logger="reconciler.engine"):
        engine.run()
    assert _done(clients.broker, settings)
    _check_replay(clients.broker, settings)
    return engine, pauses


def _duplicate_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("duplicate")]


def test_a_killed_process_successor_that_then_fails_is_no_duplicate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the successor joins (replacing the dead member, whose client.id the member keeps), then
    # a fatal error at its first commit: it rejoins after the ordinary pause, nothing said
    settings, broker, group = _world(tmp_path, Faults(step="commit", kind="fatal"), True)
    clients = GroupClients(broker, group)
    engine, pauses = _run_in_group(settings, clients, caplog)
    assert broker.faults.fired == 1
    assert group.members["engine-0"].client_id == TWIN  # the coordinator's bookkeeping
    assert _duplicate_lines(caplog) == []
    assert engine.metrics.duplicate_detections._value.get() == 0
    assert pauses == [0.5]
    assert len(clients.consumers) == 2


def test_a_killed_process_successor_that_fails_before_joining_is_no_duplicate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the successor's first clients cannot start: the dead member is still listed when it asks
    settings, broker, group = _world(tmp_path, Faults(), True)
    clients = _StartsSlowly(broker, group)
    engine, pauses = _run_in_group(settings, clients, caplog)
    assert _duplicate_lines(caplog) == []
    assert engine.metrics.duplicate_detections._value.get() == 0
    assert pauses == [0.5]
    assert len(clients.consumers) == 1


class _TwinJoinsAfterFirstBatch(GroupClients):
    """Another live process joins under the same instance id once this one has consumed."""

    def __init__(self, broker: FakeBroker, group: FakeGroup) -> None:
        super().__init__(broker, group)
        self.twin: str | None = None

    def consumer(self, settings: Settings) -> ConsumerLike:
        consumer = super().consumer(settings)
        if len(self.consumers) == 1:
            consume = consumer.consume

            def then_twin(num_messages: int = 1, timeout: float = -1) -> list[Message]:
                out = consume(num_messages, timeout)
                if self.twin is None:
                    self.twin = self.group.join(settings.instance_id, TWIN)
                return out

            consumer.consume = then_twin  # type: ignore[method-assign]
        return consumer


def test_a_live_twin_that_took_the_id_is_named_until_it_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings, broker, group = _world(tmp_path, Faults(), False)
    clients = _TwinJoinsAfterFirstBatch(broker, group)
    seen: list[str] = []  # /readyz's reason during each pause

    def twin_stops_after_three_looks(engine: Engine) -> None:
        seen.append(engine.metrics.unready_reason)
        if len(seen) == 4:
            group.leave(settings.instance_id)  # stopped: a leave, or its session timed out

    engine, pauses = _run_in_group(settings, clients, caplog, twin_stops_after_three_looks)
    assert clients.twin is not None
    # the fencing's rejoin pause, then 1 s doubling while the twin holds the id
    assert pauses == [0.5, 1.0, 2.0, 4.0]
    assert len(_duplicate_lines(caplog)) == 3
    assert clients.twin in seen[1]
    assert seen[1].endswith("stop one or give each its own id")
    assert engine.metrics.duplicate_detections._value.get() == 3
    assert engine.metrics.duplicate_instance._value.get() == 0
    assert len(clients.consumers) == 2
