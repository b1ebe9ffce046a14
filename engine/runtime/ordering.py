"""Event-time order across the input topics of one partition task, bounded.

librdkafka hands over records partition by partition, so on a backlog a task can see a
thousand resumes before the intents they name, which sit unread in the other topic; each
such resume is parked (a deferred answer, then a final one). Here the consumed records of a
task wait in one FIFO per input topic, and the task folds the head with the smallest event
time, but only once every other input of the task has a record buffered too, or is known to
be at its end (librdkafka's partition EOF), or the task has waited `wait_s` for it. The last
rule keeps a topic that is slow to fetch from stalling the others for more than a moment.

Flow control is where the input that is ahead gets paused: its records are the ones left
waiting, so its FIFO fills; at `max_buffered` records its partition is paused (librdkafka
stops fetching it) and it is resumed once the FIFO is down to half. This also bounds the
records held here. Pause and resume come back as data; the engine makes the calls.

A record that failed to decode has no event time: it goes first (to dead letters).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

Key = tuple[str, int]
T = TypeVar("T")
FIRST = -1  # the event time of a record with none (a dead letter): before any other


@dataclass(frozen=True, slots=True)
class Buffered(Generic[T]):
    topic: str
    partition: int
    offset: int
    event_time_ms: int
    item: T


@dataclass(frozen=True, slots=True)
class Flow:
    """Partitions to pause (their FIFO is full) and to resume (drained to half)."""

    pause: list[Key]
    resume: list[Key]


class InputOrder(Generic[T]):
    def __init__(self, inputs: Iterable[str], wait_s: float, max_buffered: int) -> None:
        self.inputs = tuple(inputs)
        self.wait_s = wait_s
        self.max_buffered = max_buffered
        self._queues: dict[Key, deque[Buffered[T]]] = {}
        self._at_end: set[Key] = set()
        self._next: dict[Key, int] = {}  # the offset after the last one buffered
        self._blocked_since: dict[int, float] = {}
        self.paused: set[Key] = set()
        self.waited = 0  # records released by the bounded wait, out of order maybe

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def push(self, record: Buffered[T]) -> bool:
        """Buffer one consumed record; False for one buffered already (a refetch)."""
        key = (record.topic, record.partition)
        if record.offset < self._next.get(key, 0):
            return False
        self._next[key] = record.offset + 1
        self._queues.setdefault(key, deque()).append(record)
        self._at_end.discard(key)
        return True

    def at_end(self, topic: str, partition: int) -> None:
        """librdkafka reached the end of this input partition: nothing unread to wait for."""
        self._at_end.add((topic, partition))

    def ready(self, now: float, drained: bool) -> list[Buffered[T]]:
        """Every record that may be folded now, in the order to fold them. `drained`: the
        last consume emptied librdkafka's queue, so what is missing is not fetched yet; only
        then does the wait run out (on a backlog the missing records are usually next)."""
        out: list[Buffered[T]] = []
        for partition in sorted({p for (_, p), q in self._queues.items() if q}):
            self._release(partition, now, drained, out)
        return out

    def _release(self, partition: int, now: float, drained: bool, out: list[Buffered[T]]) -> None:
        keys = [(t, partition) for t in self.inputs]
        queues = [self._queues.get(k) for k in keys]
        while True:
            heads = [q[0] for q in queues if q]
            if not heads:
                self._blocked_since.pop(partition, None)
                return
            missing = [k for k, q in zip(keys, queues, strict=True) if not q]
            if any(k not in self._at_end for k in missing):
                since = self._blocked_since.setdefault(partition, now)
                if not drained or now - since < self.wait_s:
                    return
                self.waited += 1
            else:
                self._blocked_since.pop(partition, None)
            first = min(heads, key=lambda b: b.event_time_ms)  # ties: input topic order
            queue = self._queues[(first.topic, first.partition)]
            out.append(queue.popleft())

    def flow(self) -> Flow:
        pause = [k for k, q in self._queues.items() if len(q) >= self.max_buffered]
        pause = [k for k in pause if k not in self.paused]
        resume = [k for k in self.paused if len(self._queues.get(k, ())) <= self.max_buffered // 2]
        self.paused.update(pause)
        self.paused.difference_update(resume)
        return Flow(pause=sorted(pause), resume=sorted(resume))

    def clear(self) -> None:
        """New clients: nothing buffered, nothing paused."""
        self.drop({p for _, p in (*self._queues, *self._next, *self.paused)})

    def drop(self, partitions: Iterable[int]) -> list[Key]:
        """Forget the buffered records of these tasks (revoke, abort); returns the partitions
        this object had paused, which the caller resumes if it still owns them."""
        gone = set(partitions)
        for key in [k for k in self._queues if k[1] in gone]:
            del self._queues[key]
        for key in [k for k in self._next if k[1] in gone]:
            del self._next[key]
        self._at_end = {k for k in self._at_end if k[1] not in gone}
        for p in gone:
            self._blocked_since.pop(p, None)
        held = sorted(k for k in self.paused if k[1] in gone)
        self.paused.difference_update(held)
        return held
