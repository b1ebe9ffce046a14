"""`ReconcilerClient`: what a runner service uses to talk to the reconciler over Kafka.

Guarantees (each one is what the engine's fold relies on):

* Every record is keyed by session id and placed by the Java murmur2 partitioner
  (``murmur2_random``), so intents, acks and resumes of a session land in co-partitioned
  partitions and the decision comes back on the same partition number of the decisions topic.
* The producer is idempotent with ``acks=all``; `register_intent` returns only after the brokers
  acknowledged the intent, so it is durable before the caller touches the Session.
* `resume` positions a consumer on the session's decisions partition at its end offset BEFORE
  the request is produced, so the answer cannot be missed, then waits for the FINAL decision
  whose ``in_reply_to`` is the request id. No answer in time is `ResumeTimeoutError`: never a
  guessed verdict.

Thread-safe: producing may happen from several threads; resumes are serialized by a lock.
`AsyncReconcilerClient` runs the same calls in a worker thread for asyncio code.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from consumers import messages
from consumers.errors import PublishError, ResumeTimeoutError, TopicUnavailableError
from consumers.outcomes import ResumeOutcome, answers, outcome_from_decision
from engine.core.events import (
    AckOutcome,
    Binding,
    CausalContext,
    Cause,
    Decision,
    Event,
    IntentEvent,
    IntentKind,
    PendingRecord,
)
from engine.wire import DecodeError, RecordType, WireModel
from engine.wire.partitioner import partition_for
from engine.wire.registry import codec_for
from engine.wire.topics import TopicNames

Clock = Callable[[], int]
"""Event time in int milliseconds since the epoch (the only clock the engine knows)."""


_LEADER_MOVING = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)


def wall_clock_ms() -> int:
    """The default `Clock`: wall-clock milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


def new_id() -> str:
    """A fresh random id (32 hex characters) for events and intents."""
    return uuid.uuid4().hex


