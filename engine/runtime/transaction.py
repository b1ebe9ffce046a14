"""One place for the transaction: its status, every transactional call and how errors classify.

Every call goes through `Transaction.call`: under a watchdog guard (a call that never returns ends
the process), with librdkafka's classes mapped to one outcome each (COMMIT_PROTOCOL.md, "Errors"):
retriable -> retried until the step's deadline; abortable -> `AbortableError`; fatal, fenced,
unclassified or a deadline passed -> `RejoinError`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from engine.runtime.clients import ProducerLike
from engine.runtime.protocol import Step
from engine.runtime.watchdog import Watchdog

log = logging.getLogger("reconciler.engine")

T = TypeVar("T")
# A record produced while an overlapped commit is in flight: topic, key, value, step, optional,
# the caller's outcome callback, the producer's extra arguments.
_Held = tuple[str, bytes | None, bytes, str, bool, Callable[[bool], None] | None, dict[str, Any]]

CALL_TIMEOUT_S = 10.0
"""The timeout given to one librdkafka call; a retry gets what is left of the step's deadline."""
STEP_DEADLINE_S = 40.0
"""Steps 3-5 together, and any other transactional call with its retries: well under
`max.poll.interval.ms` (60 s)."""
OWN_BUDGET_MARGIN_S = 2.0
"""A call that librdkafka is known to hang past its own timeout (5456: send_offsets with a
retired coordinator handle; 5511: with a coordinator dropped from metadata, which a broker
restart or kill does on a cluster) is cut by the watchdog this long after that timeout, not
after the general budget (transaction timeout + margin, ~45 s)."""
SEND_OFFSETS_TIMEOUT_S = 3.0
"""send_offsets takes a few round trips (ms; under a second at 200 ms each); a slower one is
retried within the step's deadline. Short, so the hang above is cut 5 s after the call began
and the restarted engine decides again about 10 s after a broker restart (15 s before the
budget of 10 + 5 s became 3 + 2: 24.7 s)."""


class TxnStatus(StrEnum):
    NONE = "none"  # no transaction open: the next fold begins one
    OPEN = "open"
    COMMITTING = "committing"
    ABORTING = "aborting"
    FAILED = "failed"  # fatal: this producer is done, the engine rejoins with new clients


class ErrorClass(StrEnum):
    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    FATAL = "fatal"
    DEADLINE = "deadline"


class AbortableError(Exception):
    """The transaction must be aborted and the inputs rewound (txn_requires_abort)."""


class RejoinError(Exception):
    """Fatal, fenced, unclassified or out of time: drop the tasks, new clients, rejoin."""


def classify(error: KafkaError, *, deadline_passed: bool) -> ErrorClass:
    """librdkafka's classes in its documented precedence; unclassified counts as fatal."""
    if error.fatal() or error.code() in (KafkaError._FENCED, KafkaError._FATAL):
        return ErrorClass.FATAL
    if error.txn_requires_abort():
        return ErrorClass.ABORTABLE
    if error.retriable():
        return ErrorClass.DEADLINE if deadline_passed else ErrorClass.RETRIABLE
    return ErrorClass.FATAL


