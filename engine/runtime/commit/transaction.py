"""The producer's side of the protocol: every transactional call classified, and the commits.

Every call goes through `Transactions.call`: under a watchdog guard (a call that never returns
ends the process), with librdkafka's classes mapped to one outcome each (COMMIT_PROTOCOL.md,
"Errors"): retriable -> retried until the step's deadline; abortable -> `AbortableError`;
fatal, fenced, unclassified or a deadline passed -> `RejoinError`.

`Transactions` also knows the commits alive on its producer: at most one `committing` (steps
4-5 in the worker) and one `current` (the one outputs go into). That pair is the overlap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from engine.runtime.clients import ProducerLike
from engine.runtime.commit.calls import STEP_DEADLINE_S, Record
from engine.runtime.commit.commit import Commit
from engine.runtime.commit.errors import AbortableError, RejoinError
from engine.runtime.commit.status import CommitStatus
from engine.runtime.process.watchdog import Watchdog

log = logging.getLogger("reconciler.engine")

T = TypeVar("T")

CALL_TIMEOUT_S = 10.0
"""The timeout given to one librdkafka call; a retry gets what is left of the step's deadline."""
OWN_BUDGET_MARGIN_S = 2.0
"""A call that librdkafka is known to hang past its own timeout (send_offsets with a retired
coordinator handle: https://github.com/confluentinc/librdkafka/issues/5456; with a coordinator
dropped from metadata, which a broker restart or kill does on a cluster:
https://github.com/confluentinc/librdkafka/issues/5511) is cut by the watchdog this long after
that timeout, not after the general budget (transaction timeout + margin, ~45 s)."""
SEND_OFFSETS_TIMEOUT_S = 3.0
"""The timeout of a call with its own budget (send_offsets): a few round trips (under a second
at 200 ms each); a slower one is retried within the step's deadline. Short, so the hang above
is cut 5 s after the call began and a restarted engine decides again about 10 s after a broker
restart (with 10 + 5 s, a rolling restart stalled decisions for 24.7 s)."""


class ErrorClass(StrEnum):
    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    FATAL = "fatal"
    DEADLINE = "deadline"


def classify(error: KafkaError, *, deadline_passed: bool) -> ErrorClass:
    """librdkafka's classes in its documented precedence; unclassified counts as fatal."""
    if error.fatal() or error.code() in (KafkaError._FENCED, KafkaError._FATAL):
        return ErrorClass.FATAL
    if error.txn_requires_abort():
        return ErrorClass.ABORTABLE
    if error.retriable():
        return ErrorClass.DEADLINE if deadline_passed else ErrorClass.RETRIABLE
    return ErrorClass.FATAL


