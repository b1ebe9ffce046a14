"""Steps 1-6 of COMMIT_PROTOCOL.md, in the order the loop runs them: consume, order, fold and
produce (1-2), then changelog, offsets, commit and local persist (3-6), or abort and rewind.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from engine import oplog
from engine.core.events import Decision, Event, Reason, RepairEvent
from engine.runtime.clients import ConsumerLike
from engine.runtime.commit.commit import Commit
from engine.runtime.commit.errors import AbortableError, RejoinError
from engine.runtime.commit.protocol import Step
from engine.runtime.commit.transaction import CALL_TIMEOUT_S, Transactions
from engine.runtime.engine_state import Consumed, EngineState
from engine.runtime.ingest import Rejected
from engine.runtime.metrics import DEAD_LETTER_REFUSED
from engine.runtime.ordering import FIRST, Buffered
from engine.runtime.task import InputFailedError, PartitionTask
from engine.wire.dead_letter import EXCERPT_BYTES

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
    """One ops line per alert raised and per repair: `repair_applied` only when the repair
    changed the session, else `repair_not_applied` with the engine's reason (nothing to repair,
    stamped before the latest grant, an unknown intent), so an operator never reads a refused
    repair as one that took effect."""
    _log_alerts(decisions, source)
    if isinstance(event, RepairEvent):
        first = next(iter(decisions), None)
        applied = first is not None and first.reason is Reason.REPAIRED
        oplog.emit(
            "repair_applied" if applied else "repair_not_applied",
            session=event.session_id,
            resolution=event.resolution,
            actor=event.actor,
            reason=event.reason,
            verdict=first.verdict if first is not None else "-",
            outcome=first.reason if first is not None else "-",
            source=source,
        )


CONSUME_BATCH = 1_000
FOLD_AHEAD_CHUNK = 64  # records folded between two looks at whether the commit returned


# Consumer errors that librdkafka reports as non-fatal but that no retry inside the same clients
# fixes (an ACL changed under us): rejoin with new clients, backing off, so the log counts them.
REJOIN_CODES = frozenset(
    {
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


class CommitLoop(EngineState):
    """The loop over one pair of clients: every input folded once, committed exactly once."""

    def _loop(self, consumer: ConsumerLike, txn: Transactions) -> None:
        try:
            self._run_loop(consumer, txn)
        finally:
            if txn.in_flight:  # leaving with an exception: the commit ends as a crash would
                txn.abandon()

    def _run_loop(self, consumer: ConsumerLike, txn: Transactions) -> None:
        last_commit = time.monotonic()
        # An idle consume() waits for the first record at most this long: well under the
        # commit interval, or a quiet topic adds the whole wait to every decision's latency.
        wait_s = min(0.1, self.settings.commit_interval_ms / 2000)
        stage = self.metrics.stage_seconds
        more = False  # the last batch stopped at its bound: buffered records are ready now
        interval_s = self.settings.commit_interval_ms / 1000
        trace = self.trace
        drained = True
        while True:
            if txn.in_flight:  # steps 4-5 run in the worker: fold ahead, then step 6
                self._overlap(consumer, txn, drained)
                self._apply_flow(consumer)
                last_commit = time.monotonic()
                more = True  # what was consumed meanwhile may be ready: consume without waiting
                self._progress()
                continue
            if self._stopping:
                break
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
                    self._take(messages)
                    batch = self.order.ready(consumed, drained, CONSUME_BATCH)
                    self._prefetch(batch)
                    if trace is not None:
                        trace.released_ms = trace.now()
                    more = len(batch) >= CONSUME_BATCH
                    # Only a commit or an abort closes the transaction, never step 2: once it is
                    # open, its deadline holds for the rest of the batch.
                    due_at = _due_at(txn, interval_s)
                    for n, record in enumerate(batch):
                        if time.monotonic() >= due_at:
                            # Commit now; the rest waits, in order: no batch of slow inputs
                            # may hold a transaction open toward its timeout (fenced).
                            self.order.put_back(batch[n:])
                            more = True
                            break
                        self._handle(txn, record)
                        if due_at == math.inf:
                            due_at = _due_at(txn, interval_s)
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
                # Overlapped only when records wait behind this commit (a backlog): drained,
                # nothing is left to fold ahead, and a second thread would only add GIL
                # hand-offs and shorter, more frequent commits (COMMIT_PROTOCOL "Overlap").
                if self.settings.commit_overlap and not drained and not self._stopping:
                    self._start_commit(txn)
                else:
                    self._commit(txn)
                last_commit = time.monotonic()
            elif not txn.open:
                last_commit = time.monotonic()
                if not messages:  # idle: what step 6 wrote lazily goes to disk now
                    self._sync_stores()
            self.trimmer.maybe_trim(time.monotonic())
            self._progress()

    def _consume(self, consumer: ConsumerLike, wait_s: float) -> tuple[list[Message], bool]:
        """What librdkafka has queued; if nothing, wait up to `wait_s` for the first record
        (consume(n) would wait for all n). True with it when the local queue was drained.
        No second call once a callback asked for a rejoin: after a lost assignment librdkafka
        rejoins on its own, and the next consume() would run on_assign (A0-A2, a restore) for
        clients the loop is about to drop."""
        messages = consumer.consume(CONSUME_BATCH, timeout=0)
        if not messages and not self._rejoin_requested:
            messages = consumer.consume(1, timeout=wait_s)
            if messages and not self._rejoin_requested:
                messages += consumer.consume(CONSUME_BATCH - 1, timeout=0)
        return messages, len(messages) < CONSUME_BATCH

    def _take(self, messages: list[Message]) -> None:
        """Decode consumed records into the tasks' time-ordered buffer (ordering.py): one
        pass, each accessor called once, the lookups hoisted (this runs once per input)."""
        fresh, accept, push = self.owned.fresh, self.ingest.accept, self.order.push
        trace = self.trace
        for message in messages:
            if message.error() is not None:
                self._consumer_error(message)
                continue
            topic, partition = message.topic() or "", message.partition() or 0
            offset = message.offset() or 0
            if not fresh(topic, partition, offset):
                continue  # a leftover of an incomplete task or a record folded already
            outcome = accept(message, topic, partition, offset)
            if trace is not None:
                trace.arrived((topic, partition, offset), float(message.timestamp()[1]))
            at = FIRST if isinstance(outcome, Rejected) else outcome.event_time_ms
            push(Buffered(topic, partition, offset, at, (message, outcome)))

    def _consumer_error(self, message: Message) -> None:
        error = message.error()
        assert error is not None
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

    def _prefetch(self, batch: list[Buffered[Consumed]]) -> None:
        """One store query per partition for the sessions of the batch (step 2 reads them)."""
        sessions: dict[int, list[str]] = {}
        for record in batch:
            outcome = record.item[1]
            if not isinstance(outcome, Rejected):
                sessions.setdefault(record.partition, []).append(outcome.session_id)
        tasks = self.tasks
        for partition, ids in sessions.items():
            task = tasks.get(partition)
            if task is not None:
                task.prefetch(ids)

    def _apply_flow(self, consumer: ConsumerLike) -> None:
        flow = self.order.flow()
        if flow.pause:
            consumer.pause([TopicPartition(t, p) for t, p in flow.pause])
        if flow.resume:
            consumer.resume([TopicPartition(t, p) for t, p in flow.resume])

    def _handle(self, txn: Transactions, record: Buffered[Consumed]) -> None:
        message, outcome = record.item
        topic, partition, offset = record.topic, record.partition, record.offset
        task = self.owned.claim(topic, partition, offset)
        if task is None:
            return
        if not txn.open:
            txn.partitions = tuple(self.tasks)  # for the watchdog's report
        commit = txn.for_outputs()
        if isinstance(outcome, Rejected):
            self._dead_letter(commit, message, outcome)
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
            self._dead_letter(commit, message, self.ingest.failed(message, failed.cause))
            return
        self.metrics.count_fold(topic, self.ingest.kind_of(event), decisions)
        where = f"{topic}/{partition}/{offset}"
        _log_for_operator(event, decisions, where)
        source = where.encode()
        for decision, payload in zip(decisions, payloads, strict=True):
            commit.produce(
                self.topics.decisions,
                decision.session_id.encode(),
                payload,
                Step.FOLD,
                headers=[("source", source)],
            )
        commit.event_times.append(event.event_time_ms)
        if self.trace is not None:
            self.trace.folded((topic, partition, offset), event.session_id)
        self._answer_overdue(commit, task)

    def _answer_overdue(self, commit: Commit, task: PartitionTask) -> None:
        """Parked resumes the partition's intents watermark has passed get their final answer
        (engine/core/watermark.py), with a `source` naming that watermark for replays."""
        expired = task.expire_overdue(self.codec.encode)
        if not expired:
            return
        source = task.watermark_source()
        self.metrics.count_decisions(d for d, _ in expired)
        _log_alerts((d for d, _ in expired), source)
        for decision, payload in expired:
            commit.produce(
                self.topics.decisions,
                decision.session_id.encode(),
                payload,
                Step.FOLD,
                headers=[("source", source.encode())],
            )

    def _dead_letter(self, commit: Commit, message: Message, rejected: Rejected) -> None:
        """A dead letter is bounded (an excerpt), and a producer error on it is never fatal:
        it is logged and counted, and the partition goes on. Counted once produced, which a
        commit in flight defers to `produce_held`: only then is a refusal known."""
        key = message.key()
        source = f"{message.topic()}/{message.partition()}/{message.offset()}"

        def count(delivered: bool) -> None:
            outcome = rejected.reason if delivered else DEAD_LETTER_REFUSED
            self.metrics.dead_letters.labels(reason=outcome).inc()
            oplog.emit("dead_letter", session=_session_of(key), reason=outcome, source=source)

        commit.produce(
            self.topics.dead_letters,
            None if key is None else key[:EXCERPT_BYTES],
            rejected.payload,
            Step.FOLD,
            optional=True,
            outcome=count,
        )

    def _commit(self, txn: Transactions) -> None:
        """Steps 3-6 for every ready task, waiting for the broker."""
        commit = txn.current
        if commit is None or not commit.open:
            if self._stopping:  # nothing of step 6 may wait in an open SQLite batch
                self._sync_stores()
            return
        try:
            self._changelog(commit)  # step 3
            commit.commit_steps()  # steps 4-5
        except AbortableError as exc:
            self._abort(txn, str(exc))
            return
        self._committed(commit)

    def _start_commit(self, txn: Transactions) -> None:
        """Step 3, then steps 4-5 in the commit's worker thread (COMMIT_PROTOCOL.md,
        "Overlap"): the tasks seal what this transaction wrote, so that step 6 persists
        exactly that, whatever is folded ahead meanwhile into the next commit."""
        commit = txn.current
        assert commit is not None
        try:
            self._changelog(commit)
        except AbortableError as exc:
            self._abort(txn, str(exc))
            return
        if self.trace is not None:
            self.trace.seal()
        txn.hand_to_worker(commit)

    def _overlap(self, consumer: ConsumerLike, txn: Transactions, drained: bool) -> None:
        """While steps 4-5 run in the worker: fold what the order buffer releases, consuming
        more (never waiting) when it releases nothing, their outputs held by the transaction;
        then wait for the worker and finish the commit. A rebalance callback that runs inside
        consume() finishes the commit first (`_settle_commit`)."""
        started = time.monotonic()
        folded = 0
        # The next transaction's size bound also bounds what is held in memory meanwhile (a
        # commit retried toward its 40 s deadline must not let the loop read on unbounded).
        room = self.settings.commit_max_events
        trace = self.trace
        try:
            while txn.worker_busy() and folded < room:
                batch = self.order.ready(time.monotonic(), drained, FOLD_AHEAD_CHUNK)
                if not batch:
                    if trace is not None:
                        trace.poll_ms = trace.now()
                    with self.watchdog.guard("poll", self.budget_s, self.tasks):
                        messages = consumer.consume(CONSUME_BATCH, timeout=0)
                    if trace is not None:
                        trace.consumed_ms = trace.now()
                    if self._rejoin_requested:  # set by a callback that ran inside consume()
                        self._rejoin_requested = False
                        raise RejoinError("the assignment was lost or a revoke-time commit failed")
                    if not messages:
                        break
                    drained = len(messages) < CONSUME_BATCH
                    # taken even if a callback finished the commit: consumed is consumed
                    with self.watchdog.guard(f"{Step.FOLD} fold ahead", self.budget_s, self.tasks):
                        self._take(messages)
                    self._apply_flow(consumer)
                    if not txn.in_flight:
                        break
                    continue
                with self.watchdog.guard(f"{Step.FOLD} fold ahead", self.budget_s, self.tasks):
                    self._prefetch(batch)
                    if trace is not None:
                        trace.released_ms = trace.now()
                    for record in batch:
                        self._handle(txn, record)
                folded += len(batch)
        finally:
            self.metrics.flush()
        waiting = time.monotonic()
        stage = self.metrics.stage_seconds
        if folded:
            stage.labels(stage="fold_ahead").observe(waiting - started)
        if txn.in_flight:
            self._finish_commit(txn)
        stage.labels(stage="commit_wait").observe(time.monotonic() - waiting)

    def _settle_commit(self) -> None:
        """Called first by every rebalance callback: consume() runs them, and the loop calls
        consume() while a commit is in flight. That commit finishes here (steps 4-5 awaited,
        step 6, the held outputs into the next transaction), so a callback sees at most one
        open transaction, as without the overlap."""
        txn = self._txn
        if txn is None or not txn.in_flight:
            return
        try:
            self._finish_commit(txn)
        except (RejoinError, KafkaException) as exc:  # KafkaException: the abort's rewind
            log.error("the commit in flight failed in a rebalance, rejoining: %s", exc)
            self._rejoin_requested = True

    def _finish_commit(self, txn: Transactions) -> None:
        """Steps 4-5 returned: step 6 of the sealed writes, then the next commit begins with
        its held outputs. If they failed (abortable), what was folded ahead is dropped with
        them (`_abort`: discard, rewind); fatal errors propagate (rejoin)."""
        try:
            commit = txn.returned()
        except AbortableError as exc:
            self._abort(txn, str(exc))
            return
        self._committed(commit)
        after = txn.current
        if after is None or not after.holds_outputs:
            return
        try:  # step 2's records, produced now: under step 2's guard
            with self.watchdog.guard(f"{Step.FOLD} fold", self.budget_s, self.tasks):
                after.begin()
        except AbortableError as exc:
            self._abort(txn, str(exc))

    def _changelog(self, commit: Commit) -> None:
        """Step 3 for every ready task: one changelog record per session changed."""
        if self.trace is not None:
            self.trace.commit_ms = self.trace.now()
        assert self._consumer is not None
        with self.watchdog.guard(f"{Step.CHANGELOG} produce", self.budget_s, self.tasks):
            commit.write_changelog(
                self.topics.changelog,
                list(self.tasks.values()),
                self.owned.positions(),
                self._consumer.consumer_group_metadata,
            )

    def _committed(self, commit: Commit) -> None:
        """After step 5: metrics, then step 6 (of the sealed generation only, when the
        commit overlapped with folds of the next transaction)."""
        now_ms, done, sealed = time.time() * 1000, commit.committed_at, commit.overlapped
        stage = self.metrics.stage_seconds
        stage.labels(stage="produce").observe(commit.flushed_at - commit.sealed_at)  # 3, 4
        stage.labels(stage="commit").observe(done - commit.flushed_at)  # offsets, commit
        self.metrics.commit_seconds.observe(done - commit.sealed_at)
        self.metrics.observe_decision_latencies(now_ms, commit.event_times)
        if self.trace is not None:  # the worker's times, not when the loop saw them
            mono = time.monotonic()
            flushed_ms, done_ms = (now_ms - (mono - t) * 1000 for t in (commit.flushed_at, done))
            self.trace.committed(flushed_ms, done_ms, sealed=sealed)
        self._committed_since_rejoin = True
        persisted = time.monotonic()
        with self.watchdog.guard(Step.PERSIST_LOCALLY, self.budget_s, self.tasks):
            commit.persist()  # step 6
            if self._stopping and not sealed:  # the last commit: nothing waits in SQLite
                self._sync_stores()
            else:  # a partition without writes in this commit may hold a batch past its age
                now = time.monotonic()
                for task in self.tasks.values():
                    task.store.sync_if_due(now)
        stage.labels(stage="persist").observe(time.monotonic() - persisted)
        if self.collector is not None:  # freeze what this commit left alive (collector.py)
            self.collector.committed(time.monotonic())
        self.metrics.sessions_stale = True

    def _sync_stores(self) -> None:
        with self.watchdog.guard(f"{Step.PERSIST_LOCALLY} sync", self.budget_s, self.tasks):
            for task in self.tasks.values():
                task.store.sync()

    def _abort(self, txn: Transactions, why: str) -> None:
        """Abortable error: abort, drop write caches, rewind inputs to committed offsets."""
        log.warning("aborting the transaction: %s", why)
        self.metrics.aborts.labels(kind="abortable").inc()
        txn.abort_all()
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


def _due_at(txn: Transactions, interval_s: float) -> float:
    """When the open commit reaches the commit interval (never while none is open)."""
    commit = txn.current
    return commit.started + interval_s if commit is not None and commit.open else math.inf
