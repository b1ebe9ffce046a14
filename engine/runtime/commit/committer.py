"""Steps 3-6 as the loop and the rebalance callbacks run them on one pair of clients: commit
now (waiting), hand steps 4-5 to the worker and finish them later (overlap), abort and rewind,
or drop everything (fatal). The steps themselves are `Commit`'s methods (commit/commit.py);
this file adds what surrounds them: guards, timers, metrics and what the tasks do after."""

from __future__ import annotations

import logging
import time

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from engine.runtime.clients import ConsumerLike
from engine.runtime.commit.commit import Commit
from engine.runtime.commit.errors import AbortableError, RejoinError
from engine.runtime.commit.protocol import Step
from engine.runtime.commit.transaction import CALL_TIMEOUT_S, Transactions
from engine.runtime.parts import Parts
from engine.runtime.tasks.corrupt import StoreCorruptedError, detecting

log = logging.getLogger("reconciler.engine")


class Committer:
    def __init__(self, parts: Parts, consumer: ConsumerLike, txns: Transactions) -> None:
        self.parts, self.consumer, self.txns = parts, consumer, txns
        self.steps = parts.steps

    def commit(self) -> None:
        """Steps 3-6 for every ready task, waiting for the broker."""
        commit = self.txns.current
        if commit is None or not commit.open:
            if self.parts.flags.stopping:  # nothing of step 6 may wait in an open SQLite batch
                self.sync_stores()
            return
        try:
            self._changelog(commit)  # step 3
            commit.commit_steps()  # steps 4-5
        except AbortableError as exc:
            self.abort(str(exc))
            return
        self._committed(commit)  # step 6

    def start(self) -> None:
        """Step 3, then steps 4-5 in the commit's worker thread (COMMIT_PROTOCOL.md,
        "Overlap"): the tasks seal what this transaction wrote, so that step 6 persists
        exactly that, whatever is folded ahead meanwhile into the next commit."""
        commit = self.txns.current
        assert commit is not None
        try:
            self._changelog(commit)
        except AbortableError as exc:
            self.abort(str(exc))
            return
        if self.parts.trace is not None:
            self.parts.trace.seal()
        self.txns.hand_to_worker(commit)

    def finish(self) -> None:
        """Steps 4-5 returned: step 6 of the sealed writes, then the next commit begins with
        its held outputs. If they failed (abortable), what was folded ahead is dropped with
        them (`abort`: discard, rewind); fatal errors propagate (rejoin)."""
        try:
            commit = self.txns.returned()
        except AbortableError as exc:
            self.abort(str(exc))
            return
        self._committed(commit)
        after = self.txns.current
        if after is None or not after.holds_outputs:
            return
        try:  # step 2's records, produced now: under step 2's guard
            with self.steps.guard(f"{Step.FOLD} fold"):
                after.begin()
        except AbortableError as exc:
            self.abort(str(exc))

    def settle(self) -> None:
        """Called first by every rebalance callback: consume() runs them, and the loop calls
        consume() while a commit is in flight. That commit finishes here (steps 4-5 awaited,
        step 6, the held outputs into the next transaction), so a callback sees at most one
        open transaction, as without the overlap."""
        if not self.txns.in_flight:
            return
        try:
            self.finish()
        except (RejoinError, KafkaException) as exc:  # KafkaException: the abort's rewind
            log.error("the commit in flight failed in a rebalance, rejoining: %s", exc)
            self.parts.flags.rejoin_requested = True
        except StoreCorruptedError as exc:  # committed; a rebuild inside a callback: rejoin
            log.error("step 6 of the commit in flight in a rebalance, rejoining: %s", exc)
            self.parts.flags.rejoin_requested = True

    def _changelog(self, commit: Commit) -> None:
        """Step 3 for every ready task: one changelog record per session changed."""
        self.steps.mark("commit")
        owned = self.parts.owned
        with self.steps.guard(f"{Step.CHANGELOG} produce"):
            commit.write_changelog(
                self.parts.topics.changelog,
                list(owned.tasks.values()),
                owned.positions(),
                self.consumer.consumer_group_metadata,
            )

    def _committed(self, commit: Commit) -> None:
        """After step 5: metrics, then step 6 (of the sealed writes only)."""
        self._observe(commit)
        self.parts.flags.committed_since_rejoin = True
        parts = self.parts
        with self.steps.stage("persist"), self.steps.guard(Step.PERSIST_LOCALLY):
            commit.persist()  # step 6
            if parts.flags.stopping and not commit.overlapped:  # the last commit: sync
                self.sync_stores()
            else:  # a partition without writes in this commit may hold a batch past its age
                now = time.monotonic()
                for task in parts.owned.tasks.values():
                    with detecting(task.partition):
                        task.store.sync_if_due(now)
        if parts.collector is not None:  # freeze what this commit left alive (collector.py)
            parts.collector.committed(time.monotonic())
        parts.metrics.sessions_stale = True

    def _observe(self, commit: Commit) -> None:
        metrics, trace = self.parts.metrics, self.parts.trace
        # Both clocks read together: the trace converts the worker's monotonic times to wall
        # time by their difference, and any work between the two reads would shift them back
        # before the commit began (a trace line out of order under load).
        now_ms, mono, done = time.time() * 1000, time.monotonic(), commit.committed_at
        stage = metrics.stage_seconds
        stage.labels(stage="produce").observe(commit.flushed_at - commit.sealed_at)  # 3, 4
        stage.labels(stage="commit").observe(done - commit.flushed_at)  # offsets, commit
        metrics.commit_seconds.observe(done - commit.sealed_at)
        metrics.observe_decision_latencies(now_ms, commit.event_times)
        if trace is not None:  # the worker's times, not when the loop saw them
            flushed_ms, done_ms = (now_ms - (mono - t) * 1000 for t in (commit.flushed_at, done))
            trace.committed(flushed_ms, done_ms, sealed=commit.overlapped)

    def sync_stores(self) -> None:
        with self.steps.guard(f"{Step.PERSIST_LOCALLY} sync"):
            for task in self.parts.owned.tasks.values():
                with detecting(task.partition):
                    task.store.sync()

    def abort(self, why: str) -> None:
        """Abortable error: abort, drop write caches, rewind inputs to committed offsets."""
        parts = self.parts
        log.warning("aborting the transaction: %s", why)
        parts.metrics.aborts.labels(kind="abortable").inc()
        self.txns.abort_all()
        if parts.trace is not None:
            parts.trace.aborted()
        parts.owned.discard_uncommitted()
        held = parts.order.drop(list(parts.owned.tasks))  # read again from the committed offsets
        self._rewind(list(parts.owned.tasks))
        if held:
            self.consumer.resume([TopicPartition(t, p) for t, p in held])

    def _rewind(self, partitions: list[int]) -> None:
        owned = self.parts.owned
        wanted = owned.wanted(partitions)
        if not wanted:
            return
        with self.steps.guard("rewind committed", partitions=partitions):
            committed = self.consumer.committed(wanted, timeout=CALL_TIMEOUT_S)
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        owned.start_at(committed)

    def drop_all(self) -> None:
        """Fatal: every task and buffered record goes, the commits with their producer."""
        parts = self.parts
        parts.owned.drop_all()
        parts.order.clear()
        self.txns.drop()  # dropped with its clients, never flushed
        if parts.trace is not None:
            parts.trace.aborted()
        parts.metrics.set_ready(False)
