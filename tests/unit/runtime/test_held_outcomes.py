"""A record produced while an overlapped commit is in flight is held until its commit begins; a
caller that counts its outcome (a dead letter: its reason, or DEAD_LETTER_REFUSED) must hear
the real one, known only when the record reaches the producer. No Kafka, no clock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from engine.runtime.commit.transaction import Transactions
from engine.runtime.process.watchdog import Watchdog


class _Producer:
    """Refuses records on the topic "refused" as too large; the commit waits for `release`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.produced: list[str] = []

    def produce(self, topic: str, **kwargs: Any) -> None:
        if topic == "refused":
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "message too large"))
        self.produced.append(topic)

    def poll(self, timeout: float = -1) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        return 0

    def init_transactions(self, timeout: float = -1) -> None: ...
    def begin_transaction(self) -> None: ...
    def abort_transaction(self, timeout: float = -1) -> None: ...

    def commit_transaction(self, timeout: float = -1) -> None:
        assert self.release.wait(60)

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None: ...


def test_a_held_optional_record_reports_its_real_outcome_once_produced() -> None:
    producer = _Producer()
    txn = Transactions(producer, Watchdog(clock=lambda: 0.0, on_expired=lambda e: None), 45.0)
    outcomes: list[tuple[str, bool]] = []

    def heard(topic: str) -> Callable[[bool], None]:
        return lambda delivered: outcomes.append((topic, delivered))

    first = txn.for_outputs()
    assert first.produce("ok", None, b"v", "2 fold", optional=True, outcome=lambda d: None)
    first.write_changelog("changelog", [], [TopicPartition("in", 0, 1)], lambda: object())
    txn.hand_to_worker(first)
    for topic in ("refused", "ok"):
        held = txn.for_outputs().produce(
            topic,
            None,
            b"v",
            "2 fold",
            optional=True,
            outcome=heard(topic),
        )
        assert held, "held records count as queued"
    assert outcomes == [], "nothing is known while the records are held"
    producer.release.set()
    assert txn.returned() is first
    after = txn.current
    assert after is not None
    assert after.holds_outputs
    assert after.begin() == 2
    assert outcomes == [("refused", False), ("ok", True)]
    assert producer.produced == ["ok", "ok"]


def test_a_record_produced_at_once_reports_at_once() -> None:
    txn = Transactions(_Producer(), Watchdog(clock=lambda: 0.0, on_expired=lambda e: None), 45.0)
    outcomes: list[bool] = []
    commit = txn.for_outputs()
    assert not commit.produce(
        "refused", None, b"v", "2 fold", optional=True, outcome=outcomes.append
    )
    assert commit.produce("ok", None, b"v", "2 fold", optional=True, outcome=outcomes.append)
    assert outcomes == [False, True]
