"""In-memory stand-ins for the Kafka clients, from the engine's `ClientFactory`, for fault tests.

`FakeBroker` keeps committed logs and group offsets; a transaction's records and offsets become
visible only at `commit_transaction`, as with read_committed. `Faults` arms one failure at a
named step: a retriable, abortable, fatal or fencing error, a call that never returns (until
the test releases it), a crash of the whole process, or (kind "partition", for the plain offset
commit) a call that returns with one partition's entry carrying an error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal, cast

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import MemberAssignment, MemberDescription

from engine.runtime.clients import DEAD_LETTER_MAX_BYTES, ConsumerLike, ProducerLike
from engine.runtime.commit.fencing import FenceReport
from engine.runtime.tasks.changelog import ChangelogReader
from engine.settings import Settings
from engine.wire.partitioner import partition_for

KINDS = ("retriable", "abortable", "fatal", "fenced", "hang")
STEPS = ("owner mark", "A1", "A2", "begin", "produce", "flush", "offsets", "commit", "persist")


class Crash(BaseException):
    """The process dies here (kill -9): nothing below the raise runs, not even cleanup."""


@dataclass
class Faults:
    step: str | None = None
    kind: str | None = None
    skip: int = 0  # calls of the step that pass before the fault fires
    fired: int = 0
    hung: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def hit(self, step: str) -> KafkaError | None:
        """Raises the armed fault at its step; kind "partition" returns the error instead,
        for the caller to put in one partition's entry."""
        if step != self.step or self.fired:
            return None
        if self.skip:
            self.skip -= 1
            return None
        self.fired += 1
        if self.kind == "partition":
            return KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, f"injected at {step}")
        if self.kind == "crash":
            raise Crash(step)
        if self.kind == "hang":
            self.hung.set()
            self.release.wait()  # the watchdog's stand-in for os._exit releases it
            raise KafkaException(KafkaError(KafkaError._FATAL, "released after a hang", fatal=True))
        raise KafkaException(_error(self.kind or "fatal", step))


def _error(kind: str, step: str) -> KafkaError:
    if kind == "retriable":
        return KafkaError(KafkaError._TIMED_OUT, f"injected at {step}", retriable=True)
    if kind == "abortable":
        return KafkaError(KafkaError._STATE, f"injected at {step}", txn_requires_abort=True)
    if kind == "fenced":
        return KafkaError(KafkaError._FENCED, f"injected at {step}", fatal=True)
    return KafkaError(KafkaError._FATAL, f"injected at {step}", fatal=True)


@dataclass
class Record:
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


class FakeBroker:
    def __init__(self, partitions: int, faults: Faults | None = None) -> None:
        self.partitions = partitions
        self.faults = faults or Faults()
        self.logs: dict[str, list[list[Record]]] = {}
        self.offsets: dict[tuple[str, int], int] = {}
        self.metadata: dict[tuple[str, int], str | None] = {}  # of the last commit of each
        self.epoch = 0
        self.clients_created = 0
        self.aborts = 0

    def log(self, topic: str, partition: int) -> list[Record]:
        return self.logs.setdefault(topic, [[] for _ in range(self.partitions)])[partition]

    def append(self, topic: str, key: bytes, value: bytes, partition: int | None = None) -> None:
        p = partition_for(key, self.partitions) if partition is None else partition
        self.log(topic, p).append(Record(key, value, []))

    def message(self, topic: str, partition: int, offset: int) -> Message:
        record = self.log(topic, partition)[offset]
        return Message(
            topic=topic,
            partition=partition,
            offset=offset,
            key=record.key,
            value=record.value,
            headers=list[tuple[str, str | bytes | None]](record.headers),
        )


