"""Rejoins back off: a fault that every new set of clients hits again (an ACL missing, a broker
that keeps failing) must not spin. The pauses double from 0.5 s to `rejoin_backoff_max_s`, a
committed transaction starts the count again, and the inputs are still answered exactly once.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from engine.runtime.clients import ConsumerLike, ProducerLike
from engine.runtime.engine import Engine
from engine.settings import Settings, load_settings
from tests.integration.engine_harness import CODEC
from tests.integration.exactly_once import workload
from tests.unit.runtime.fakes import FakeBroker, FakeClients, FakeConsumer, Faults
from tests.unit.runtime.test_faults import PARTITIONS, _check_replay, _done


def _settings(tmp_path: Path) -> Settings:
    return load_settings(
        environ={},
        partitions=PARTITIONS,
        state_dir=tmp_path / "state",
        metrics_port=0,
        commit_max_events=5,
        commit_interval_ms=60_000,
        transaction_timeout_ms=65_000,  # the interval + TXN_TIMEOUT_MARGIN_MS
        rejoin_backoff_max_s=4.0,
    )


class _DeniedConsumer(FakeConsumer):
    """The group's ACL is missing: every consume answers GROUP_AUTHORIZATION_FAILED."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        error = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "group not authorized")
        return [Message(error=error)]


class _Flaky(FakeClients):
    """The first `denied` incarnations are refused; `broken` producers fail to start."""

    def __init__(self, broker: FakeBroker, denied: set[int], broken: set[int]) -> None:
        super().__init__(broker)
        self.denied, self.broken = denied, broken
        self.incarnation = 0

    def producer(self, settings: Settings) -> ProducerLike:
        self.incarnation += 1
        if self.incarnation in self.broken:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down", fatal=False))
        return super().producer(settings)

    def consumer(self, settings: Settings) -> ConsumerLike:
        if self.incarnation in self.denied:
            return _DeniedConsumer(self.broker, lambda: self.on_idle(), self.batch)
        return super().consumer(settings)


def _broker(settings: Settings, events: int) -> FakeBroker:
    broker = FakeBroker(PARTITIONS, Faults())
    for event in workload(events, seed=5):
        broker.append(
            settings.topics.topic_for(event), event.session_id.encode(), CODEC.encode(event)
        )
    return broker


def test_rejoins_in_a_row_back_off_exponentially_up_to_the_cap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path)
    broker = _broker(settings, 12)
    clients = _Flaky(broker, denied={1, 2, 4, 5, 6}, broken={3})
    pauses: list[float] = []
    engine = Engine(settings, clients=clients, pause=pauses.append)
    clients.on_idle = engine.stop
    with caplog.at_level(logging.ERROR, logger="reconciler.engine"):
        engine.run()
    assert pauses == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert engine.rejoins == 6
    assert engine.metrics.rejoins._value.get() == 6
    counted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rejoin #")]
    assert counted[0] == "rejoin #1 (1 in a row without a commit) in 0.5s"
    assert counted[-1] == "rejoin #6 (6 in a row without a commit) in 4.0s"
    assert any("grant the engine's principal" in r.getMessage() for r in caplog.records)
    assert _done(broker, settings)
    _check_replay(broker, settings)


class _DeniedAfterCommits(FakeClients):
    """Incarnation 1 commits, then its group ACL goes away; every later one is refused until
    incarnation `until`."""

    def __init__(self, broker: FakeBroker, until: int) -> None:
        super().__init__(broker)
        self.until = until
        self.incarnation = 0

    def consumer(self, settings: Settings) -> ConsumerLike:
        self.incarnation += 1
        if self.incarnation == 1:
            return _DeniedOnceDrained(self.broker, lambda: None, self.batch)
        if self.incarnation < self.until:
            return _DeniedConsumer(self.broker, lambda: None, self.batch)
        return super().consumer(settings)


class _DeniedOnceDrained(FakeConsumer):
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        out = super().consume(num_messages, timeout)
        if out:
            return out
        error = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "group not authorized")
        return [Message(error=error)]


def test_a_committed_transaction_starts_the_backoff_again(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    broker = _broker(settings, 12)
    clients = _DeniedAfterCommits(broker, until=4)
    pauses: list[float] = []
    engine = Engine(settings, clients=clients, pause=pauses.append)
    clients.on_idle = engine.stop
    engine.run()
    # incarnation 1 committed before its failure: the first pause is the initial one again
    assert pauses == [0.5, 1.0, 2.0]
    assert _done(broker, settings)
    _check_replay(broker, settings)
