"""The loop over one pair of clients (COMMIT_PROTOCOL.md, steps 1-6): consume, fold, commit,
and, while a commit's steps 4-5 run in its worker, fold ahead into the next one."""

from __future__ import annotations

import math
import sqlite3
import time

from confluent_kafka import Message

from engine.runtime.clients import ConsumerLike
from engine.runtime.commit.committer import Committer
from engine.runtime.commit.errors import AbortableError
from engine.runtime.commit.protocol import Step
from engine.runtime.commit.transaction import Transactions
from engine.runtime.fold_step import FoldStep
from engine.runtime.intake.intake import Intake
from engine.runtime.intake.ordering import Buffered
from engine.runtime.parts import Consumed, Parts
from engine.runtime.rebalance import Rebalance
from engine.runtime.restorer import Restorer
from engine.runtime.tasks.corrupt import StoreCorruptedError, reraise
from engine.runtime.tasks.state import TaskState

FOLD_AHEAD_CHUNK = 64  # records folded between two looks at whether the commit returned
RESTORE_WAIT_S = 0.02  # a restore step waits this long at most for changelog records


class Loop:
    """Every input folded once, committed exactly once, on one consumer and one producer."""

    def __init__(self, parts: Parts, consumer: ConsumerLike, txns: Transactions) -> None:
        self.parts, self.txns = parts, txns
        self.steps = parts.steps
        self.intake = Intake(parts, consumer)
        self.fold_step = FoldStep(parts)
        self.committer = Committer(parts, consumer, txns)
        self.restorer = Restorer(parts, consumer)
        self.rebalance = Rebalance(parts, self.committer, self.restorer)
        s = parts.settings
        self.interval_s = s.commit_interval_ms / 1000
        # An idle consume() waits for the first record at most this long: well under the
        # commit interval, or a quiet topic adds the whole wait to every decision's latency.
        self.wait_s = min(0.1, self.interval_s / 2)
        self.last_commit = time.monotonic()
        self.more = False  # the last batch stopped at its bound: buffered records are ready
        self.drained = True  # the last consume emptied librdkafka's queue

    def run(self) -> None:
        """Until stop(); an exception leaves with the commit in flight ending as a crash."""
        try:
            while self.iterate():
                self.steps.progress()
        finally:
            if self.txns.in_flight:
                self.txns.abandon()

    def iterate(self) -> bool:
        """One iteration (False once stopping): restore a bounded piece (A2), consume and
        fold (1-2), then commit (3-6). A task whose store cannot be read is rebuilt alone."""
        try:
            if self.txns.in_flight:  # steps 4-5 run in the worker: fold ahead, then step 6
                self.fold_ahead()
                self.last_commit, self.more = time.monotonic(), True
                return True
            if self.parts.flags.stopping:
                return False
            self.restorer.step(0.0 if self.more else RESTORE_WAIT_S)
            messages, consumed = self.poll()
            try:
                with self.steps.stage("fold", observe=lambda: bool(messages) or self.txns.open):
                    self.fold(messages, consumed)
            except AbortableError as exc:
                self.committer.abort(str(exc))
                return True
            self.intake.apply_flow()
            self.observe()
            if self.txns.open and self.commit_due():
                self.commit()
            elif not self.txns.open:
                self.last_commit = time.monotonic()
                if not messages:  # idle: what step 6 wrote lazily goes to disk now
                    self.committer.sync_stores()
        except StoreCorruptedError as exc:
            self.recover(exc.causes)
        self.parts.trimmer.maybe_trim(time.monotonic())
        return True

    def recover(self, causes: dict[int, str]) -> None:
        """The local stores of `causes` cannot be read (COMMIT_PROTOCOL.md, "A corrupted
        store"): the commit in flight finishes (its step 6 may find more), those tasks leave
        the ready tasks, the open transaction is aborted (every other task rewinds to its
        committed offsets and folds again: exactly once), and each is wiped and restored."""
        causes = dict(causes)
        while self.txns.in_flight:
            try:
                self.committer.finish()
            except StoreCorruptedError as more:
                causes.update(more.causes)
        owned = self.parts.owned
        tasks = [owned.tasks.pop(p) for p in sorted(causes) if p in owned.tasks]
        for task in tasks:
            task.move_to(TaskState.CORRUPTED)  # drops what it folded; reads nothing
        current = self.txns.current
        if current is not None and not current.done:
            self.committer.abort(f"local store of partitions {sorted(causes)} unreadable")
        for task in tasks:
            self.restorer.rebuild(task, causes[task.partition])

    def poll(self) -> tuple[list[Message], float]:
        """Consume (under the `poll` guard, where the rebalance callbacks run)."""
        started = time.monotonic()
        self.steps.mark("poll")
        with self.steps.guard("poll"):
            # while tasks restore, the restore step's read is the iteration's wait
            busy = self.more or bool(self.restorer.restores)
            messages, self.drained = self.intake.consume(0.0 if busy else self.wait_s)
        consumed = time.monotonic()
        self.steps.mark("consumed")
        self.parts.metrics.stage_seconds.labels(stage="consume_wait").observe(consumed - started)
        self.intake.raise_if_rejoining()
        return messages, consumed

    def observe(self) -> None:
        """Consumer lag and sessions by health, each at most as often as its interval."""
        metrics, tasks = self.parts.metrics, self.parts.owned.tasks
        metrics.maybe_observe_lag(self.intake.consumer, tasks, self.parts.topics.inputs)
        metrics.maybe_observe_sessions(tasks.values())

    def fold(self, messages: list[Message], consumed: float) -> None:
        """Step 2 for what the order buffer releases, until the commit interval is reached.
        One guard for the batch, not one per produce() (~6 us each): step 2 blocks only in a
        store read or a full producer queue, which has its own guard."""
        try:
            with self.steps.guard(f"{Step.FOLD} fold"):
                self.intake.take(messages)
                batch = self.intake.release(consumed, self.drained, self.intake.batch)
                self.prefetch(batch)
                self.steps.mark("released")
                self.more = len(batch) >= self.intake.batch
                self.more = self.fold_until_due(batch) or self.more
                self.drained = self.drained and not self.more
        finally:
            self.parts.metrics.flush()

    def fold_until_due(self, batch: list[Buffered[Consumed]]) -> bool:
        """Fold `batch`; once the open transaction reaches the commit interval, the rest waits
        in order (no batch of slow inputs may hold a transaction open toward its timeout, and
        only a commit or an abort closes it): True when some were put back."""
        due_at = self._due_at()
        partition, n = -1, 0
        try:
            for n, record in enumerate(batch):
                if time.monotonic() >= due_at:
                    self.intake.put_back(batch[n:])
                    return True
                partition = record.partition
                self.fold_step.handle(self.txns, record)
                if due_at == math.inf:
                    due_at = self._due_at()
        except sqlite3.DatabaseError as exc:  # a store read in step 2: whose, if corrupted
            self.intake.put_back(batch[n:])
            reraise(partition, exc)
        return False

    def fold_each(self, batch: list[Buffered[Consumed]]) -> None:
        partition, folded = -1, 0
        try:
            for record in batch:
                partition = record.partition
                self.fold_step.handle(self.txns, record)
                folded += 1
        except sqlite3.DatabaseError as exc:  # a store read in step 2: whose, if corrupted
            self.intake.put_back(batch[folded:])
            reraise(partition, exc)

    def prefetch(self, batch: list[Buffered[Consumed]]) -> None:
        """Step 2's store reads for a batch. A batch an unreadable store interrupts (here or
        in a fold) waits again in the order buffer: with no transaction open there is no
        abort to rewind the other tasks, whose records it holds too; the corrupted task's
        are dropped by its rebuild."""
        try:
            self.intake.prefetch(batch)
        except sqlite3.DatabaseError:
            self.intake.put_back(batch)
            raise

    def _due_at(self) -> float:
        commit = self.txns.current
        return commit.started + self.interval_s if commit is not None and commit.open else math.inf

    def commit_due(self) -> bool:
        """As soon as the consumed records are folded (librdkafka's queue was drained: nothing
        waits behind them), else at the interval or the size bound."""
        s = self.parts.settings
        due = (time.monotonic() - self.last_commit) * 1000 >= s.commit_interval_ms
        full = self.parts.owned.folded() >= s.commit_max_events
        return self.drained or due or full

    def commit(self) -> None:
        """Overlapped only when records wait behind this commit (a backlog): drained, nothing
        is left to fold ahead, and a second thread would only add GIL hand-offs and shorter,
        more frequent commits (COMMIT_PROTOCOL.md, "Overlap")."""
        s = self.parts.settings
        if s.commit_overlap and not self.drained and not self.parts.flags.stopping:
            self.committer.start()
        else:
            self.committer.commit()
        self.last_commit = time.monotonic()

    def fold_ahead(self) -> None:
        """While steps 4-5 run in the worker: fold what the order buffer releases, consuming
        more (never waiting) when it releases nothing, their outputs held by the next commit;
        then wait for the worker and finish the commit. A rebalance callback that runs inside
        consume() finishes the commit first (`Committer.settle`). The next transaction's size
        bound also bounds what is held in memory meanwhile (a commit retried toward its 40 s
        deadline must not let the loop read on unbounded)."""
        started, folded = time.monotonic(), 0
        room = self.parts.settings.commit_max_events
        intake, steps = self.intake, self.steps
        try:
            while self.txns.worker_busy() and folded < room:
                batch = intake.release(time.monotonic(), self.drained, FOLD_AHEAD_CHUNK)
                if batch:
                    with steps.guard(f"{Step.FOLD} fold ahead"):
                        self.prefetch(batch)
                        steps.mark("released")
                        self.fold_each(batch)
                    folded += len(batch)
                elif not self.consume_ahead():
                    break
        finally:
            self.parts.metrics.flush()
        waiting = time.monotonic()
        if folded:
            self.parts.metrics.stage_seconds.labels(stage="fold_ahead").observe(waiting - started)
        with steps.stage("commit_wait"):
            if self.txns.in_flight:
                self.committer.finish()
        self.intake.apply_flow()

    def consume_ahead(self) -> bool:
        """Take what librdkafka has queued without waiting; False when there was nothing or
        a rebalance callback finished the commit meanwhile (consumed is taken anyway)."""
        self.steps.mark("poll")
        with self.steps.guard("poll"):
            messages = self.intake.consume_now()
        self.steps.mark("consumed")
        self.intake.raise_if_rejoining()
        if not messages:
            return False
        self.drained = len(messages) < self.intake.batch
        with self.steps.guard(f"{Step.FOLD} fold ahead"):
            self.intake.take(messages)
        self.intake.apply_flow()
        return self.txns.in_flight
