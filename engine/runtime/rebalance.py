"""Rebalance callbacks (COMMIT_PROTOCOL.md A0-A1, revoke, lost): librdkafka runs them inside
consume(), so they only commit or abort the open transaction and hand tasks in or out; the new
tasks restore in the loop (A2, restorer.py), not here.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaException, TopicPartition

from engine.runtime.commit.calls import STEP_DEADLINE_S
from engine.runtime.commit.committer import Committer
from engine.runtime.commit.errors import RejoinError
from engine.runtime.commit.protocol import Step
from engine.runtime.parts import Parts
from engine.runtime.restorer import Restorer
from engine.runtime.tasks.corrupt import StoreCorruptedError, wipe_files

log = logging.getLogger("reconciler.engine")
FENCE_S = 10.0
"""Step A0's one deadline for all its calls (lookups and every fence): the fence only saves
time, so it must not cost much when the broker is slow (the previous owner's transaction then
times out as before); 10 s: the default transaction timeout it would otherwise wait out."""


class Rebalance:
    """Tasks come and go with the group's assignment: librdkafka's callbacks for one pair of
    clients. Each first settles the commit in flight (COMMIT_PROTOCOL.md, "Overlap")."""

    def __init__(self, parts: Parts, committer: Committer, restorer: Restorer) -> None:
        self.parts, self.committer, self.restorer = parts, committer, restorer
        self.settings, self.metrics, self.owned = parts.settings, parts.metrics, parts.owned
        self.watchdog, self.budget_s = parts.steps.watchdog, parts.steps.budget_s

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.parts.joined.note(consumer)  # this join's member id (the duplicate check's)
        self.committer.settle()
        self.metrics.rebalances.labels(kind="assign").inc()
        if (
            self.parts.flags.rejoin_requested
        ):  # that commit failed: these clients go, restore nothing
            log.warning("partitions assigned to clients that are rejoining: not restored")
            return
        self.metrics.set_ready(False)
        self._assign_paused(consumer, partitions)
        complete, _ = self.owned.add(partitions)
        if not complete:
            self.metrics.set_ready(True)
            return
        self._fence_previous_owners(complete)
        # A1: committed offsets are fetched with require_stable under read_committed, which
        # waits for a previous owner's pending transaction to finish.
        settle_s = min(self.settings.transaction_timeout_ms / 1000 + 5, STEP_DEADLINE_S)
        asked = time.monotonic()
        with self.watchdog.guard(Step.SETTLE_PREVIOUS_OWNER, self.budget_s + settle_s, complete):
            committed = consumer.committed(self.owned.wanted(complete), timeout=settle_s)
        started = time.monotonic()
        log.info(
            "step %s: partitions %s assigned, committed offsets read in %.2fs",
            Step.SETTLE_PREVIOUS_OWNER,
            complete,
            started - asked,
        )
        unread = [f"{tp.topic}/{tp.partition}: {tp.error}" for tp in committed if tp.error]
        if unread:  # read as "nothing committed", it would fold these partitions from 0 again
            raise RejoinError(
                f"step A1: committed offsets not read: {', '.join(unread)}; if this repeats,"
                " check the group's and the input topics' Read ACLs and the brokers' health"
            )
        self.owned.start_at(committed)
        self._name_owner(consumer, committed, complete)
        # A2 runs in the loop (restorer.py): the tasks restore there, their inputs paused.
        self.restorer.assign(complete)
        self.metrics.set_ready(True)

    @staticmethod
    def _assign_paused(consumer: Any, partitions: list[TopicPartition]) -> None:
        """The assignment is made here, then paused: no input is fetched before its task is
        RUNNING (the restorer resumes it at A3; an incomplete task's stay paused). Not left to
        the client after this callback: until then librdkafka has no local object for the
        topic of a partition a consumer never had (its first assignment) and skips that
        partition's pause, and the Python client drops the per-partition error; the inputs
        would be fetched while their tasks restore. The strategy is eager (clients.py,
        "range"): `partitions` is the whole assignment."""
        consumer.assign(partitions)
        consumer.pause([TopicPartition(tp.topic, tp.partition) for tp in partitions])

    def _fence_previous_owners(self, partitions: list[int]) -> None:
        """A0 (fencing.py): a dead previous owner's open transaction ends now, not at its
        timeout. Best effort: whatever it does not end, A1 and read_committed still wait for."""
        asked = time.monotonic()
        with self.watchdog.guard(Step.FENCE_PREVIOUS_OWNER, self.budget_s, partitions):
            report = self.parts.factory.fence(self.settings, self.owned.wanted(partitions), FENCE_S)
        if report.fenced or report.failed or report.skipped:
            log.info(
                "step %s: partitions %s: fenced %s%s%s in %.2fs (lookup %.2fs)",
                Step.FENCE_PREVIOUS_OWNER,
                partitions,
                list(report.fenced),
                f", not fenced {list(report.failed)}" if report.failed else "",
                f", {report.skipped}" if report.skipped else "",
                time.monotonic() - asked,
                report.lookup_s,
            )

    def _name_owner(self, consumer: Any, committed: list[TopicPartition], tasks: list[int]) -> None:
        """A0's other half (COMMIT_PROTOCOL.md, "The owner mark"): before its first transaction
        on these partitions, this instance's id goes into their committed offsets' metadata,
        the offsets unchanged, so that if it dies inside that transaction the next owner's A0
        finds it. A plain, synchronous commit: it is never pending, and it has landed before
        any transaction of ours begins. Any failure rejoins (the same generation must not
        see a mark land after one of our transactional commits), a partition's error in the
        returned list included: the call reports those without raising."""
        own = self.owned.metadata
        marks = [
            TopicPartition(tp.topic, tp.partition, max(tp.offset, 0), metadata=own)
            for tp in committed
            if tp.metadata != own and (tp.offset >= 0 or tp.offset == OFFSET_INVALID)
        ]
        if own is None or not marks:
            return
        step = f"{Step.FENCE_PREVIOUS_OWNER} owner mark"
        try:
            with self.watchdog.guard(step, self.budget_s, tasks):
                written = consumer.commit(offsets=marks, asynchronous=False)
        except KafkaException as exc:
            raise RejoinError(f"step {step}: partitions {tasks} not marked: {exc}") from exc
        failed = [f"{tp.topic}/{tp.partition}: {tp.error}" for tp in written if tp.error]
        if failed:
            raise RejoinError(f"step {step}: partitions not marked: {', '.join(failed)}")

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.committer.settle()
        self.metrics.rebalances.labels(kind="revoke").inc()
        unreadable: dict[int, str] = {}
        if self.committer.txns.open:
            try:
                self.committer.commit()  # a transaction spans all tasks: commit all of them
            except RejoinError as exc:
                log.error("commit on revoke failed, rejoining with new clients: %s", exc)
                self.committer.drop_all()
                self.parts.flags.rejoin_requested = True
            except StoreCorruptedError as exc:  # committed: only step 6 of these failed
                unreadable = exc.causes
        self.restorer.release(tp.partition for tp in partitions)
        self.owned.release(partitions)
        for p, cause in unreadable.items():  # closed now: the next owner restores from the start
            log.error("partition %d: local store unreadable at revoke (%s): wiped", p, cause)
            wipe_files(self.parts.state_root / f"p{p}.sqlite")
        self._resume_held(consumer, self.parts.order.drop({tp.partition for tp in partitions}))
        if not self.owned.tasks and not self.restorer.restores:
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

    def on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.committer.settle()
        self.metrics.rebalances.labels(kind="lost").inc()
        log.warning("assignment lost: aborting without committing, then rejoining")
        # Observed after a broker restart: the same producer's next send_offsets_to_transaction
        # blocked past its timeout. New clients after a lost assignment avoid that state.
        self.parts.flags.rejoin_requested = True
        if self.committer.txns.open:
            try:
                self.committer.abort("assignment lost")
            except (RejoinError, KafkaException) as exc:
                log.warning("abort after a lost assignment failed (rejoining anyway): %s", exc)
        self.restorer.release(tp.partition for tp in partitions)
        self.owned.release(partitions)
        self._resume_held(consumer, self.parts.order.drop({tp.partition for tp in partitions}))