class Transaction:
    """The producer's transaction state machine: NONE -> OPEN -> COMMITTING -> NONE, or
    OPEN/COMMITTING -> ABORTING -> NONE; any fatal error -> FAILED (terminal)."""

    def __init__(self, producer: ProducerLike, watchdog: Watchdog, budget_s: float) -> None:
        self.producer = producer
        self.watchdog = watchdog
        self.budget_s = budget_s  # the watchdog's bound on any one call
        self.status = TxnStatus.NONE
        self.started = 0.0
        self.flushed_at = 0.0  # when step 4's flush returned (the per-stage histogram)
        self.committed_at = 0.0  # when step 5 returned
        self.partitions: tuple[int, ...] = ()  # for the watchdog's report
        # An overlapped commit (`start_commit`): the worker running steps 4-5, what it raised,
        # and the records produced meanwhile, held until the next transaction begins.
        self._worker: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._held: list[_Held] | None = None

    @property
    def open(self) -> bool:
        return self.status in (TxnStatus.OPEN, TxnStatus.COMMITTING)

    @property
    def in_flight(self) -> bool:
        """An overlapped commit was started and not finished yet (`finish_commit`)."""
        return self._worker is not None

    def call(
        self,
        step: str,
        fn: Callable[[float], T],
        deadline: float | None = None,
        *,
        own_budget: bool = False,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> T:
        """The one classified call: `fn(timeout_s)` under a watchdog guard, retried while
        retriable and before `deadline`. With `own_budget` the guard's budget is the timeout
        given plus `OWN_BUDGET_MARGIN_S`, not the general `budget_s`."""
        deadline = deadline or time.monotonic() + STEP_DEADLINE_S
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            timeout_s = max(1.0, min(call_timeout_s, left))
            budget_s = timeout_s + OWN_BUDGET_MARGIN_S if own_budget else self.budget_s
            try:
                with self.watchdog.guard(step, budget_s, self.partitions):
                    return fn(timeout_s)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                passed = deadline - time.monotonic() <= 1.0
                kind = classify(error, deadline_passed=passed)
                if kind is ErrorClass.RETRIABLE:
                    attempt += 1
                    log.warning("step %s: retriable error, retry %d: %s", step, attempt, error)
                    time.sleep(min(0.1 * attempt, 1.0))
                    continue
                if kind is ErrorClass.ABORTABLE:
                    raise AbortableError(f"step {step}: {error}") from exc
                self.status = TxnStatus.FAILED
                raise RejoinError(f"step {step} ({kind}): {error}") from exc

    def init(self) -> None:
        self.call("init_transactions", lambda t: self.producer.init_transactions(t))

    def begin(self) -> None:
        if self.open or self._worker is not None:
            return
        self.call(Step.BEGIN, lambda _: self.producer.begin_transaction())
        self.status = TxnStatus.OPEN
        self.started = time.monotonic()

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        step: str,
        *,
        optional: bool = False,
        outcome: Callable[[bool], None] | None = None,
        **extra: Any,
    ) -> bool:
        """Queue one record in the open transaction; a full queue waits for deliveries.
        produce() itself never blocks: the caller guards a whole batch of them. An
        `optional` record (a dead letter) refused for itself, neither fatal nor abortable
        (e.g. too large), is logged and skipped: returns False. While an overlapped commit is
        in flight the record is held (one producer, one transaction) and True returned; so
        `outcome`, if given, is told the real result when the record is produced (at once,
        or from `produce_held`), and never if a held record is dropped."""
        if self._held is not None:
            self._held.append((topic, key, value, step, optional, outcome, extra))
            return True
        delivered = self._produce(topic, key, value, step, optional, extra)
        if outcome is not None:
            outcome(delivered)
        return delivered

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        step: str,
        optional: bool,
        extra: dict[str, Any],
    ) -> bool:
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, **extra)
                return True
            except BufferError:
                self.call(f"{step} produce (queue full)", lambda _: self.producer.poll(0.05))
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                kind = classify(error, deadline_passed=True)
                if kind is ErrorClass.ABORTABLE:
                    raise AbortableError(f"step {step}: {error}") from exc
                if optional and not error.fatal():
                    log.error(
                        "step %s: %s refused a record (%d bytes), skipped: %s",
                        step,
                        topic,
                        len(value),
                        error,
                    )
                    return False
                self.status = TxnStatus.FAILED
                raise RejoinError(f"step {step}: {error}") from exc

    def commit(self, offsets: list[TopicPartition], group_metadata: Callable[[], Any]) -> None:
        """Steps 4-5 under one deadline: flush, send the offsets, commit."""
        self.status = TxnStatus.COMMITTING
        self._steps_4_5(offsets, group_metadata() if offsets else None)
        self.status = TxnStatus.NONE

    def _steps_4_5(self, offsets: list[TopicPartition], metadata: Any) -> None:
        deadline = time.monotonic() + STEP_DEADLINE_S
        self.call(f"{Step.OFFSETS} flush", self._flush, deadline)
        self.flushed_at = time.monotonic()
        if offsets:
            self.call(
                f"{Step.OFFSETS} send_offsets",
                lambda t: self.producer.send_offsets_to_transaction(offsets, metadata, t),
                deadline,
                own_budget=True,
                call_timeout_s=SEND_OFFSETS_TIMEOUT_S,
            )
        self.call(Step.COMMIT, lambda t: self.producer.commit_transaction(t), deadline)
        self.committed_at = time.monotonic()

    def start_commit(
        self, offsets: list[TopicPartition], group_metadata: Callable[[], Any]
    ) -> None:
        """Steps 4-5 in a worker thread (librdkafka's calls release the GIL), so the loop can
        fold records it already consumed meanwhile. Until `finish_commit` every `produce` is
        held, and nothing else may call the producer (COMMIT_PROTOCOL.md, "Overlap")."""
        assert self._worker is None, "one commit in flight at a time"
        self.status = TxnStatus.COMMITTING
        self._held, self._failure = [], None
        metadata = group_metadata() if offsets else None  # the consumer: this thread only

        def run() -> None:
            try:
                self._steps_4_5(offsets, metadata)
            except BaseException as exc:  # raised again by finish_commit, in the loop's thread
                self._failure = exc

        self._worker = threading.Thread(target=run, name="commit", daemon=True)
        self._worker.start()

    def commit_done(self) -> bool:
        """The worker has returned (or none runs): `finish_commit` will not wait."""
        return self._worker is None or not self._worker.is_alive()

    def finish_commit(self) -> None:
        """Wait for the worker; raise what steps 4-5 raised (the held records are dropped
        then). On success the transaction is closed and the held records wait for
        `produce_held`. The wait is bounded by the worker's own watchdog guards."""
        worker = self._worker
        if worker is None:
            return
        worker.join()
        self._worker = None
        failure, self._failure = self._failure, None
        if failure is not None:
            self._held = None
            raise failure
        self.status = TxnStatus.NONE

    def produce_held(self) -> int:
        """Begin the next transaction with the records held during the overlapped commit, in
        the order they were produced (a session's decisions stay in order); their count."""
        held, self._held = self._held, None
        if not held:
            return 0
        self.begin()
        for topic, key, value, step, optional, outcome, extra in held:
            self.produce(topic, key, value, step, optional=optional, outcome=outcome, **extra)
        return len(held)

    def abandon_commit(self) -> None:
        """The loop is leaving with an exception: wait for the worker, keep nothing of it.
        The transaction is then whatever the worker left it (a crash's outcome)."""
        worker = self._worker
        if worker is not None:
            worker.join()
            self._worker = None
            if self._failure is not None:
                log.warning(
                    "overlapped commit failed while the loop was leaving: %s", self._failure
                )
            self._failure = None
        self._held = None

    def abort(self) -> None:
        self._held = None  # held for the next transaction: folded ahead, never visible
        self.status = TxnStatus.ABORTING
        try:
            self.call("abort", lambda t: self.producer.abort_transaction(t))
        except AbortableError as exc:  # abort cannot itself require an abort: treat as fatal
            self.status = TxnStatus.FAILED
            raise RejoinError(f"abort failed: {exc}") from exc
        self.status = TxnStatus.NONE

    def _flush(self, timeout_s: float) -> None:
        remaining = self.producer.flush(timeout_s)
        if remaining:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"{remaining} undelivered", retriable=True)
            )

    def close(self, timeout_s: float = 5.0) -> None:
        """Best effort at shutdown: a fenced or failed producer is dropped, never flushed
        (flushing a fenced producer raises, which used to turn a rejoin into an exit)."""
        if self.status is TxnStatus.FAILED:
            return
        try:
            with self.watchdog.guard("close producer", self.budget_s, self.partitions):
                self.producer.flush(timeout_s)
        except (KafkaException, RuntimeError) as exc:
            log.warning("flushing the producer at close failed (dropped): %s", exc)
