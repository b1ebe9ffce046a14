"""One transaction, from its first output to its local persist: `Commit`.

A `Commit` owns everything one Kafka transaction has: the outputs held until it begins, the
tasks whose writes it sealed, the offsets it sends, the event times of the inputs it answers
(decision latency), the worker that runs steps 4-5 when it overlaps the next one, and its
status (status.py: every move is checked against the table of legal transitions). Its methods
are the steps of COMMIT_PROTOCOL.md, one each:

    begin (1)  produce (2)  write_changelog (3)  send_offsets (4)  commit (5)  persist (6)

plus `abort` and `fail`. The overlap is one `SEALED`..`COMMITTED` commit whose steps 4-5 run in
`start_worker`'s thread and one `NEW`/`OPEN` commit the loop folds into meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import KafkaError, Message, TopicPartition

from engine.runtime.commit.calls import STEP_DEADLINE_S, Calls, Held, Record
from engine.runtime.commit.errors import AbortableError, RejoinError
from engine.runtime.commit.protocol import Step
from engine.runtime.commit.status import TERMINAL, CommitStatus, check
from engine.runtime.tasks.corrupt import StoreCorruptedError, detecting
from engine.runtime.tasks.generation import StateEncodeError
from engine.runtime.tasks.headers import pending_header
from engine.runtime.tasks.task import PartitionTask

log = logging.getLogger("reconciler.engine")
T = TypeVar("T")
S = CommitStatus


class Commit:
    """One transaction's state and steps; see the module docstring."""

    def __init__(self, calls: Calls, number: int) -> None:
        self.calls = calls
        self.number = number
        self.status = S.NEW
        self.started = 0.0  # step 1 (the commit interval counts from here)
        self.sealed_at = 0.0  # step 3 began
        self.flushed_at = 0.0  # step 4's flush returned
        self.committed_at = 0.0  # step 5 returned
        self.event_times: list[int] = []  # of the inputs it answers (decision latency)
        self.tasks: Sequence[PartitionTask] = ()  # whose writes step 3 sealed
        self.offsets: list[TopicPartition] = []  # taken at step 3, sent at step 4
        self.overlapped = False  # steps 4-5 ran in the worker while the loop folded ahead
        self._metadata: Any = None
        self._held: list[Held] = []
        self._worker: threading.Thread | None = None
        self._failure: BaseException | None = None

    def __repr__(self) -> str:
        return f"Commit(#{self.number}, {self.status})"

    def _move(self, wanted: CommitStatus) -> None:
        self.status = check(self.number, self.status, wanted)

    @property
    def open(self) -> bool:
        return self.status is S.OPEN

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    @property
    def holds_outputs(self) -> bool:
        """Outputs were produced before step 1: `begin` puts them into the transaction."""
        return bool(self._held)

    # Step 1
    def begin(self) -> int:
        """Step 1: open the Kafka transaction; the outputs held until now go into it, in the
        order they were produced (a session's decisions stay in order). Their count."""
        self._move(S.OPEN)
        self._call(Step.BEGIN, lambda _: self.calls.begin_transaction())
        self.started = time.monotonic()
        return self._produce_held()

    def _produce_held(self) -> int:
        held, self._held = self._held, []
        for topic, key, value, step, optional, outcome, extra in held:
            self.produce(topic, key, value, step, optional=optional, outcome=outcome, **extra)
        return len(held)

    # Step 2
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
        """Step 2 (and 3): queue one output in the open transaction; before step 1 it is held
        (the previous commit may still own the producer's one transaction): True. `outcome` is
        told the real result once produced (never for a dropped held output). An `optional`
        output (a dead letter) the producer refuses is logged and skipped: False."""
        if self.status is S.NEW:
            self._held.append((topic, key, value, step, optional, outcome, extra))
            return True
        if self.status is not S.OPEN:
            check(self.number, self.status, S.OPEN)  # raises: a produce into a closed commit
        try:
            delivered = self.calls.produce_now(topic, key, value, step, optional, extra)
        except RejoinError:
            self.fail()
            raise
        if outcome is not None:
            outcome(delivered)
        return delivered

    def produce_all(
        self, topic: str, batch: Sequence[Record], step: str, partition: int = -1, last: Any = None
    ) -> None:
        """`produce` of each (key, value, headers), none optional, `last` the delivery callback
        of the last one: once the commit is open, one call for all (this runs per input)."""
        if self.status is S.OPEN:
            try:
                return self.calls.produce_all(topic, batch, step, partition, last)
            except RejoinError:
                self.fail()
                raise
        for n, (key, value, headers) in enumerate(batch):
            extra = {"headers": headers} | ({"partition": partition} if partition >= 0 else {})
            callback = {"on_delivery": last} if last is not None and n == len(batch) - 1 else {}
            self.produce(topic, key, value, step, **extra, **callback)

    # Step 3
    def write_changelog(
        self,
        changelog: str,
        tasks: Sequence[PartitionTask],
        offsets: list[TopicPartition],
        group_metadata: Callable[[], Any],
    ) -> None:
        """Step 3: a changelog record per session this transaction changed; each task seals its
        write cache (what step 6 persists); step 4's offsets and group metadata are taken now."""
        check(self.number, self.status, S.SEALED)
        self.sealed_at = time.monotonic()
        for task in tasks:
            # Only the last record reports its offset, the highest: one partition is delivered
            # in order (a callback per record cost more than the record's produce).
            try:
                writes = task.changelog_records()
            except StateEncodeError as exc:
                # Aborted, its inputs are read again; the task then encodes that session at
                # every fold, so the one input that breaks its state is dead-lettered alone.
                raise AbortableError(f"step {Step.CHANGELOG}: {exc}") from exc
            records = [(w.session_id.encode(), w.state or b"", pending_header(w)) for w in writes]
            if records:
                delivered = _changelog_delivered(task)
                self.produce_all(changelog, records, Step.CHANGELOG, task.partition, delivered)
        for task in tasks:
            task.seal()
        self.tasks, self.offsets = tasks, offsets
        self._metadata = group_metadata() if offsets else None
        self._move(S.SEALED)

    # Step 4
    def send_offsets(self, deadline: float) -> None:
        """Step 4: flush, then send the offsets taken at step 3 into the transaction."""
        check(self.number, self.status, S.OFFSETS_SENT)
        self._call(f"{Step.OFFSETS} flush", self.calls.flush, deadline)
        self.flushed_at = time.monotonic()
        offsets, metadata = self.offsets, self._metadata
        if offsets:
            self._call(
                f"{Step.OFFSETS} send_offsets",
                lambda t: self.calls.send_offsets(offsets, metadata, t),
                deadline,
                own_budget=True,
            )
        self._move(S.OFFSETS_SENT)

    # Step 5
    def commit(self, deadline: float) -> None:
        """Step 5: commit the transaction (outputs, changelog and offsets, all or nothing)."""
        check(self.number, self.status, S.COMMITTED)
        self._call(Step.COMMIT, self.calls.commit_transaction, deadline)
        self.committed_at = time.monotonic()
        self._move(S.COMMITTED)

    def commit_steps(self) -> None:
        """Steps 4-5 under one deadline (`STEP_DEADLINE_S`)."""
        deadline = time.monotonic() + STEP_DEADLINE_S
        self.send_offsets(deadline)
        self.commit(deadline)

    # Steps 4-5 in the worker (COMMIT_PROTOCOL.md, "Overlap")
    def start_worker(self) -> None:
        """Steps 4-5 in a worker thread (librdkafka's calls release the GIL), so the loop can
        fold into the next commit meanwhile; nothing else may call the producer until `join`."""
        check(self.number, self.status, S.OFFSETS_SENT)
        assert self._worker is None, "one worker per commit"
        self.overlapped = True

        def run() -> None:
            try:
                self.commit_steps()
            except BaseException as exc:  # raised again by join, in the loop's thread
                self._failure = exc

        self._worker = threading.Thread(target=run, name="commit", daemon=True)
        self._worker.start()

    @property
    def in_flight(self) -> bool:
        return self._worker is not None

    def worker_done(self) -> bool:
        """The worker has returned (or none runs): `join` will not wait."""
        return self._worker is None or not self._worker.is_alive()

    def join(self) -> None:
        """Wait for the worker (bounded by its watchdog guards); raise what steps 4-5 raised."""
        worker = self._worker
        if worker is None:
            return
        worker.join()
        self._worker = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def abandon(self) -> None:
        """The loop is leaving with an exception: wait for the worker, keep nothing of it. The
        transaction is then whatever the worker left it (a crash's outcome)."""
        try:
            self.join()
        except BaseException as exc:
            log.warning("overlapped commit failed while the loop was leaving: %s", exc)
        if not self.done:
            self.status = S.FAILED

    # Step 6
    def persist(self) -> None:
        """Step 6: the sealed writes of each task go to its local store (to disk within the
        store's `sync_after_s`, or at sync/close), never a state folded ahead."""
        check(self.number, self.status, S.PERSISTED)
        unreadable: dict[int, str] = {}
        for task in self.tasks:
            try:
                with detecting(task.partition):
                    task.persist_sealed()
                    if not self.overlapped:
                        task.reload_watermark()
            except StoreCorruptedError as exc:  # the others persist: this one is rebuilt
                unreadable.update(exc.causes)
        self._move(S.PERSISTED)
        if unreadable:
            raise StoreCorruptedError(unreadable)

    # Failure paths
    def abort(self) -> None:
        """Abort the Kafka transaction if it began; held outputs are dropped (never visible)."""
        began = self.status is not S.NEW
        check(self.number, self.status, S.ABORTED)
        self._held = []
        if began:
            try:
                self._call("abort", self.calls.abort_transaction)
            except AbortableError as exc:  # an abort cannot itself require one: fatal
                self.fail()
                raise RejoinError(f"commit #{self.number}: abort failed: {exc}") from exc
        self._move(S.ABORTED)

    def fail(self) -> None:
        """Fatal: dropped with its producer, never flushed."""
        self._held = []
        if not self.done:
            self._move(S.FAILED)

    def _call(
        self, step: str, fn: Callable[[float], T], deadline: float | None = None, **kw: Any
    ) -> T:
        try:
            return self.calls.call(step, fn, deadline, **kw)
        except RejoinError:
            self.fail()  # fatal: this commit goes with its producer
            raise


def _changelog_delivered(task: PartitionTask) -> Any:
    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is None:
            task.changelog_high = max(task.changelog_high, message.offset() or 0)

    return delivered
