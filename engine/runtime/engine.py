"""The engine process: one consumer, one transactional producer, one task per partition.

The loop follows COMMIT_PROTOCOL.md step by step; `Step` names appear in the logs. The clients
come from a `ClientFactory` (fakes in the fault tests), the transaction's states and error
classes live in `transaction.py`, what this process owns in `assignment.py`, and every call that
can block runs under the watchdog (`watchdog.py`).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from engine import compiled, oplog
from engine.core.events import Decision, Event, RepairEvent
from engine.runtime.assignment import Assignment
from engine.runtime.clients import ClientFactory, ConsumerLike, KafkaClients
from engine.runtime.ingest import Ingest, Rejected
from engine.runtime.memory import Trimmer
from engine.runtime.metrics import DEAD_LETTER_REFUSED, EngineMetrics
from engine.runtime.ordering import FIRST, Buffered, InputOrder
from engine.runtime.protocol import Step
from engine.runtime.state_codec import StateFormatError
from engine.runtime.store import LocalStore
from engine.runtime.supervisor import Backoff
from engine.runtime.task import InputFailedError, PartitionTask, pending_header
from engine.runtime.trace import LatencyTrace
from engine.runtime.transaction import (
    CALL_TIMEOUT_S,
    STEP_DEADLINE_S,
    AbortableError,
    RejoinError,
    Transaction,
    TxnStatus,
)
from engine.runtime.watchdog import Watchdog
from engine.settings import Settings
from engine.wire import Codec
from engine.wire.dead_letter import EXCERPT_BYTES
from engine.wire.registry import codec_for

log = logging.getLogger("reconciler.engine")
SESSION_LOG_CHARS = 200  # a dead letter's key is untrusted input: bounded in the log line


def _session_of(key: bytes | None) -> str:
    if key is None:
        return "-"
    return key[:SESSION_LOG_CHARS].decode("utf-8", errors="replace")


def _log_alerts(decisions: Iterable[Decision], source: str) -> None:
    """One ops line per alert raised (ids and reasons, no content)."""
    for decision in decisions:
        if decision.alert:
            oplog.emit(
                "alert_raised",
                session=decision.session_id,
                reason=decision.reason,
                verdict=decision.verdict,
                decision=decision.decision_id,
                source=source,
            )


def _log_for_operator(event: Event, decisions: tuple[Decision, ...], source: str) -> None:
    """One ops line per alert raised and per repair applied."""
    _log_alerts(decisions, source)
    if isinstance(event, RepairEvent):
        first = next(iter(decisions), None)
        oplog.emit(
            "repair_applied",
            session=event.session_id,
            resolution=event.resolution,
            actor=event.actor,
            reason=event.reason,
            verdict=first.verdict if first is not None else "-",
            source=source,
        )


CONSUME_BATCH = 1_000
Consumed = tuple[Message, Event | Rejected]  # a record and what it decoded to
REJOIN_INITIAL_S = 0.5
"""The first pause before new clients rejoin; it doubles per rejoin that follows another with
no committed transaction in between, up to `rejoin_backoff_max_s`."""
PAUSE_SLICE_S = 0.2  # a pause checks for stop() this often (a signal handler cannot wake it)
# Consumer errors that librdkafka reports as non-fatal but that no retry inside the same clients
# fixes (an ACL changed under us): rejoin with new clients, backing off, so the log counts them.
REJOIN_CODES = frozenset(
    {
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


class Engine:
    """Runs until `stop()` (or SIGTERM): consume, fold, produce, commit exactly once."""

    def __init__(
        self,
        settings: Settings,
        *,
        codec: Codec | None = None,
        metrics: EngineMetrics | None = None,
        clients: ClientFactory | None = None,
        watchdog: Watchdog | None = None,
        pause: Callable[[float], None] | None = None,
    ) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.codec = codec or codec_for(settings.schema_registry_url, write_registry=False)
        self.metrics = metrics or EngineMetrics()
        self.factory: ClientFactory = clients or KafkaClients()
        self.watchdog = watchdog or Watchdog()
        self.budget_s = settings.transaction_timeout_ms / 1000 + settings.watchdog_margin_s
        self.metrics.liveness = self.alive
        self.ingest = Ingest(self.codec, self.topics, settings.partitions)
        self.owned = Assignment(self.topics.inputs)
        self.order: InputOrder[Consumed] = InputOrder(
            self.topics.inputs,
            settings.order_wait_ms / 1000,
            settings.order_max_buffered,
            self._caught_up,
        )
        self._stopping = False
        self._rejoin_requested = False
        self._consumer: ConsumerLike | None = None
        self._txn: Transaction | None = None
        self._txn_event_times: list[int] = []
        self._state_root = Path(settings.state_dir) / settings.group_id / settings.topic_prefix
        self.backoff = Backoff(initial_s=REJOIN_INITIAL_S, max_s=settings.rejoin_backoff_max_s)
        self.pause = pause or self._pause_unless_stopped
        self.rejoins = 0  # rejoins in this process (the log's counter)
        self.trimmer = Trimmer(settings.memory_trim_interval_s)
        self._committed_since_rejoin = False
        path = settings.latency_trace_path
        self.trace = LatencyTrace(path) if path is not None else None

    @property
    def tasks(self) -> dict[int, PartitionTask]:
        return self.owned.tasks

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping = True

    def alive(self) -> bool:
        """Liveness: the loop completed an iteration within `liveness_timeout_s`."""
        return self.watchdog.since_progress_s() <= self.settings.liveness_timeout_s

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

    def _progress(self) -> None:
        self.watchdog.progress()
        self.metrics.last_progress.set(self.watchdog.last_progress_wall)

    def run(self) -> None:
        """The outer loop: a fatal error recreates the clients and rejoins, backing off while
        rejoins fail in a row; stop() ends it."""
        # A wheel or image without the extensions runs the sources at about twice the CPU.
        log.info("hot path: %s (engine/compiled.py)", compiled.mode())
        failures = 0  # rejoins in a row with no committed transaction in between
        while not self._stopping:
            if failures:
                self._back_off(failures)
                if self._stopping:
                    break
            self._progress()  # trying to start counts: a restart would not reach Kafka sooner
            self._committed_since_rejoin = False
            try:
                consumer, txn = self._create_clients()
            except (KafkaException, RejoinError, AbortableError) as exc:
                log.error("cannot start the Kafka clients: %s", exc)
                failures += 1
                continue
            self._consumer, self._txn = consumer, txn
            failed = True
            try:
                self._loop(consumer, txn)
                self._commit(txn)  # stop requested: drain (steps 3-6), then leave
                if txn.open:
                    log.warning("shutdown: last transaction aborted; its inputs are read again")
                failed = False
            except (RejoinError, KafkaException, TimeoutError) as exc:
                # Fatal or unclassified (librdkafka: treat as fatal), or a restore that could not
                # finish: drop every task and rejoin with new clients.
                self.metrics.aborts.labels(kind="fatal").inc()
                log.error("fatal Kafka error, recreating clients and rejoining: %s", exc)
                self._drop_all_tasks()
            except (StateFormatError, sqlite3.Error) as exc:
                # Unreadable state or a failing local disk: not Kafka's fault. Stay up (metrics,
                # probes) and rejoin after the backoff: at once would fail the same way.
                self.metrics.aborts.labels(kind="state").inc()
                log.error("local state failure, rejoining: %s", exc)
                self._drop_all_tasks()
            finally:
                self._close(consumer, txn)
                self._consumer, self._txn = None, None
            if failed:
                failures = 1 if self._committed_since_rejoin else failures + 1
        self.metrics.set_ready(False)

    def _back_off(self, failures: int) -> None:
        delay = self.backoff.delay(failures)
        self.rejoins += 1
        self.metrics.rejoins.inc()
        log.error(
            "rejoin #%d (%d in a row without a commit) in %.1fs",
            self.rejoins,
            failures,
            delay,
        )
        self.pause(delay)

    def _pause_unless_stopped(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while not self._stopping and (left := until - time.monotonic()) > 0:
            self._progress()  # waiting on purpose is not a hang: liveness stays up
            time.sleep(min(PAUSE_SLICE_S, left))

    def _create_clients(self) -> tuple[ConsumerLike, Transaction]:
        txn = Transaction(self.factory.producer(self.settings), self.watchdog, self.budget_s)
        txn.init()
        consumer = self.factory.consumer(self.settings)
        consumer.subscribe(
            list(self.topics.inputs),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        return consumer, txn

    def _close(self, consumer: ConsumerLike, txn: Transaction) -> None:
        try:
            with self.watchdog.guard("close consumer", self.budget_s):
                consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer failed: %s", exc)
        txn.close()

    # -- the loop: steps 1-6 -----------------------------------------------------------------

    def _loop(self, consumer: ConsumerLike, txn: Transaction) -> None:
        last_commit = time.monotonic()
        # An idle consume() waits for the first record at most this long: well under the
        # commit interval, or a quiet topic adds the whole wait to every decision's latency.
        wait_s = min(0.1, self.settings.commit_interval_ms / 2000)
        stage = self.metrics.stage_seconds
        more = False  # the last batch stopped at its bound: buffered records are ready now
        interval_s = self.settings.commit_interval_ms / 1000
        trace = self.trace
        while not self._stopping:
            started = time.monotonic()
            if trace is not None:
                trace.poll_ms = trace.now()
            with self.watchdog.guard("poll", self.budget_s, self.tasks):
                messages, drained = self._consume(consumer, 0.0 if more else wait_s)
            consumed = time.monotonic()
            if trace is not None:
                trace.consumed_ms = trace.now()
            stage.labels(stage="consume_wait").observe(consumed - started)
            if self._rejoin_requested:  # set by a callback that ran inside consume()
                self._rejoin_requested = False
                raise RejoinError("the assignment was lost or a revoke-time commit failed")
            try:
                # One guard for the batch, not one per produce() (~6 us each): step 2 blocks
                # only in a store read or a full producer queue, which has its own guard.
                with self.watchdog.guard(f"{Step.FOLD} fold", self.budget_s, self.tasks):
                    for message in messages:
                        self._take(message)
                    batch = self.order.ready(consumed, drained, CONSUME_BATCH)
                    if trace is not None:
                        trace.released_ms = trace.now()
                    more = len(batch) >= CONSUME_BATCH
                    for n, record in enumerate(batch):
                        if txn.open and time.monotonic() - txn.started >= interval_s:
                            # Commit now; the rest waits, in order: no batch of slow inputs
                            # may hold a transaction open toward its timeout (fenced).
                            self.order.put_back(batch[n:])
                            more = True
                            break
                        self._handle(txn, record)
                    drained = drained and not more
            except AbortableError as exc:
                self._abort(txn, str(exc))
                self._progress()
                continue
            finally:
                self.metrics.flush()
            self._apply_flow(consumer)
            if messages or txn.open:
                stage.labels(stage="fold").observe(time.monotonic() - consumed)
            self.metrics.maybe_observe_lag(consumer, self.tasks, self.topics.inputs)
            self.metrics.maybe_observe_sessions(self.tasks.values())
            # Commit as soon as the consumed records are folded (librdkafka's queue was
            # drained: nothing waits behind them), else at the interval or the size bound.
            due = (time.monotonic() - last_commit) * 1000 >= self.settings.commit_interval_ms
            full = self.owned.folded() >= self.settings.commit_max_events
            if txn.open and (drained or due or full):
                self._commit(txn)
                last_commit = time.monotonic()
            elif not txn.open:
                last_commit = time.monotonic()
            self.trimmer.maybe_trim(time.monotonic())
            self._progress()

    @staticmethod
    def _consume(consumer: ConsumerLike, wait_s: float) -> tuple[list[Message], bool]:
        """What librdkafka has queued; if nothing, wait up to `wait_s` for the first record
        (consume(n) would wait for all n). True with it when the local queue was drained."""
        messages = consumer.consume(CONSUME_BATCH, timeout=0)
        if not messages:
            messages = consumer.consume(1, timeout=wait_s)
            if messages:
                messages += consumer.consume(CONSUME_BATCH - 1, timeout=0)
        return messages, len(messages) < CONSUME_BATCH

    def _take(self, message: Message) -> None:
        """Decode one consumed record into the task's time-ordered buffer (ordering.py)."""
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self.order.at_end(message.topic() or "", message.partition() or 0)
                return
            # A consumer's fatal error (e.g. a static member fenced after a broker restart)
            # arrives as code _FATAL without fatal() set on the message error.
            if error.fatal() or error.code() == KafkaError._FATAL:
                raise RejoinError(str(error))
            if error.code() in REJOIN_CODES:
                raise RejoinError(
                    f"{error}: grant the engine's principal access to its group, input topics "
                    "and transactional id (README, Security)"
                )
            log.warning("consumer error (librdkafka retries): %s", error)
            return
        topic, partition = message.topic() or "", message.partition() or 0
        offset = message.offset() or 0
        if not self.owned.fresh(topic, partition, offset):
            return  # a leftover of an incomplete task or a record folded already
        outcome = self.ingest.accept(message)
        if self.trace is not None:
            self.trace.arrived((topic, partition, offset), float(message.timestamp()[1]))
        at = FIRST if isinstance(outcome, Rejected) else outcome.event_time_ms
        self.order.push(Buffered(topic, partition, offset, at, (message, outcome)))

    def _caught_up(self, topic: str, partition: int, after: int) -> bool:
        """Everything before the end offset librdkafka last heard of is buffered: no need to
        wait for this input (a cached answer, no broker round trip; unknown: wait)."""
        consumer = self._consumer
        if consumer is None:
            return False
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except KafkaException:
            return False
        return high >= 0 and after >= high

    def _apply_flow(self, consumer: ConsumerLike) -> None:
        flow = self.order.flow()
        if flow.pause:
            consumer.pause([TopicPartition(t, p) for t, p in flow.pause])
        if flow.resume:
            consumer.resume([TopicPartition(t, p) for t, p in flow.resume])

    def _handle(self, txn: Transaction, record: Buffered[Consumed]) -> None:
        message, outcome = record.item
        topic, partition, offset = record.topic, record.partition, record.offset
        task = self.owned.claim(topic, partition, offset)
        if task is None:
            return
        txn.partitions = tuple(self.tasks)
        txn.begin()
        if isinstance(outcome, Rejected):
            self._dead_letter(txn, message, outcome)
            return
        event: Event = outcome
        try:
            _, decisions, payloads = task.fold(event, offset, self.codec.encode)
        except InputFailedError as failed:
            # No single input may stop a partition: dead-letter it (with the exception class)
            # and go on; the session's state is as it was before this input.
            log.error(
                "step %s: %s/%d/%d failed to fold or encode: %s",
                Step.FOLD,
                topic,
                partition,
                offset,
                failed,
            )
            self._dead_letter(txn, message, self.ingest.failed(message, failed.cause))
            return
        self.metrics.count_fold(topic, self.ingest.kind_of(event), decisions)
        where = f"{topic}/{partition}/{offset}"
        _log_for_operator(event, decisions, where)
        source = where.encode()
        for decision, payload in zip(decisions, payloads, strict=True):
            txn.produce(
                self.topics.decisions,
                decision.session_id.encode(),
                payload,
                Step.FOLD,
                headers=[("source", source)],
            )
        self._txn_event_times.append(event.event_time_ms)
        if self.trace is not None:
            self.trace.folded((topic, partition, offset), event.session_id)
        self._answer_overdue(txn, task)

    def _answer_overdue(self, txn: Transaction, task: PartitionTask) -> None:
        """Parked resumes the partition's intents watermark has passed get their final answer
        (engine/core/watermark.py), with a `source` naming that watermark for replays."""
        expired = task.expire_overdue(self.codec.encode)
        if not expired:
            return
        source = task.watermark_source()
        self.metrics.count_decisions(d for d, _ in expired)
        _log_alerts((d for d, _ in expired), source)
        for decision, payload in expired:
            txn.produce(
                self.topics.decisions,
                decision.session_id.encode(),
                payload,
                Step.FOLD,
                headers=[("source", source.encode())],
            )

    def _dead_letter(self, txn: Transaction, message: Message, rejected: Rejected) -> None:
        """A dead letter is bounded (an excerpt), and a producer error on it is never fatal:
        it is logged and counted, and the partition goes on."""
        key = message.key()
        delivered = txn.produce(
            self.topics.dead_letters,
            None if key is None else key[:EXCERPT_BYTES],
            rejected.payload,
            Step.FOLD,
            optional=True,
        )
        outcome = rejected.reason if delivered else DEAD_LETTER_REFUSED
        self.metrics.dead_letters.labels(reason=outcome).inc()
        oplog.emit(
            "dead_letter",
            session=_session_of(key),
            reason=outcome,
            source=f"{message.topic()}/{message.partition()}/{message.offset()}",
        )

    def _commit(self, txn: Transaction, tasks: list[PartitionTask] | None = None) -> None:
        """Steps 3-6 for every ready task (or the given ones)."""
        if not txn.open:
            return
        committing = tasks if tasks is not None else list(self.tasks.values())
        started = time.monotonic()
        if self.trace is not None:
            self.trace.commit_ms = self.trace.now()
        try:
            with self.watchdog.guard(f"{Step.CHANGELOG} produce", self.budget_s, self.tasks):
                for task in committing:  # step 3
                    # Only the last record reports its offset: the idempotent producer
                    # delivers one partition in order, so it is the highest (a Python
                    # callback per record cost more than the record's produce).
                    writes = task.changelog_records()
                    last = len(writes) - 1
                    for n, write in enumerate(writes):
                        txn.produce(
                            self.topics.changelog,
                            write.session_id.encode(),
                            write.state or b"",
                            Step.CHANGELOG,
                            partition=task.partition,
                            headers=pending_header(write),
                            on_delivery=_changelog_delivered(task) if n == last else None,
                        )
            assert self._consumer is not None
            consumer = self._consumer
            txn.commit(self.owned.positions(), consumer.consumer_group_metadata)  # steps 4-5
        except AbortableError as exc:
            self._abort(txn, str(exc))
            return
        now_ms, done = time.time() * 1000, time.monotonic()
        stage = self.metrics.stage_seconds
        stage.labels(stage="produce").observe(txn.flushed_at - started)  # steps 3 and 4 flush
        stage.labels(stage="commit").observe(done - txn.flushed_at)  # send offsets, commit
        self.metrics.commit_seconds.observe(done - started)
        self.metrics.observe_decision_latencies(now_ms, self._txn_event_times)
        self._txn_event_times.clear()
        if self.trace is not None:
            self.trace.committed(now_ms - (done - txn.flushed_at) * 1000)
        self._committed_since_rejoin = True
        with self.watchdog.guard(Step.PERSIST_LOCALLY, self.budget_s, self.tasks):
            for task in committing:  # step 6
                task.persist()
        stage.labels(stage="persist").observe(time.monotonic() - done)
        self.metrics.sessions_stale = True

    def _abort(self, txn: Transaction, why: str) -> None:
        """Abortable error: abort, drop write caches, rewind inputs to committed offsets."""
        log.warning("aborting the transaction: %s", why)
        self.metrics.aborts.labels(kind="abortable").inc()
        txn.abort()
        self._txn_event_times.clear()
        if self.trace is not None:
            self.trace.aborted()
        self.owned.discard_uncommitted()
        assert self._consumer is not None
        held = self.order.drop(list(self.tasks))  # read again from the committed offsets
        self._rewind(self._consumer, list(self.tasks))
        if held:
            self._consumer.resume([TopicPartition(t, p) for t, p in held])

    def _rewind(self, consumer: ConsumerLike, partitions: list[int]) -> None:
        wanted = self.owned.wanted(partitions)
        if not wanted:
            return
        with self.watchdog.guard("rewind committed", self.budget_s, partitions):
            committed = consumer.committed(wanted, timeout=CALL_TIMEOUT_S)
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        self.owned.start_at(committed)

    # -- rebalance: A1-A3, revoke, lost --------------------------------------------------------

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels(kind="assign").inc()
        self.metrics.set_ready(False)
        complete, incomplete = self.owned.add(partitions)
        if incomplete:
            consumer.pause(incomplete)
        if complete:
            # librdkafka keeps a partition's pause flag across a revoke and a re-assign, and
            # the order buffer that paused it forgot it at the revoke: start every task unpaused.
            consumer.resume(self.owned.wanted(complete))
        if not complete:
            self.metrics.set_ready(True)
            return
        # A1: committed offsets are fetched with require_stable under read_committed, which
        # waits for a previous owner's pending transaction to finish.
        settle_s = min(self.settings.transaction_timeout_ms / 1000 + 5, STEP_DEADLINE_S)
        with self.watchdog.guard(Step.SETTLE_PREVIOUS_OWNER, self.budget_s + settle_s, complete):
            committed = consumer.committed(self.owned.wanted(complete), timeout=settle_s)
        self.owned.start_at(committed)
        started = time.monotonic()
        # A process can hold every partition: each task gets its share of the memory bounds.
        share = self.settings.partitions
        cache_kib = self.settings.store_cache_mb * 1024 // share
        stores = {
            p: LocalStore(self._state_root / f"p{p}.sqlite", cache_kib=cache_kib) for p in complete
        }
        try:
            with self.watchdog.guard(Step.RESTORE_DELTA, self.budget_s, complete):
                reports = self.factory.restore(self.settings, stores, self._restore_progress)
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
            self.owned.ready(
                PartitionTask(
                    partition=report.partition,
                    store=stores[report.partition],
                    read_cache_bytes=self.settings.read_cache_mb * 2**20 // share,
                )
            )
        self.metrics.restore_seconds.observe(time.monotonic() - started)
        self.metrics.observe_sessions(self.tasks.values())
        self.metrics.set_ready(True)

    def _restore_progress(self) -> None:
        self.watchdog.renew()
        self._progress()

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels(kind="revoke").inc()
        txn = self._txn
        if txn is not None and txn.open:
            try:
                self._commit(txn)  # a txn spans all tasks: commit all of them
            except RejoinError as exc:
                log.error("commit on revoke failed, rejoining with new clients: %s", exc)
                self._drop_all_tasks()
                self._rejoin_requested = True
        self.owned.release(partitions)
        self._resume_held(consumer, self.order.drop({tp.partition for tp in partitions}))
        if not self.tasks:
            self.metrics.set_ready(False)

    @staticmethod
    def _resume_held(consumer: Any, held: list[tuple[str, int]]) -> None:
        """Unpause what the order buffer paused before the partitions go: librdkafka would
        keep them paused if they came back, and nothing would resume them (a stall)."""
        if not held:
            return
        try:
            consumer.resume([TopicPartition(t, p) for t, p in held])
        except KafkaException as exc:  # not assigned any more: nothing left to unpause
            log.info("resume of revoked partitions refused: %s", exc)

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalances.labels(kind="lost").inc()
        log.warning("assignment lost: aborting without committing, then rejoining")
        # Observed after a broker restart: the same producer's next send_offsets_to_transaction
        # blocked past its timeout. New clients after a lost assignment avoid that state.
        self._rejoin_requested = True
        txn = self._txn
        if txn is not None and txn.open:
            try:
                self._abort(txn, "assignment lost")
            except (RejoinError, KafkaException) as exc:
                log.warning("abort after a lost assignment failed (rejoining anyway): %s", exc)
        self.owned.release(partitions)
        self._resume_held(consumer, self.order.drop({tp.partition for tp in partitions}))

    def _drop_all_tasks(self) -> None:
        self.owned.drop_all()
        self.order.clear()
        if self._txn is not None and self._txn.open:
            self._txn.status = TxnStatus.FAILED  # dropped with its clients, never flushed
        self._txn_event_times.clear()
        if self.trace is not None:
            self.trace.aborted()
        self.metrics.set_ready(False)


def _changelog_delivered(task: PartitionTask) -> Any:
    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is None:
            task.changelog_high = max(task.changelog_high, message.offset() or 0)

    return delivered
