"""The Kafka clients the engine uses, behind one factory that tests replace with fakes.

`ProducerLike` and `ConsumerLike` name only the calls the engine makes, so a fake can inject a
retriable, abortable, fatal or fencing error, or a call that never returns, at any step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from engine.runtime.commit.fencing import FenceReport, fence_previous_owners, transactional_id
from engine.runtime.tasks.changelog import ChangelogReader, KafkaChangelogReader
from engine.settings import Settings

MAX_POLL_INTERVAL_MS = 60_000
DEAD_LETTER_MAX_BYTES = 2_200_000
"""The producer's `message.max.bytes`; a dead letter is bounded well below it (excerpts)."""

DeliveryCallback = Callable[[Any, Message], None]

RECONNECT_BACKOFF_MAX_MS = 1_000
"""librdkafka doubles the pause between connection attempts to a broker that is away up to this
(its default, 10 s, let a client that outlived a broker restart wait up to 10 s more before it
saw the broker back: a soak restart took 10.2 s so). One attempt a second costs nothing."""
PRODUCER_IDLE_CLOSE_MS = 1_000
"""The producer closes a connection that carried nothing for this long (librdkafka's
`connections.max.idle.ms`; off by default). Why: when the group coordinator's broker leaves the
metadata (a restart or kill on a cluster), `send_offsets_to_transaction` can wait on the retired
handle for a broker state change that never comes
(https://github.com/confluentinc/librdkafka/issues/5511). While it waits the producer sends
nothing, so its other connections go idle and close after this long: that is a state change,
the coordinator is looked up again and the call completes instead of being cut by the watchdog
(a process restart). A busy producer's connections are never idle this long; an idle engine's
connections reconnect on the next commit (one round trip)."""


class ProducerLike(Protocol):
    def produce(
        self,
        topic: str,
        *,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: Any = None,
        headers: Any = None,
    ) -> None: ...
    def poll(self, timeout: float = -1) -> int: ...
    def flush(self, timeout: float = -1) -> int: ...
    def init_transactions(self, timeout: float = -1) -> None: ...
    def begin_transaction(self) -> None: ...
    def commit_transaction(self, timeout: float = -1) -> None: ...
    def abort_transaction(self, timeout: float = -1) -> None: ...
    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None: ...


class ConsumerLike(Protocol):
    def subscribe(
        self,
        topics: list[str],
        on_assign: Any = None,
        on_revoke: Any = None,
        on_lost: Any = None,
    ) -> None: ...
    def assign(self, partitions: list[TopicPartition]) -> None: ...
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]: ...
    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]: ...
    def seek(self, partition: TopicPartition) -> None: ...
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...
    def pause(self, partitions: list[TopicPartition]) -> None: ...
    def resume(self, partitions: list[TopicPartition]) -> None: ...
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]: ...
    def consumer_group_metadata(self) -> Any: ...
    def memberid(self) -> str | None: ...
    def close(self) -> None: ...


class ClientFactory(Protocol):
    """Creates the clients of one engine incarnation (and again after every rejoin)."""

    def producer(self, settings: Settings) -> ProducerLike: ...
    def consumer(self, settings: Settings) -> ConsumerLike: ...
    def changelog_reader(self, settings: Settings) -> ChangelogReader: ...
    def fence(
        self, settings: Settings, partitions: list[TopicPartition], timeout_s: float
    ) -> FenceReport: ...


def producer_config(settings: Settings) -> dict[str, Any]:
    s = settings
    return s.client_config(
        **{
            "transactional.id": transactional_id(s),
            "transaction.timeout.ms": s.transaction_timeout_ms,
            "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "linger.ms": s.producer_linger_ms,
            "message.max.bytes": DEAD_LETTER_MAX_BYTES,
            # librdkafka's default is 1 GB; a transaction's records wait here until flushed.
            "queue.buffering.max.kbytes": s.producer_queue_mb * 1024,
            # When every known broker is down (a one-node broker restarting), librdkafka 2.16
            # re-bootstraps and retires its broker handles, but its coordinator cache keeps the
            # retired handle for our group: the next send_offsets_to_transaction then waits for
            # a state change that never comes, past its timeout
            # (https://github.com/confluentinc/librdkafka/issues/5456,
            # https://github.com/confluentinc/librdkafka/issues/5511), and only the watchdog
            # ends it, ~45 s after the broker is back. Without the
            # re-bootstrap the handle stays and reconnects. A cluster whose addresses all change
            # is still found: a producer that cannot reach it fails its calls, and the rejoin
            # builds new clients from `bootstrap.servers`.
            "metadata.recovery.strategy": "none",
            "connections.max.idle.ms": PRODUCER_IDLE_CLOSE_MS,
        }
    )


def consumer_config(settings: Settings) -> dict[str, Any]:
    s = settings
    return s.client_config(
        **{
            "group.id": s.group_id,
            "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
            "group.instance.id": s.instance_id,
            "partition.assignment.strategy": "range",
            "session.timeout.ms": s.session_timeout_ms,
            # The survivors of a dead member hear of the rebalance at their next heartbeat:
            # at a tenth of the session timeout that adds at most 1 s to a failover (a sixth
            # added up to 1.7 s; README "Failover"). A heartbeat is one small request.
            "heartbeat.interval.ms": max(250, s.session_timeout_ms // 10),
            "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            # The end of an input partition tells the event-time ordering (ordering.py) that
            # nothing unread is there to wait for.
            "enable.partition.eof": True,
            # Pre-fetched records wait in librdkafka's queue and then as Python bytes in one
            # consume() batch: bound both by bytes (default 64 MB of queue; a batch of 1,000
            # records near the 1 MB record limit would be 1 GB), or large inputs grow RSS.
            **fetch_bounds(s),
        }
    )


def fetch_bounds(settings: Settings) -> dict[str, int]:
    kbytes = settings.fetch_queue_mb * 1024
    return {"queued.max.messages.kbytes": kbytes, "fetch.max.bytes": kbytes * 1024 // 2}


class KafkaClients:
    """The real thing: confluent-kafka clients and the changelog reader of step A2."""

    def producer(self, settings: Settings) -> ProducerLike:
        return Producer(producer_config(settings))

    def consumer(self, settings: Settings) -> ConsumerLike:
        return Consumer(consumer_config(settings))

    def changelog_reader(self, settings: Settings) -> ChangelogReader:
        return KafkaChangelogReader(
            settings.client_config(**fetch_bounds(settings)), settings.topics.changelog
        )

    def fence(
        self, settings: Settings, partitions: list[TopicPartition], timeout_s: float
    ) -> FenceReport:
        return fence_previous_owners(settings, partitions, timeout_s)
