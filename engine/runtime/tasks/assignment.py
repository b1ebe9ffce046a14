"""What this process owns: the input partitions assigned, the ready tasks, the next offsets.

A task is partition p of every input topic plus changelog partition p; it is ready (A3) only
when all its input partitions are assigned and its state is restored. The next offset to fold
per input partition is what step 4 commits and the guard against records fetched before a
rebalance or a rewind and delivered after it.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import TopicPartition

from engine.runtime.tasks.state import TaskState
from engine.runtime.tasks.task import PartitionTask

Key = tuple[str, int]


class Assignment:
    def __init__(self, inputs: Iterable[str]) -> None:
        self.inputs = tuple(inputs)
        self.tasks: dict[int, PartitionTask] = {}
        self.assigned: set[Key] = set()
        self.next: dict[Key, int] = {}
        # Offset metadata of every commit: who committed it (fencing.py, step A0).
        self.metadata: str | None = None
        # Tasks of which a record was consumed (and dropped: not ready) while they restored:
        # at A3 the restorer rewinds their inputs to the committed offsets (restorer.py)
        # instead of going on from where the consumer is, past the dropped records.
        self.fetched_unready: set[int] = set()

    def add(self, partitions: list[TopicPartition]) -> tuple[list[int], list[TopicPartition]]:
        """A1 bookkeeping: the newly complete task partitions, and what stays paused."""
        self.assigned |= {(tp.topic, tp.partition) for tp in partitions}
        complete = sorted(
            p
            for p in {tp.partition for tp in partitions}
            if all((t, p) in self.assigned for t in self.inputs)
        )
        return complete, [tp for tp in partitions if tp.partition not in complete]

    def wanted(self, partitions: Iterable[int]) -> list[TopicPartition]:
        """Every input partition of the given tasks."""
        return [TopicPartition(t, p) for p in partitions for t in self.inputs]

    def start_at(self, committed: Iterable[TopicPartition]) -> None:
        """Committed offsets (A1, or a rewind after an abort) become the next offsets."""
        for tp in committed:
            self.next[(tp.topic, tp.partition)] = max(tp.offset, 0)

    def ready(self, task: PartitionTask) -> None:
        self.tasks[task.partition] = task

    def fresh(self, topic: str, partition: int, offset: int) -> bool:
        """Whether a consumed record is one `claim` would take (its task is ready, it is not
        folded already), without advancing anything."""
        return partition in self.tasks and offset >= self.next.get((topic, partition), 0)

    def claim(self, topic: str, partition: int, offset: int) -> PartitionTask | None:
        """The task that must fold this record now (advancing its next offset), or None for
        a leftover of an incomplete task or a record folded already."""
        task = self.tasks.get(partition)
        if task is None or offset < self.next.get((topic, partition), 0):
            return None
        self.next[(topic, partition)] = offset + 1
        return task

    def positions(self) -> list[TopicPartition]:
        """Step 4's offsets: the next record to fold of every input partition of a ready task."""
        mine = [(t, p, o) for (t, p), o in self.next.items() if p in self.tasks]
        if self.metadata is None:
            return [TopicPartition(t, p, o) for t, p, o in mine]
        return [TopicPartition(t, p, o, metadata=self.metadata) for t, p, o in mine]

    def folded(self) -> int:
        return sum(task.folded for task in self.tasks.values())

    def discard_uncommitted(self) -> None:
        for task in self.tasks.values():
            task.discard()

    def release(self, partitions: list[TopicPartition]) -> None:
        """Revoke or lost: close the tasks of these partitions and forget their offsets."""
        for p in sorted({tp.partition for tp in partitions} & set(self.tasks)):
            self.tasks.pop(p).move_to(TaskState.CLOSED)
        self.assigned -= {(tp.topic, tp.partition) for tp in partitions}
        for tp in partitions:
            self.next.pop((tp.topic, tp.partition), None)

    def drop_all(self) -> None:
        for task in self.tasks.values():
            task.move_to(TaskState.CLOSED)
        self.tasks.clear()
        self.assigned.clear()
        self.next.clear()
        self.fetched_unready.clear()