class Transactions:
    """One transactional producer: its classified calls and the commits alive on it."""

    def __init__(self, producer: ProducerLike, watchdog: Watchdog, budget_s: float) -> None:
        self.producer = producer
        self.watchdog = watchdog
        self.budget_s = budget_s  # the watchdog's bound on any one call
        self.failed = False  # fatal: the producer is dropped, never flushed
        self.partitions: tuple[int, ...] = ()  # for the watchdog's report
        self.current: Commit | None = None  # outputs go here (NEW or OPEN)
        self.committing: Commit | None = None  # steps 4-5 in the worker
        self._numbered = 0

    # The commits
    def for_outputs(self) -> Commit:
        """The commit the next output goes into: begun at once if the producer is free,
        else (a commit in flight) a NEW one holding its outputs until that one returned."""
        commit = self.current
        if commit is None or commit.done:
            self._numbered += 1
            commit = self.current = Commit(self, self._numbered)
        if commit.status is CommitStatus.NEW and self.committing is None:
            commit.begin()
        return commit

    @property
    def open(self) -> bool:
        """A Kafka transaction is open for outputs (step 1 done, step 3 not yet)."""
        return self.current is not None and self.current.open

    @property
    def in_flight(self) -> bool:
        return self.committing is not None

    def worker_busy(self) -> bool:
        """A commit is in flight and its worker has not returned yet."""
        return self.committing is not None and not self.committing.worker_done()

    def hand_to_worker(self, commit: Commit) -> None:
        """Steps 4-5 of `commit` (sealed) in its worker; the next outputs go to a new one."""
        commit.start_worker()
        self.committing, self.current = commit, None

    def returned(self) -> Commit:
        """The commit in flight, its worker joined: raises what steps 4-5 raised. An
        abortable failure leaves it in flight for `abort_all`; any other leaves none."""
        commit = self.committing
        assert commit is not None
        try:
            commit.join()
        except AbortableError:
            raise
        except BaseException:
            self.committing = None
            commit.fail()
            raise
        self.committing = None
        return commit

    def abandon(self) -> None:
        """The loop leaves with an exception: the commit in flight ends as a crash would."""
        commit, self.committing = self.committing, None
        if commit is not None:
            commit.abandon()

    def abort_all(self) -> None:
        """Abort the Kafka transaction (whichever commit holds it) and drop held outputs."""
        for commit in (self.committing, self.current):
            if commit is not None and not commit.done:
                commit.abort()
        self.committing = self.current = None

    def drop(self) -> None:
        """Fatal: every commit goes with the producer, which is never flushed."""
        for commit in (self.committing, self.current):
            if commit is not None and not commit.done and commit.status is not CommitStatus.NEW:
                self.failed = True
            if commit is not None:
                commit.fail()
        self.committing = self.current = None

    # The calls (`Calls` in commit.py)
    def call(
        self,
        step: str,
        fn: Callable[[float], T],
        deadline: float | None = None,
        *,
        own_budget: bool = False,
    ) -> T:
        """The one classified call: `fn(timeout_s)` under a watchdog guard, retried while
        retriable and before `deadline`. With `own_budget` the call's timeout is
        `SEND_OFFSETS_TIMEOUT_S` and the guard's budget that plus `OWN_BUDGET_MARGIN_S`, not
        the general `budget_s`."""
        deadline = deadline or time.monotonic() + STEP_DEADLINE_S
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            call_timeout_s = SEND_OFFSETS_TIMEOUT_S if own_budget else CALL_TIMEOUT_S
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
                self.failed = True
                raise RejoinError(f"step {step} ({kind}): {error}") from exc

    def init(self) -> None:
        self.call("init_transactions", lambda t: self.producer.init_transactions(t))

    def begin_transaction(self) -> None:
        self.producer.begin_transaction()

    def flush(self, timeout_s: float) -> None:
        remaining = self.producer.flush(timeout_s)
        if remaining:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"{remaining} undelivered", retriable=True)
            )

    def send_offsets(self, offsets: list[TopicPartition], metadata: Any, timeout_s: float) -> None:
        self.producer.send_offsets_to_transaction(offsets, metadata, timeout_s)

    def commit_transaction(self, timeout_s: float) -> None:
        self.producer.commit_transaction(timeout_s)

    def abort_transaction(self, timeout_s: float) -> None:
        self.producer.abort_transaction(timeout_s)

    def produce_now(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        step: str,
        optional: bool,
        extra: dict[str, Any],
    ) -> bool:
        """Queue one record; a full queue waits for deliveries. produce() itself never
        blocks: the caller guards a whole batch of them. An `optional` record (a dead letter)
        refused for itself, neither fatal nor abortable (e.g. too large), is logged and
        skipped: returns False."""
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, **extra)
                return True
            except BufferError:
                self.call(f"{step} produce (queue full)", lambda _: self.producer.poll(0.05))
            except KafkaException as exc:
                return self._refused(exc, topic, value, step, optional)

    def produce_all(
        self, topic: str, records: Sequence[Record], step: str, partition: int, last: Any
    ) -> None:
        """`produce_now` of each (key, value, headers) record, none optional, `last` the last
        one's delivery callback, in one loop over the producer (a call frame and a keyword
        dict less per record than `produce_now`; this runs once per input)."""
        produce, end = self.producer.produce, len(records) - 1
        for n, (key, value, headers) in enumerate(records):
            callback = last if n == end else None
            try:
                produce(
                    topic,
                    key=key,
                    value=value,
                    partition=partition,
                    headers=headers,
                    on_delivery=callback,
                )
            except BufferError:  # produce_now waits for deliveries and tries again
                extra = {"partition": partition, "headers": headers, "on_delivery": callback}
                self.call(f"{step} produce (queue full)", lambda _: self.producer.poll(0.05))
                self.produce_now(topic, key, value, step, False, extra)
            except KafkaException as exc:
                self._refused(exc, topic, value, step, optional=False)

    def _refused(
        self, exc: KafkaException, topic: str, value: bytes, step: str, optional: bool
    ) -> bool:
        """A record the producer refused: abortable and fatal errors raise; an `optional` one
        refused for itself is logged and skipped (False)."""
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
        self.failed = True
        raise RejoinError(f"step {step}: {error}") from exc

    def close(self, timeout_s: float = 5.0) -> None:
        """Best effort at shutdown: a fenced or failed producer is dropped, never flushed
        (flushing a fenced producer raises, which would turn a rejoin into an exit)."""
        if self.failed:
            return
        try:
            with self.watchdog.guard("close producer", self.budget_s, self.partitions):
                self.producer.flush(timeout_s)
        except (KafkaException, RuntimeError) as exc:
            log.warning("flushing the producer at close failed (dropped): %s", exc)
