"""Step 2 for one released record: fold it into its task and put its outputs (decisions,
the answers the watermark gives, or a dead letter) into the commit that is open for outputs."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import Message

from engine import oplog
from engine.core.events import Decision, Event, Reason, RepairEvent
from engine.runtime.commit.commit import Commit
from engine.runtime.commit.protocol import Step
from engine.runtime.commit.transaction import Transactions
from engine.runtime.intake.ingest import Rejected
from engine.runtime.intake.ordering import Buffered
from engine.runtime.parts import Consumed, Parts
from engine.runtime.process.metrics import DEAD_LETTER_REFUSED
from engine.runtime.tasks.state import InputFailedError
from engine.runtime.tasks.task import PartitionTask
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


class FoldStep:
    """Folds released records; what it produces goes into `Transactions.for_outputs()`."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        # Looked up once, not per input: `parts.topics` builds its names on every call.
        self.decisions_topic = parts.topics.decisions
        self.encode = parts.codec.encode
        # The metrics' tallies, counted here per input (published per batch by their flush).
        self.events_tally = parts.metrics.events_tally
        self.decisions_tally = parts.metrics.decisions_tally

    def handle(self, txn: Transactions, record: Buffered[Consumed]) -> None:
        message, outcome = record.item
        topic, partition, offset = record.topic, record.partition, record.offset
        parts = self.parts
        task = parts.owned.claim(topic, partition, offset)
        if task is None:
            return
        if not txn.open:
            txn.partitions = tuple(parts.owned.tasks)  # for the watchdog's report
        commit = txn.for_outputs()
        if isinstance(outcome, Rejected):
            self._dead_letter(commit, message, outcome)
            return
        event: Event = outcome
        try:
            _, decisions, payloads = task.fold(event, offset, self.encode)
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
            self._dead_letter(commit, message, parts.ingest.failed(message, failed.cause))
            return
        events = self.events_tally
        kind = (topic, parts.ingest.kind_of(event))
        events[kind] = events.get(kind, 0) + 1
        self._count(decisions)
        where = f"{topic}/{partition}/{offset}"
        # `type(...) is`: a negative isinstance on a msgspec class goes through its
        # metaclass's __instancecheck__ (slow, per input); events are never subclassed.
        if type(event) is RepairEvent or any(d.alert for d in decisions):
            _log_for_operator(event, decisions, where)
        headers = [("source", where.encode())]
        records = [
            (d.session_id.encode(), payload, headers)
            for d, payload in zip(decisions, payloads, strict=True)
        ]
        commit.produce_all(self.decisions_topic, records, Step.FOLD)
        commit.event_times.append(event.event_time_ms)
        if parts.trace is not None:
            parts.trace.folded((topic, partition, offset), event.session_id)
        self._answer_overdue(commit, task)

    def _answer_overdue(self, commit: Commit, task: PartitionTask) -> None:
        """Parked resumes the partition's intents watermark has passed get their final answer
        (engine/core/watermark.py), with a `source` naming that watermark for replays."""
        expired = task.expire_overdue(self.encode)
        if not expired:
            return
        source = task.watermark_source()
        self._count([d for d, _ in expired])
        _log_alerts((d for d, _ in expired), source)
        for decision, payload in expired:
            commit.produce(
                self.decisions_topic,
                decision.session_id.encode(),
                payload,
                Step.FOLD,
                headers=[("source", source.encode())],
            )

    def _count(self, decisions: Iterable[Decision]) -> None:
        """`EngineMetrics.count_decisions`, here: it runs per input."""
        tally = self.decisions_tally
        for decision in decisions:
            key = (decision.verdict, decision.reason, decision.alert)
            tally[key] = tally.get(key, 0) + 1

    def _dead_letter(self, commit: Commit, message: Message, rejected: Rejected) -> None:
        """A dead letter is bounded (an excerpt), and a producer error on it is never fatal:
        it is logged and counted, and the partition goes on. Counted once produced, which a
        commit in flight defers to `produce_held`: only then is a refusal known."""
        key = message.key()
        source = f"{message.topic()}/{message.partition()}/{message.offset()}"

        def count(delivered: bool) -> None:
            outcome = rejected.reason if delivered else DEAD_LETTER_REFUSED
            self.parts.metrics.dead_letters.labels(reason=outcome).inc()
            oplog.emit("dead_letter", session=_session_of(key), reason=outcome, source=source)

        commit.produce(
            self.parts.topics.dead_letters,
            None if key is None else key[:EXCERPT_BYTES],
            rejected.payload,
            Step.FOLD,
            optional=True,
            outcome=count,
        )