class FakeProducer:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.epoch = -1
        self.queued: list[tuple[str, int, Record, Any]] = []
        self.offsets: list[TopicPartition] = []

    def _check(self, step: str) -> None:
        try:
            self.broker.faults.hit(step)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._FENCED:
                self.epoch = -2  # fenced for good: every later call fails too, flush included
            raise
        if self.epoch != self.broker.epoch:
            raise KafkaException(
                KafkaError(KafkaError._FENCED, "fenced by a newer epoch", fatal=True)
            )

    def init_transactions(self, timeout: float = -1) -> None:
        self.broker.epoch += 1  # fences the previous producer of this id, aborts its txn
        self.epoch = self.broker.epoch

    def begin_transaction(self) -> None:
        self._check("begin")
        self.queued, self.offsets = [], []

    def produce(
        self,
        topic: str,
        *,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: Any = None,
        headers: Any = None,
    ) -> None:
        self._check("produce")
        if len(value or b"") + len(key or b"") > DEAD_LETTER_MAX_BYTES:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "message too large"))
        p = partition if partition >= 0 else partition_for(key or b"", self.broker.partitions)
        self.queued.append((topic, p, Record(key, value or b"", list(headers or [])), on_delivery))

    def poll(self, timeout: float = -1) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        self._check("flush")
        ends: dict[tuple[str, int], int] = {}
        for topic, p, _, on_delivery in self.queued:
            offset = ends.get((topic, p), len(self.broker.log(topic, p)))
            ends[(topic, p)] = offset + 1
            if on_delivery is not None:
                on_delivery(None, Message(topic=topic, partition=p, offset=offset))
        return 0

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self._check("offsets")
        self.offsets = list(positions)

    def commit_transaction(self, timeout: float = -1) -> None:
        self._check("commit")
        for topic, p, record, _ in self.queued:
            self.broker.log(topic, p).append(record)
        for tp in self.offsets:
            self.broker.offsets[(tp.topic, tp.partition)] = tp.offset
            self.broker.metadata[(tp.topic, tp.partition)] = tp.metadata
        self.queued, self.offsets = [], []

    def abort_transaction(self, timeout: float = -1) -> None:
        self.broker.aborts += 1
        self.queued, self.offsets = [], []