class ReconcilerApi(Protocol):
    """What the SDK integration needs from a client (`ReconcilerClient` over Kafka; tests may
    supply an in-process one that folds the events with the engine's pure core)."""

    runner_id: str

    def register_intent(
        self,
        *,
        session_id: str,
        binding: Binding,
        items: Sequence[Mapping[str, Any]],
        before_tail: Sequence[Mapping[str, Any]] | None,
        sequence: int,
        fence_token: int | None = None,
        intent_id: str | None = None,
        kind: IntentKind = IntentKind.REGISTER,
        persisted_count: int | None = None,
        tools_ran: bool = False,
    ) -> str:
        """Durably register a pending write before the Session is touched; its intent id."""
        ...

    def acknowledge(
        self,
        *,
        session_id: str,
        intent_id: str,
        outcome: AckOutcome,
        fence_token: int | None = None,
        ignore_ids: bool = False,
        observed_tail: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Report the outcome of the append of ``intent_id`` durably."""
        ...

    def resume(
        self,
        *,
        session_id: str,
        binding: Binding,
        checkpoint_id: str,
        checkpoint_sequence: int,
        pending: PendingRecord | None,
        observed_tail: Sequence[Mapping[str, Any]],
        timeout_s: float = 15.0,
        request_id: str | None = None,
        checkpoint_session_id: str | None = None,
        after: Sequence[Cause] = (),
    ) -> ResumeOutcome:
        """Ask for continuation authority after a restore; the final answer, typed. ``after``:
        the events the checkpoint names (`Checkpoint.after`)."""
        ...

    def last_published(self, session_id: str) -> Cause | None:
        """This runner's last event about the session that Kafka acknowledged (a checkpoint
        stores it, so that a resume from it is folded after it)."""
        ...


class ReconcilerClient:
    """Publishes intents, acks and resume requests for one runner identity (``runner_id``)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        runner_id: str,
        topic_prefix: str = "reconciler.",
        kafka_config: Mapping[str, Any] | None = None,
        delivery_timeout_s: float = 10.0,
        clock: Clock = wall_clock_ms,
        schema_registry_url: str | None = None,
    ) -> None:
        self.runner_id = runner_id
        self.topics = TopicNames(prefix=topic_prefix)
        self.clock = clock
        # With a registry, records are written in its framing (and registered under the record
        # name subject); the engine reads both framings.
        self._codec = codec_for(schema_registry_url, write_registry=True)
        self._delivery_timeout_s = delivery_timeout_s
        common: dict[str, Any] = {"bootstrap.servers": bootstrap_servers}
        common.update(kafka_config or {})
        self._producer = Producer(
            {
                **common,
                "acks": "all",
                "enable.idempotence": True,
                "partitioner": "murmur2_random",
                "linger.ms": 0,
                "message.timeout.ms": int(delivery_timeout_s * 1000),
            }
        )
        self._consumer = Consumer(
            {
                **common,
                "group.id": f"reconciler-client-{runner_id}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "latest",
                # The decision lands in a transaction: a long-polling fetch is not woken when the
                # commit marker makes it visible, so a short wait bounds the added latency.
                "fetch.wait.max.ms": 20,
            }
        )
        self._resume_lock = threading.Lock()
        self._causal = messages.CausalCounter(runner_id)
        self._decision_partitions: int | None = None
        self._closed = False

    # --- producing -----------------------------------------------------------------------

    def _publish(self, topic: str, session_id: str, event_id: str, model: WireModel) -> None:
        """Produce one record and block until the brokers acknowledged it (acks=all)."""
        outcome: list[KafkaError | None] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            outcome.append(err)

        self._producer.produce(
            topic, key=session_id.encode(), value=self._codec.encode(model), on_delivery=delivered
        )
        deadline = time.monotonic() + self._delivery_timeout_s + 1.0
        while not outcome and time.monotonic() < deadline:
            self._producer.poll(0.05)
        if not outcome:
            raise PublishError(
                topic=topic, session_id=session_id, event_id=event_id, detail="no delivery report"
            )
        if outcome[0] is not None:
            raise PublishError(
                topic=topic, session_id=session_id, event_id=event_id, detail=str(outcome[0])
            )

    def publish_intent(self, intent: IntentEvent) -> None:
        """Publish a prepared intent and wait until it is durable."""
        self._publish(self.topics.intents, intent.session_id, intent.event_id, intent)
        self._acknowledged(intent.session_id, intent.causal)

    def _acknowledged(self, session_id: str, causal: CausalContext | None) -> None:
        if causal is not None and causal.producer == self.runner_id:
            self._causal.acknowledged(session_id, causal)

    def last_published(self, session_id: str) -> Cause | None:
        """This runner's last event about the session that Kafka acknowledged."""
        return self._causal.last(session_id)

    def register_intent(
        self,
        *,
        session_id: str,
        binding: Binding,
        items: Sequence[Mapping[str, Any]],
        before_tail: Sequence[Mapping[str, Any]] | None,
        sequence: int,
        fence_token: int | None = None,
        intent_id: str | None = None,
        kind: IntentKind = IntentKind.REGISTER,
        persisted_count: int | None = None,
        tools_ran: bool = False,
    ) -> str:
        """Register a pending write before the append; returns its intent id once durable."""
        intent_id = intent_id or new_id()
        intent = messages.intent_event(
            event_id=new_id(),
            session_id=session_id,
            at_ms=self.clock(),
            intent_id=intent_id,
            runner_id=self.runner_id,
            binding=binding,
            items=items,
            before_tail=before_tail,
            sequence=sequence,
            fence_token=fence_token,
            persisted_count=persisted_count,
            kind=kind,
            tools_ran=tools_ran,
            causal=self._causal.next(session_id),
        )
        self.publish_intent(intent)
        return intent_id

    def acknowledge(
        self,
        *,
        session_id: str,
        intent_id: str,
        outcome: AckOutcome,
        fence_token: int | None = None,
        ignore_ids: bool = False,
        observed_tail: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Report the outcome of the append of ``intent_id`` and wait until it is durable."""
        event_id = new_id()
        ack = messages.ack_event(
            event_id=event_id,
            session_id=session_id,
            at_ms=self.clock(),
            intent_id=intent_id,
            runner_id=self.runner_id,
            outcome=outcome,
            fence_token=fence_token,
            observed_tail=observed_tail,
            ignore_ids=ignore_ids,
            causal=self._causal.next(session_id),
        )
        self._publish(self.topics.acks, session_id, event_id, ack)
        self._acknowledged(session_id, ack.causal)

    # --- resuming ------------------------------------------------------------------------

    def resume(
        self,
        *,
        session_id: str,
        binding: Binding,
        checkpoint_id: str,
        checkpoint_sequence: int,
        pending: PendingRecord | None,
        observed_tail: Sequence[Mapping[str, Any]],
        timeout_s: float = 15.0,
        request_id: str | None = None,
        checkpoint_session_id: str | None = None,
        after: Sequence[Cause] = (),
    ) -> ResumeOutcome:
        """Ask for continuation authority and return the engine's final answer. ``after``: the
        events the checkpoint names (the engine folds the resume only after them).

        Raises `ResumeTimeoutError` when no final decision arrives within ``timeout_s``.
        """
        request_id = request_id or new_id()
        request = messages.resume_event(
            request_id=request_id,
            session_id=session_id,
            at_ms=self.clock(),
            runner_id=self.runner_id,
            checkpoint_id=checkpoint_id,
            binding=binding,
            pending=pending,
            observed_tail=observed_tail,
            checkpoint_sequence=checkpoint_sequence,
            checkpoint_session_id=checkpoint_session_id,
            causal=self._causal.next(session_id, after),
        )
        started = time.monotonic()
        decision = self.submit(request, timeout_s=timeout_s)
        if decision is None:
            raise ResumeTimeoutError(
                session_id=session_id,
                request_id=request_id,
                waited_s=time.monotonic() - started,
                partition=partition_for(session_id, self._partitions(timeout_s)),
            )
        return outcome_from_decision(decision)

    def submit(self, event: Event, *, timeout_s: float = 15.0) -> Decision | None:
        """Publish any input event and return the engine's final decision answering it (its
        ``in_reply_to`` is the event id), or None when none arrived within ``timeout_s``.

        The consumer is positioned at the end of the session's decisions partition before the
        event is produced, so the answer cannot be missed. Operator tools use it for repair
        commands; runners normally call `resume`.
        """
        deadline = time.monotonic() + timeout_s
        with self._resume_lock:
            partition = partition_for(event.session_id, self._partitions(timeout_s))
            self._position_at_end(partition, timeout_s)
            try:
                topic = self.topics.topic_for(event)
                self._publish(topic, event.session_id, event.event_id, event)
                self._acknowledged(event.session_id, getattr(event, "causal", None))
                return self._await_final(event.event_id, deadline)
            finally:
                self._consumer.unassign()

    def _partitions(self, timeout_s: float) -> int:
        if self._decision_partitions is None:
            topic = self.topics.decisions
            try:
                metadata = self._consumer.list_topics(topic, timeout=timeout_s)
            except Exception as exc:  # librdkafka raises KafkaException on metadata timeout
                raise TopicUnavailableError(topic=topic, detail=str(exc)) from exc
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                detail = str(found.error) if found is not None else "not in metadata"
                raise TopicUnavailableError(topic=topic, detail=detail)
            self._decision_partitions = len(found.partitions)
        return self._decision_partitions

    def _position_at_end(self, partition: int, timeout_s: float) -> None:
        topic = self.topics.decisions
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition),
                    timeout=max(deadline - time.monotonic(), 0.1),
                    cached=False,
                )
                break
            except KafkaException as exc:
                # Right after the topics are created the leader may not be known yet.
                error = exc.args[0] if exc.args else None
                transient = isinstance(error, KafkaError) and error.code() in _LEADER_MOVING
                if not transient or time.monotonic() >= deadline:
                    raise TopicUnavailableError(topic=topic, detail=str(exc)) from exc
                time.sleep(0.1)
        # An explicit offset (not OFFSET_END) so the position is fixed before the request is sent.
        start = high if high >= 0 else OFFSET_END
        self._consumer.assign([TopicPartition(topic, partition, start)])

    def _await_final(self, request_id: str, deadline: float) -> Decision | None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            message = self._consumer.poll(min(remaining, 0.5))
            if message is None or message.error() is not None:
                continue
            try:
                decision = self._codec.decode(RecordType.DECISION, message.value() or b"")
            except DecodeError:
                continue  # not ours to judge; the engine's dead-letter path covers its inputs
            if answers(decision, request_id):
                return decision

    def close(self) -> None:
        """Flush what is still being produced and close both Kafka clients (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._producer.flush(self._delivery_timeout_s)
        self._consumer.close()

    def __enter__(self) -> ReconcilerClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class AsyncReconcilerClient:
    """The same calls for asyncio code: each runs in a worker thread (they block on Kafka)."""

    def __init__(self, client: ReconcilerClient) -> None:
        self.sync = client

    async def register_intent(self, **kwargs: Any) -> str:
        """`ReconcilerClient.register_intent` in a worker thread."""
        return await asyncio.to_thread(lambda: self.sync.register_intent(**kwargs))

    async def acknowledge(self, **kwargs: Any) -> None:
        """`ReconcilerClient.acknowledge` in a worker thread."""
        await asyncio.to_thread(lambda: self.sync.acknowledge(**kwargs))

    async def resume(self, **kwargs: Any) -> ResumeOutcome:
        """`ReconcilerClient.resume` in a worker thread."""
        return await asyncio.to_thread(lambda: self.sync.resume(**kwargs))

    async def close(self) -> None:
        """`ReconcilerClient.close` in a worker thread."""
        await asyncio.to_thread(self.sync.close)
