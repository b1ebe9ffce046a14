"""The engine process: one consumer, one transactional producer, one task per partition.

The loop follows COMMIT_PROTOCOL.md step by step; `Step` names appear in the logs.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from engine.core.events import Decision, Event
from engine.runtime.ingest import Ingest, Rejected
from engine.runtime.metrics import EngineMetrics
from engine.runtime.protocol import Step
from engine.runtime.restore import restore_partitions
from engine.runtime.state_codec import StateFormatError
from engine.runtime.store import LocalStore
from engine.runtime.task import PartitionTask, pending_header
from engine.settings import Settings
from engine.wire import Codec

log = logging.getLogger("reconciler.engine")

CONSUME_BATCH = 1_000
KAFKA_CALL_TIMEOUT_S = 10.0
RETRIES = 3
# Steps 3-5 share one deadline, well under max.poll.interval.ms (60 s): past it the producer is
# recreated instead of the loop blocking until the group evicts this member.
COMMIT_BUDGET_S = 40.0
MAX_POLL_INTERVAL_MS = 60_000
RETRY_S = 2.0


class _RejoinError(Exception):
    """A fatal producer or consumer error: drop the tasks, recreate the clients, rejoin."""


@dataclass
class _Clients:
    consumer: Consumer
    producer: Producer


class Engine:
    """Runs until `stop()` (or SIGTERM): consume, fold, produce, commit exactly once."""

    def __init__(
        self,
        settings: Settings,
        *,
        codec: Codec | None = None,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.codec = codec or Codec()
        self.metrics = metrics or EngineMetrics()
        self.ingest = Ingest(self.codec, self.topics, settings.partitions)
        self.tasks: dict[int, PartitionTask] = {}
        self._assigned: set[tuple[str, int]] = set()
        self._stopping = False
        self._rejoin_requested = False
        # Next offset to fold per input partition of a ready task: what step 4 commits, and the
        # guard against records fetched before a rebalance and delivered after it.
        self._next: dict[tuple[str, int], int] = {}
        self._clients: _Clients | None = None
        self._txn_open = False
        self._txn_started = 0.0
        self._txn_event_times: list[int] = []
        self._state_root = Path(settings.state_dir) / settings.group_id / settings.topic_prefix

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping = True

    def install_signal_handlers(self) -> None:
        def on_term(signum: int, frame: FrameType | None) -> None:
            if self._stopping:
                log.warning("second signal %s: exiting at once", signum)
                os._exit(128 + signum)  # the open transaction is aborted by the next start
            log.info("signal %s: draining, committing and leaving the group", signum)
            self._stopping = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack

    def run(self) -> None:
        """The outer loop: a fatal error recreates the clients and rejoins; stop() ends it."""
        while not self._stopping:
            try:
                self._clients = self._create_clients()
            except KafkaException as exc:
                log.error("cannot start the Kafka clients (%s); retrying in %.0fs", exc, RETRY_S)
                time.sleep(RETRY_S)
                continue
            try:
                self._loop(self._clients)
                self._drain(self._clients)
            except (_RejoinError, KafkaException, TimeoutError) as exc:
                # Fatal or unclassified (librdkafka: treat as fatal), or a restore that could not
                # finish: drop every task and rejoin with new clients.
                self.metrics.aborts.labels(kind="fatal").inc()
                log.error("fatal Kafka error, recreating clients and rejoining: %s", exc)
                self._drop_all_tasks()
            except (StateFormatError, sqlite3.Error) as exc:
                # Unreadable state or a failing local disk: not Kafka's fault, and retrying at
                # once would fail the same way. Stay up (metrics, probes) and retry slowly.
                self.metrics.aborts.labels(kind="state").inc()
                log.error("local state failure, rejoining in %.0fs: %s", RETRY_S * 5, exc)
                self._drop_all_tasks()
                time.sleep(RETRY_S * 5)
            finally:
                self._close(self._clients)
                self._clients = None
        self.metrics.set_ready(False)

    def _create_clients(self) -> _Clients:
        s = self.settings
        producer_config: dict[str, str | int | float | bool] = {
            "transactional.id": f"{s.group_id}-{s.instance_id}",
            "transaction.timeout.ms": s.transaction_timeout_ms,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "message.max.bytes": 2_200_000,  # dead letters carry a refused value verbatim
        }
        producer = Producer(s.client_config(**producer_config))
        self._retry(lambda: producer.init_transactions(KAFKA_CALL_TIMEOUT_S), "init_transactions")
        consumer_config: dict[str, str | int | float | bool] = {
            "group.id": s.group_id,
            "group.instance.id": s.instance_id,
            "partition.assignment.strategy": "range",
            "session.timeout.ms": s.session_timeout_ms,
            "heartbeat.interval.ms": max(250, s.session_timeout_ms // 6),
            "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
        }
        consumer = Consumer(s.client_config(**consumer_config))
        consumer.subscribe(
            list(self.topics.inputs),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        return _Clients(consumer, producer)

    def _close(self, clients: _Clients) -> None:
        try:
            clients.consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer failed: %s", exc)
        clients.producer.flush(5)

    # -- the loop: steps 1-6 -----------------------------------------------------------------

    def _loop(self, clients: _Clients) -> None:
        last_commit = time.monotonic()
        # consume() waits for a full batch or the timeout: keep the wait well under the commit
        # interval, or a quiet topic adds the whole timeout to every decision's latency.
        wait_s = min(0.1, self.settings.commit_interval_ms / 2000)
        while not self._stopping:
            messages = clients.consumer.consume(CONSUME_BATCH, timeout=wait_s)
            if self._rejoin_requested:  # set by a callback that ran inside consume()
                self._rejoin_requested = False
                raise _RejoinError("the assignment was lost or a revoke-time commit failed")
            try:
                for message in messages:
                    self._handle(clients, message)
            except _AbortableError as exc:
                self._abort(clients, str(exc))
                continue
            self._observe_lag(clients.consumer)
            due = (time.monotonic() - last_commit) * 1000 >= self.settings.commit_interval_ms
            folded = sum(task.folded for task in self.tasks.values())
            if self._txn_open and (due or folded >= self.settings.commit_max_events):
                self._commit(clients)
                last_commit = time.monotonic()
            elif not self._txn_open:
                last_commit = time.monotonic()

    def _handle(self, clients: _Clients, message: Message) -> None:
        error = message.error()
        if error is not None:
            # A consumer's fatal error (e.g. a static member fenced after a broker restart)
            # arrives as code _FATAL without fatal() set on the message error.
            if error.fatal() or error.code() == KafkaError._FATAL:
                raise _RejoinError(str(error))
            log.warning("consumer error (librdkafka retries): %s", error)
            return
        topic, partition = message.topic() or "", message.partition() or 0
        offset = message.offset() or 0
        task = self.tasks.get(partition)
        if task is None:  # a partition of an incomplete task; it is paused, this is a leftover
            return
        if offset < self._next.get((topic, partition), 0):
            return  # fetched before a rebalance or a rewind and already folded since
        self._begin(clients)
        self._next[(topic, partition)] = offset + 1
        outcome = self.ingest.accept(message)
        if isinstance(outcome, Rejected):
            self._produce(clients, self.topics.dead_letters, message.key(), outcome.payload)
            self.metrics.dead_letters.labels(reason=outcome.reason).inc()
            return
        event: Event = outcome
        self.metrics.events.labels(topic=topic, kind=self.ingest.kind_of(event)).inc()
        before, decisions = task.fold(event, offset)
        self.metrics.observe_fold(before, task.cache[event.session_id], decisions)
        source = f"{topic}/{partition}/{message.offset()}".encode()
        for decision in decisions:
            self._produce_decision(clients, decision, source)
        self._txn_event_times.append(event.event_time_ms)

    def _produce_decision(self, clients: _Clients, decision: Decision, source: bytes) -> None:
        value = self.codec.encode(decision)
        self._produce(
            clients,
            self.topics.decisions,
            decision.session_id.encode(),
            value,
            headers=[("source", source)],
        )

    def _produce(
        self,
        clients: _Clients,
        topic: str,
        key: bytes | None,
        value: bytes,
        *,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = headers
        if on_delivery is not None:
            kwargs["on_delivery"] = on_delivery
        while True:
            try:
                clients.producer.produce(topic, **kwargs)
                return
            except BufferError:  # the local queue is full: let deliveries drain, then retry
                clients.producer.poll(0.05)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.txn_requires_abort():
                    raise _AbortableError(f"step {Step.FOLD}: {error}") from exc
                raise _RejoinError(f"step {Step.FOLD}: {error}") from exc

    def _begin(self, clients: _Clients) -> None:
        if self._txn_open:
            return
        self._txn_call(lambda _: clients.producer.begin_transaction(), Step.BEGIN)
        self._txn_open = True
        self._txn_started = time.monotonic()

    def _commit(self, clients: _Clients, tasks: list[PartitionTask] | None = None) -> None:
        """Steps 3-6 for every ready task (or the given ones, on revoke)."""
        if not self._txn_open:
            return
        committing = tasks if tasks is not None else list(self.tasks.values())
        deadline = time.monotonic() + COMMIT_BUDGET_S
        try:
            for task in committing:  # step 3
                for write in task.changelog_records():
                    self._produce(
                        clients,
                        self.topics.changelog,
                        write.session_id.encode(),
                        write.state or b"",
                        partition=task.partition,
                        headers=pending_header(write),
                        on_delivery=self._changelog_delivered(task),
                    )
            self._txn_call(lambda t: self._flush(clients, t), Step.OFFSETS, deadline)  # step 4
            positions = self._positions()
            if positions:
                metadata = clients.consumer.consumer_group_metadata()
                self._txn_call(
                    lambda t: clients.producer.send_offsets_to_transaction(positions, metadata, t),
                    Step.OFFSETS,
                    deadline,
                )
            started = time.monotonic()
            self._txn_call(  # step 5
                lambda t: clients.producer.commit_transaction(t), Step.COMMIT, deadline
            )
        except _AbortableError as exc:
            self._abort(clients, str(exc))
            return
        self._txn_open = False
        now_ms = time.time() * 1000
        self.metrics.commit_seconds.observe(time.monotonic() - started)
        for event_time in self._txn_event_times:
            self.metrics.decision_latency.observe(max(0.0, (now_ms - event_time) / 1000))
        self._txn_event_times.clear()
        for task in committing:  # step 6
            task.persist()
        self.metrics.sessions.set(sum(t.store.count() for t in self.tasks.values()))

    def _flush(self, clients: _Clients, timeout_s: float) -> None:
        remaining = clients.producer.flush(timeout_s)
        if remaining:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{remaining} undelivered"))

    @staticmethod
    def _changelog_delivered(task: PartitionTask) -> Callable[[KafkaError | None, Message], None]:
        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is None:
                task.changelog_high = max(task.changelog_high, message.offset() or 0)

        return delivered

    def _positions(self) -> list[TopicPartition]:
        """Step 4's offsets: the next record to fold, never the consumer's fetch position
        (a rebalance callback can run while consume() holds records not yet folded)."""
        return [
            TopicPartition(topic, p, offset)
            for (topic, p), offset in self._next.items()
            if p in self.tasks
        ]

    def _abort(self, clients: _Clients, why: str) -> None:
        """Abortable error: abort, drop write caches, rewind inputs to committed offsets."""
        log.warning("aborting the transaction: %s", why)
        self.metrics.aborts.labels(kind="abortable").inc()
        try:
            self._retry(lambda: clients.producer.abort_transaction(KAFKA_CALL_TIMEOUT_S), "abort")
        except KafkaException as exc:
            raise _RejoinError(f"abort failed: {exc}") from exc
        self._txn_open = False
        self._txn_event_times.clear()
        for task in self.tasks.values():
            task.discard()
        self._rewind(clients.consumer, list(self.tasks))

    def _rewind(self, consumer: Consumer, partitions: list[int]) -> None:
        wanted = [TopicPartition(t, p) for p in partitions for t in self.topics.inputs]
        if not wanted:
            return
        for tp in consumer.committed(wanted, timeout=KAFKA_CALL_TIMEOUT_S):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            self._next[(tp.topic, tp.partition)] = max(tp.offset, 0)

    def _txn_call(
        self, call: Callable[[float], object], step: Step, deadline: float | None = None
    ) -> None:
        """Run a transactional call (given its timeout) under librdkafka's error classes;
        retriable errors are retried until `deadline`."""
        deadline = deadline or time.monotonic() + KAFKA_CALL_TIMEOUT_S * RETRIES
        for attempt in range(RETRIES):
            left = deadline - time.monotonic()
            try:
                call(max(1.0, min(KAFKA_CALL_TIMEOUT_S, left)))
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable() and attempt < RETRIES - 1 and left > 1.0:
                    log.warning("step %s: retriable error, retrying: %s", step, error)
                    time.sleep(0.1 * (attempt + 1))
                    continue
                if error.txn_requires_abort():
                    raise _AbortableError(f"step {step}: {error}") from exc
                raise _RejoinError(f"step {step}: {error}") from exc

    @staticmethod
    def _retry(call: Callable[[], object], what: str) -> None:
        for attempt in range(RETRIES):
            try:
                call()
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or attempt == RETRIES - 1:
                    raise
                log.warning("%s: retriable error, retrying: %s", what, exc)
                time.sleep(0.2 * (attempt + 1))

    def _drain(self, clients: _Clients) -> None:
        """Stop requested: commit what is folded (steps 3-6), then leave."""
        self._commit(clients)
        if self._txn_open:  # the commit failed and was aborted
            log.warning("shutdown: last transaction aborted; its inputs are consumed again")

    # -- rebalance: A1-A3, revoke, lost --------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels(kind="assign").inc()
        self.metrics.set_ready(False)
        self._assigned |= {(tp.topic, tp.partition) for tp in partitions}
        complete = sorted(
            p
            for p in {tp.partition for tp in partitions}
            if all((t, p) in self._assigned for t in self.topics.inputs)
        )
        incomplete = [tp for tp in partitions if tp.partition not in complete]
        if incomplete:
            consumer.pause(incomplete)
        if not complete:
            self.metrics.set_ready(True)
            return
        # A1: committed offsets are fetched with require_stable under read_committed, which
        # waits for a previous owner's pending transaction to finish.
        settle_s = min(self.settings.transaction_timeout_ms / 1000 + 5, COMMIT_BUDGET_S)
        committed = consumer.committed(
            [TopicPartition(t, p) for p in complete for t in self.topics.inputs],
            timeout=settle_s,
        )
        for tp in committed:
            self._next[(tp.topic, tp.partition)] = max(tp.offset, 0)
        started = time.monotonic()
        stores = {p: LocalStore(self._state_root / f"p{p}.sqlite") for p in complete}
        try:
            reports = restore_partitions(  # A2
                self.settings.client_config(), self.topics.changelog, stores
            )
        except (KafkaException, TimeoutError):
            for store in stores.values():
                store.close()
            raise
        for report in reports:
            log.info(
                "step %s: partition %d restored %d changelog records in %.2fs%s",
                Step.RESTORE_DELTA,
                report.partition,
                report.records,
                report.seconds,
                " (local store wiped: changelog recreated)" if report.wiped else "",
            )
            self.tasks[report.partition] = PartitionTask(  # A3
                partition=report.partition, store=stores[report.partition]
            )
        self.metrics.restore_seconds.observe(time.monotonic() - started)
        self.metrics.sessions.set(sum(t.store.count() for t in self.tasks.values()))
        self.metrics.set_ready(True)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels(kind="revoke").inc()
        if self._clients is not None and self._txn_open:
            try:
                self._commit(self._clients)  # a txn spans all tasks: commit all of them
            except _RejoinError as exc:
                log.error("commit on revoke failed, rejoining with new clients: %s", exc)
                with contextlib.suppress(KafkaException):
                    self._clients.producer.abort_transaction(KAFKA_CALL_TIMEOUT_S)
                self._drop_all_tasks()
                self._rejoin_requested = True
        for p in sorted({tp.partition for tp in partitions}):
            task = self.tasks.pop(p, None)
            if task is not None:
                task.store.close()
        self._assigned -= {(tp.topic, tp.partition) for tp in partitions}
        for tp in partitions:
            self._next.pop((tp.topic, tp.partition), None)
        if not self.tasks:
            self.metrics.set_ready(False)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels(kind="lost").inc()
        log.warning("assignment lost: aborting without committing, then rejoining")
        # Observed after a broker restart: the same producer's next send_offsets_to_transaction
        # blocked past its timeout. New clients after a lost assignment avoid that state.
        self._rejoin_requested = True
        if self._clients is not None and self._txn_open:
            with contextlib.suppress(_RejoinError):
                self._abort(self._clients, "assignment lost")
        self._assigned -= {(tp.topic, tp.partition) for tp in partitions}
        for tp in partitions:
            self._next.pop((tp.topic, tp.partition), None)
        for p in sorted({tp.partition for tp in partitions} & set(self.tasks)):
            self.tasks.pop(p).store.close()

    def _drop_all_tasks(self) -> None:
        for task in self.tasks.values():
            task.discard()
            task.store.close()
        self.tasks.clear()
        self._assigned.clear()
        self._next.clear()
        self._txn_open = False
        self._txn_event_times.clear()
        self.metrics.set_ready(False)

    def _observe_lag(self, consumer: Consumer) -> None:
        self.metrics.maybe_observe_lag(consumer, self.tasks, self.topics.inputs)


class _AbortableError(Exception):
    """The transaction must be aborted and the inputs rewound (txn_requires_abort)."""