class FakeConsumer:
    """Subscribed to every partition of the inputs; the first consume assigns them all."""

    def __init__(self, broker: FakeBroker, on_idle: Callable[[], None], batch: int) -> None:
        self.broker = broker
        self.on_idle = on_idle
        self.batch = batch
        self.topics: list[str] = []
        self.callbacks: dict[str, Any] = {}
        self.positions: dict[tuple[str, int], int] | None = None
        self.paused: set[tuple[str, int]] = set()
        self.at_end: set[tuple[str, int]] = set()
        # Topics librdkafka holds a local object for: created by the first assignment of one
        # of their partitions. Before that, pause() and resume() skip the topic's partitions.
        self.topic_objects: set[str] = set()
        self.assigned_in_callback = False

    def subscribe(
        self, topics: list[str], on_assign: Any = None, on_revoke: Any = None, on_lost: Any = None
    ) -> None:
        self.topics = topics
        self.callbacks = {"assign": on_assign, "revoke": on_revoke}

    def rebalance(self) -> None:
        """An eager rebalance that hands this consumer the same partitions back. Like
        librdkafka, the pause flags survive it (only resume() clears them)."""
        assert self.positions is not None
        tps = [TopicPartition(t, p) for t, p in sorted(self.positions)]
        self.callbacks["revoke"](self, tps)
        self._on_assign(tps)

    def _on_assign(self, tps: list[TopicPartition]) -> None:
        """The assign callback, then (as the Python client does when the callback did not call
        assign() itself, or raised) the assignment."""
        self.assigned_in_callback = False
        try:
            self.callbacks["assign"](self, tps)
        finally:
            if not self.assigned_in_callback:
                self.assign(tps)

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Fetching starts at the committed offsets; the topics get their local objects."""
        self.assigned_in_callback = True
        self.topic_objects |= {tp.topic for tp in partitions}
        self.positions = {
            (tp.topic, tp.partition): max(0, self.broker.offsets.get((tp.topic, tp.partition), 0))
            for tp in partitions
        }

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if self.positions is None:
            tps = [TopicPartition(t, p) for t in self.topics for p in range(self.broker.partitions)]
            self._on_assign(tps)
        assert self.positions is not None
        out: list[Message] = []
        limit = min(num_messages, self.batch)
        for (topic, p), position in sorted(self.positions.items()):
            if (topic, p) in self.paused:
                continue
            log = self.broker.log(topic, p)
            while position < len(log) and len(out) < limit:
                out.append(self.broker.message(topic, p, position))
                self.at_end.discard((topic, p))
                position += 1
            self.positions[(topic, p)] = position
            if position == len(log) and (topic, p) not in self.at_end and len(out) < limit:
                # librdkafka's enable.partition.eof: once per arrival at the end
                self.at_end.add((topic, p))
                eof = KafkaError(KafkaError._PARTITION_EOF, "end of partition")
                out.append(Message(topic=topic, partition=p, offset=position, error=eof))
        if not out and not set(self.positions) <= self.paused:
            self.on_idle()  # every input paused (tasks restoring) is waiting, not idle
        return out

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        self.broker.faults.hit("A1")
        out = []
        for tp in partitions:
            at = (tp.topic, tp.partition)
            offset, metadata = self.broker.offsets.get(at, -1001), self.broker.metadata.get(at)
            if metadata is None:
                out.append(TopicPartition(tp.topic, tp.partition, offset))
            else:
                out.append(TopicPartition(tp.topic, tp.partition, offset, metadata=metadata))
        return out

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]:
        """A plain offset commit (A0's owner mark): offsets and their metadata, at once. A
        "partition" fault leaves the first partition unwritten and reports it in its entry
        only, as librdkafka does (the call raises nothing)."""
        error = self.broker.faults.hit("owner mark")
        out = list(offsets)
        for i, tp in enumerate(offsets):
            if error is not None and i == 0:  # TopicPartition's error cannot be set from Python
                failed = SimpleNamespace(
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=tp.offset,
                    metadata=tp.metadata,
                    error=error,
                )
                out[0] = cast(TopicPartition, failed)
                continue
            self.broker.offsets[(tp.topic, tp.partition)] = tp.offset
            self.broker.metadata[(tp.topic, tp.partition)] = tp.metadata
        return out

    def seek(self, partition: TopicPartition) -> None:
        assert self.positions is not None
        self.positions[(partition.topic, partition.partition)] = max(0, partition.offset)
        self.at_end.discard((partition.topic, partition.partition))

    def pause(self, partitions: list[TopicPartition]) -> None:
        """As librdkafka's: a partition of a topic with no local object yet (none of its
        partitions was ever assigned to this consumer, e.g. inside the first assign callback,
        before the assignment) is skipped; the call raises nothing (the Python client drops
        the per-partition UNKNOWN_PARTITION), and the flag survives revokes and assignments."""
        self.paused |= {(tp.topic, tp.partition) for tp in self._known(partitions)}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in self._known(partitions)}

    def _known(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [tp for tp in partitions if tp.topic in self.topic_objects]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in partitions]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        return 0, len(self.broker.log(partition.topic, partition.partition))

    def consumer_group_metadata(self) -> Any:
        return object()

    def memberid(self) -> str | None:
        return None  # in no group (GroupConsumer is)

    def close(self) -> None:
        return None


class FakeClients:
    """The `ClientFactory` of the fault tests: every incarnation talks to the same broker."""

    def __init__(self, broker: FakeBroker, batch: int = 4) -> None:
        self.broker = broker
        self.on_idle: Callable[[], None] = lambda: None  # the test stops the engine here
        self.batch = batch

    def producer(self, settings: Settings) -> ProducerLike:
        self.broker.clients_created += 1
        return FakeProducer(self.broker)

    def consumer(self, settings: Settings) -> ConsumerLike:
        return FakeConsumer(self.broker, lambda: self.on_idle(), self.batch)

    def fence(
        self, settings: Settings, partitions: list[TopicPartition], timeout_s: float
    ) -> FenceReport:
        return FenceReport(())  # the fake broker has no transaction timeout to cut short

    def changelog_reader(self, settings: Settings) -> ChangelogReader:
        return FakeChangelogReader(self.broker, settings.topics.changelog)


@dataclass
class Member:
    member_id: str
    client_id: str
    silent_since: float | None = None  # no heartbeat since then (closed, or its process died)


class FakeGroup:
    """The group coordinator's static members, kept as Kafka's classic group keeps them: a
    join under a `group.instance.id` that already has a member replaces that member's id and
    keeps the rest, its `client.id` and host included (`ClassicGroup.replaceStaticMember`); a
    static member whose consumer stops heartbeating (closed without leaving, as static members
    close, or its process killed) stays listed until `session_timeout_s` passes. `now` is the
    test's clock (the engine's pauses advance it)."""

    def __init__(self, session_timeout_s: float) -> None:
        self.session_timeout_s = session_timeout_s
        self.now = 0.0
        self.members: dict[str, Member] = {}  # by group.instance.id
        self.joins = 0

    def join(self, instance_id: str, client_id: str) -> str:
        """The new member id of this join."""
        self._expire()
        self.joins += 1
        member_id = f"{instance_id}-{self.joins:04d}"
        held = self.members.get(instance_id)
        if held is None:
            self.members[instance_id] = Member(member_id, client_id)
        else:
            held.member_id, held.silent_since = member_id, None
        return member_id

    def holds(self, instance_id: str, member_id: str) -> bool:
        self._expire()
        held = self.members.get(instance_id)
        return held is not None and held.member_id == member_id

    def silent(self, member_id: str) -> None:
        """The consumer that joined as `member_id` sends no more heartbeats."""
        for member in self.members.values():
            if member.member_id == member_id and member.silent_since is None:
                member.silent_since = self.now

    def leave(self, instance_id: str) -> None:
        self.members.pop(instance_id, None)

    def _expire(self) -> None:
        for instance_id, member in list(self.members.items()):
            since = member.silent_since
            if since is not None and self.now - since >= self.session_timeout_s:
                del self.members[instance_id]

    def admin(self, config: dict[str, Any]) -> FakeGroupAdmin:
        """An `AdminClient` stand-in that describes this group."""
        return FakeGroupAdmin(self)


class FakeGroupAdmin:
    def __init__(self, group: FakeGroup) -> None:
        self.group = group
        self.described = 0

    def describe_consumer_groups(
        self, group_ids: list[str], request_timeout: float = -1
    ) -> dict[str, Future[Any]]:
        self.group._expire()
        members = [
            MemberDescription(
                m.member_id, m.client_id, "/127.0.0.1", MemberAssignment([]), instance_id
            )
            for instance_id, m in self.group.members.items()
        ]
        out: dict[str, Future[Any]] = {}
        for group_id in group_ids:
            out[group_id] = Future()
            out[group_id].set_result(SimpleNamespace(members=members))
        return out


class GroupConsumer(FakeConsumer):
    """A static member of `group` under the settings' `group.instance.id`: it joins at its
    first consume (before its assignment), is fenced (FENCED_INSTANCE_ID, fatal) once another
    join took the id, and stops heartbeating at close without leaving."""

    def __init__(
        self,
        broker: FakeBroker,
        on_idle: Callable[[], None],
        batch: int,
        group: FakeGroup,
        settings: Settings,
    ) -> None:
        super().__init__(broker, on_idle, batch)
        self.group = group
        self.instance_id = settings.instance_id
        self.client_id = str(settings.kafka.get("client.id", "rdkafka"))
        self.member_id: str | None = None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if self.member_id is None:
            self.member_id = self.group.join(self.instance_id, self.client_id)
        elif not self.group.holds(self.instance_id, self.member_id):
            error = KafkaError(KafkaError.FENCED_INSTANCE_ID, "static member fenced", fatal=True)
            return [Message(error=error)]
        return super().consume(num_messages, timeout)

    def memberid(self) -> str | None:
        return self.member_id

    def close(self) -> None:
        if self.member_id is not None:
            self.group.silent(self.member_id)


class GroupClients(FakeClients):
    """`FakeClients` whose consumers are members of `group`."""

    def __init__(self, broker: FakeBroker, group: FakeGroup) -> None:
        super().__init__(broker)
        self.group = group
        self.consumers: list[GroupConsumer] = []

    def consumer(self, settings: Settings) -> ConsumerLike:
        consumer = GroupConsumer(
            self.broker, lambda: self.on_idle(), self.batch, self.group, settings
        )
        self.consumers.append(consumer)
        return consumer


class FakeChangelogReader:
    """Step A2's reader over the fake broker's changelog: the committed records from each
    added partition's start, then `_PARTITION_EOF` once at its end. A fault armed at "A2"
    fires at its first call (`ends`, once per task that starts restoring)."""

    def __init__(self, broker: FakeBroker, topic: str) -> None:
        self.broker, self.topic = broker, topic
        self.positions: dict[int, int] = {}
        self.at_end: set[int] = set()
        self.reads = 0  # calls of `read`
        self.closed = False

    def ends(self, partition: int) -> tuple[int, int]:
        self.broker.faults.hit("A2")
        return 0, len(self.broker.log(self.topic, partition))

    def add(self, partition: int, start: int) -> None:
        assert partition not in self.positions, f"changelog partition {partition} added twice"
        self.positions[partition] = max(0, start)
        self.at_end.discard(partition)

    def remove(self, partition: int) -> None:
        assert partition in self.positions, f"changelog partition {partition} not added"
        del self.positions[partition]

    def read(self, max_records: int, timeout_s: float) -> list[Message]:
        self.reads += 1
        out: list[Message] = []
        for p, position in sorted(self.positions.items()):
            log = self.broker.log(self.topic, p)
            while position < len(log) and len(out) < max_records:
                out.append(self.broker.message(self.topic, p, position))
                position += 1
            self.positions[p] = position
            if position == len(log) and p not in self.at_end and len(out) < max_records:
                self.at_end.add(p)
                eof = KafkaError(KafkaError._PARTITION_EOF, "end of partition")
                out.append(Message(topic=self.topic, partition=p, offset=position, error=eof))
        return out

    def close(self) -> None:
        self.closed = True
