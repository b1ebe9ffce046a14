"""Step A2 in the loop: tasks restore their local stores from the changelog a bounded piece at
a time (`Restorer.step`, once per loop iteration), while the tasks that are RUNNING go on
deciding. A RESTORING task's input partitions stay paused, so none of its inputs is folded;
it becomes RUNNING (A3) at its changelog partition's end (the last stable offset), and its
inputs resume. A store that cannot be read is wiped and restored from the beginning, alone."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from engine.runtime.clients import ConsumerLike
from engine.runtime.commit.errors import RejoinError
from engine.runtime.commit.protocol import Step
from engine.runtime.commit.transaction import CALL_TIMEOUT_S
from engine.runtime.parts import Parts
from engine.runtime.tasks.changelog import ChangelogReader
from engine.runtime.tasks.corrupt import StoreCorruptedError, detecting, open_store, wipe_files
from engine.runtime.tasks.read_cache import ReadCache
from engine.runtime.tasks.restore import RESTORE_BATCH, _store_write
from engine.runtime.tasks.state import TaskState
from engine.runtime.tasks.store import NO_OFFSET, StoreWrite
from engine.runtime.tasks.task import PartitionTask

log = logging.getLogger("reconciler.engine")
RESTORE_STALL_S = 45.0
"""A task whose restore applies nothing for this long (an open transaction holding the
changelog's last stable offset back, a broker that does not answer) rejoins with new clients."""


@dataclass
class Restoring:
    task: PartitionTask
    rewind: bool  # it ran before: its inputs go back to their committed offsets at A3
    started: float = field(default_factory=time.monotonic)
    progressed: float = field(default_factory=time.monotonic)
    records: int = 0
    reading: bool = False  # added to the reader


class Restorer:
    """The RESTORING tasks of one pair of clients and the changelog reader they share (created
    when a task needs it, closed when none does)."""

    def __init__(self, parts: Parts, consumer: ConsumerLike) -> None:
        self.parts, self.consumer = parts, consumer
        self.owned, self.steps, self.metrics = parts.owned, parts.steps, parts.metrics
        self.restores: dict[int, Restoring] = {}
        self.reader: ChangelogReader | None = None

    def assign(self, partitions: list[int]) -> None:
        """A new assignment's tasks (after A1): CREATED with their stores open, RESTORING;
        their inputs were assigned paused (rebalance.py), before anything of them was fetched."""
        self.owned.fetched_unready.difference_update(partitions)
        for p in partitions:
            self.metrics.task_corrupted.labels(partition=str(p))  # from 0: alerts see the first
            store, wiped = open_store(self._path(p), self._cache_kib())
            task = PartitionTask(p, store, self._read_cache_bytes(), TaskState.CREATED)
            if wiped is not None:
                self._report(p, wiped, "wiped when opened")
            task.move_to(TaskState.RESTORING)
            self.restores[p] = Restoring(task, rewind=False)
        self._publish()

    def rebuild(self, task: PartitionTask, cause: str) -> None:
        """A task whose store cannot be read (already out of the ready tasks, any open
        transaction aborted): CORRUPTED, its store wiped, RESTORING from the beginning."""
        p = task.partition
        self._report(p, cause, "its task stops, the store is wiped and restored from the start")
        self.consumer.pause(self.owned.wanted([p]))
        self.parts.order.drop([p])  # buffered inputs are read again after the restore
        restoring = self.restores.pop(p, None)
        if restoring is not None and restoring.reading and self.reader is not None:
            self.reader.remove(p)
        # a task that never ran has fetched nothing: its inputs start at A1's offsets as they are
        rewind = restoring.rewind if restoring is not None else True
        if task.state is not TaskState.CORRUPTED:
            task.move_to(TaskState.CORRUPTED)
        task.store.abandon()  # its open batch is of committed transactions: in the changelog
        wipe_files(task.store.path)
        task.store, _ = open_store(task.store.path, self._cache_kib())
        task.committed = ReadCache(task.committed.max_bytes)  # read from the old store
        task.move_to(TaskState.RESTORING)
        self.restores[p] = Restoring(task, rewind)
        self._publish()

    def step(self, wait_s: float) -> None:
        """Bounded work: start the tasks added since, read at most RESTORE_BATCH changelog
        records (waiting at most `wait_s` when none is queued), apply them, and move the tasks
        whose changelog partition reached its end to RUNNING."""
        if not self.restores:
            return
        with self.steps.guard(Step.RESTORE_DELTA, partitions=list(self.restores)):
            for restoring in [r for r in self.restores.values() if not r.reading]:
                self._start(restoring)
            reading = any(r.reading for r in self.restores.values())
            messages = self._reader().read(RESTORE_BATCH, wait_s) if reading else []
            self._apply(messages)
        now = time.monotonic()
        for p, restoring in self.restores.items():
            if now - restoring.progressed > RESTORE_STALL_S:
                raise RejoinError(
                    f"step {Step.RESTORE_DELTA}: partition {p} applied no changelog record for "
                    f"{RESTORE_STALL_S:.0f}s ({restoring.records} applied); an open transaction "
                    "may hold the changelog's last stable offset back. Rejoining to restore again."
                )
        if not self.restores:
            self.close_reader()

    def _start(self, restoring: Restoring) -> None:
        """The store's offset against the changelog's ends: nothing after it (RUNNING now), a
        delta to read, or an offset the changelog cannot have (recreated, or a gap): wipe."""
        task = restoring.task
        p = task.partition
        low, high = self._reader().ends(p)
        try:
            with detecting(p):
                stored = task.store.changelog_offset()
        except StoreCorruptedError as exc:
            self.rebuild(task, exc.causes[p])
            return
        if stored != NO_OFFSET and (stored >= high or stored + 1 < low):
            self.rebuild(task, f"stored changelog offset {stored} outside [{low}, {high})")
            return
        start = stored + 1 if stored != NO_OFFSET else low
        if start >= high:
            self._finish(restoring)
            return
        self._reader().add(p, start)
        restoring.reading = True
        restoring.progressed = time.monotonic()

    def _apply(self, messages: list[Message]) -> None:
        writes: dict[int, list[StoreWrite]] = {}
        last: dict[int, int] = {}
        ended: set[int] = set()
        for message in messages:
            p = message.partition() or 0
            restoring = self.restores.get(p)
            if restoring is None or not restoring.reading:
                continue  # fetched before the partition was removed
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                ended.add(p)
                continue
            key = message.key()
            if key is not None:
                writes.setdefault(p, []).append(_store_write(key, message))
                last[p] = max(last.get(p, -1), message.offset() or 0)
        for p, batch in writes.items():
            restoring = self.restores[p]
            try:
                with detecting(p):
                    restoring.task.store.apply(batch, last[p])
            except StoreCorruptedError as exc:
                ended.discard(p)
                self.rebuild(restoring.task, exc.causes[p])
                continue
            restoring.records += len(batch)
            restoring.progressed = time.monotonic()
            self.steps.renew()
        for p in sorted(ended):
            if p in self.restores and self.restores[p].reading:
                self._finish(self.restores[p])

    def _finish(self, restoring: Restoring) -> None:
        """A3: RUNNING from the restored store; a task that ran before goes back to its
        committed offsets; its inputs resume."""
        task = restoring.task
        p = task.partition
        if restoring.reading:
            self._reader().remove(p)
            restoring.reading = False
        try:
            with detecting(p):
                task.move_to(TaskState.RUNNING)  # reads the watermark from the store
        except StoreCorruptedError as exc:
            self.rebuild(task, exc.causes[p])
            return
        wanted = self.owned.wanted([p])
        if p in self.owned.fetched_unready and not restoring.rewind:
            log.warning(
                "partition %d: inputs were consumed while its task restored (their pause did "
                "not hold); read again from the committed offsets",
                p,
            )
            restoring.rewind = True  # consumed: fetching started, a seek is valid
        self.owned.fetched_unready.discard(p)
        if restoring.rewind:
            with self.steps.guard("rewind committed", partitions=[p]):
                committed = self.consumer.committed(wanted, timeout=CALL_TIMEOUT_S)
            for tp in committed:
                offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            self.owned.start_at(committed)
        del self.restores[p]
        self.owned.ready(task)
        self.consumer.resume(wanted)
        seconds = time.monotonic() - restoring.started
        self.metrics.restore_seconds.observe(seconds)
        log.info(
            "step %s: partition %d restored %d changelog records in %.2fs; %s: running",
            Step.RESTORE_DELTA,
            p,
            restoring.records,
            seconds,
            Step.READY,
        )
        self._publish()

    def release(self, partitions: Iterable[int]) -> None:
        """Revoke or lost: the RESTORING tasks of these partitions close, their changelog
        partitions leave the reader."""
        gone = set(partitions)
        self.owned.fetched_unready -= gone
        for p in sorted(gone & set(self.restores)):
            restoring = self.restores.pop(p)
            if restoring.reading and self.reader is not None:
                self.reader.remove(p)
            restoring.task.move_to(TaskState.CLOSED)
        if not self.restores:
            self.close_reader()
        self._publish()

    def close(self) -> None:
        """The clients go (a rejoin or a stop): every RESTORING task closes."""
        self.release(list(self.restores))

    def close_reader(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            with self.steps.guard(f"{Step.RESTORE_DELTA} close"):
                reader.close()

    def _reader(self) -> ChangelogReader:
        if self.reader is None:
            self.reader = self.parts.factory.changelog_reader(self.parts.settings)
        return self.reader

    def _report(self, partition: int, cause: str, action: str) -> None:
        log.error(
            "partition %d: local store %s cannot be read (%s); %s, the other partitions go on",
            partition,
            self._path(partition),
            cause,
            action,
        )
        self.metrics.task_corrupted.labels(partition=str(partition)).inc()

    def _publish(self) -> None:
        self.metrics.set_restoring(sorted(self.restores))

    def _path(self, partition: int) -> Path:
        return self.parts.state_root / f"p{partition}.sqlite"

    def _cache_kib(self) -> int:
        """A process can hold every partition: each task gets its share of the memory bounds."""
        s = self.parts.settings
        return s.store_cache_mb * 1024 // s.partitions

    def _read_cache_bytes(self) -> int:
        s = self.parts.settings
        return s.read_cache_mb * 2**20 // s.partitions
