"""Event-time order across the input topics of one partition task, bounded.

librdkafka hands over records partition by partition, so on a backlog a task can see a
thousand resumes before the intents they name, which sit unread in the other topic; each
such resume is parked (a deferred answer, then a final one). Here the consumed records of a
task wait in one FIFO per input topic, and the task folds the head with the smallest event
time, but only once every other input of the task has a record buffered too, or is known to
be at its end (librdkafka's partition EOF, or everything up to the end offset the consumer
last heard of is buffered: Kafka Streams waits the same way, only while the lag is unknown or
above zero), or the task has waited `wait_s` for it. The last rule keeps a topic that is slow
to fetch from stalling the others for more than a moment.

Across tasks the oldest releasable head goes first too: on a backlog, with a bound on the batch,
a fixed order of partitions would keep the last ones waiting while the first ones keep filling.

Flow control is where the input that is ahead gets paused: its records are the ones left
waiting, so its FIFO fills; at `max_buffered` records its partition is paused (librdkafka
stops fetching it) and it is resumed once the FIFO is down to half. This also bounds the
records held here. Pause and resume come back as data; the engine makes the calls.

A record that failed to decode has no event time: it goes first (to dead letters).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

Key = tuple[str, int]
T = TypeVar("T")
FIRST = -1  # the event time of a record with none (a dead letter): before any other
CaughtUp = Callable[[str, int, int], bool]
"""(topic, partition, the offset after the last record buffered): is that the end offset the
consumer knows of? False when unknown (the engine asks librdkafka's cached watermark)."""


class Buffered(Generic[T]):
    """One consumed record waiting its turn. A plain class: a frozen dataclass's init costs
    ~0.6 us more, once per input, and mypyc compiles no generic dataclass."""

    __slots__ = ("event_time_ms", "item", "offset", "partition", "topic")

    def __init__(
        self, topic: str, partition: int, offset: int, event_time_ms: int, item: T
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.event_time_ms = event_time_ms
        self.item = item


Head = tuple[int, int, "deque[Buffered[T]]", bool]
"""A task's next record to release: (its event time, the partition, its FIFO, whether the
bounded wait released it). Partitions differ within one heap, so the FIFO is never compared."""


@dataclass(frozen=True)
class Flow:
    """Partitions to pause (their FIFO is full) and to resume (drained to half)."""

    pause: list[Key]
    resume: list[Key]


class InputOrder(Generic[T]):
    def __init__(
        self,
        inputs: Iterable[str],
        wait_s: float,
        max_buffered: int,
        caught_up: CaughtUp | None = None,
    ) -> None:
        self.inputs = tuple(inputs)
        self.caught_up = caught_up
        self._keys_of: dict[int, tuple[Key, ...]] = {}
        self.wait_s = wait_s
        self.max_buffered = max_buffered
        self._queues: dict[Key, deque[Buffered[T]]] = {}
        # the same deques by task, in input order (ready() looks at a task's heads per record)
        self._task_queues: dict[int, tuple[deque[Buffered[T]], ...]] = {}
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
        queue = self._queues.get(key)
        if queue is None:
            queue = self._new_queue(key)
        queue.append(record)
        if self._at_end:
            self._at_end.discard(key)
        return True

    def _new_queue(self, key: Key) -> deque[Buffered[T]]:
        partition = key[1]
        if partition not in self._task_queues:
            queues = self._queues
            self._task_queues[partition] = tuple(
                queues.setdefault((t, partition), deque()) for t in self.inputs
            )
        return self._queues.setdefault(key, deque())  # a topic not an input: never released

    def at_end(self, topic: str, partition: int) -> None:
        """librdkafka reached the end of this input partition: nothing unread to wait for."""
        self._at_end.add((topic, partition))

    def ready(self, now: float, drained: bool, limit: int | None = None) -> list[Buffered[T]]:
        """The records that may be folded now, in the order to fold them, at most `limit`
        (the rest stay buffered: a batch must fit well within the transaction timeout).
        `drained`: the last consume emptied librdkafka's queue, so what is missing is not
        fetched yet; only then does the wait run out (on a backlog it is usually next)."""
        out: list[Buffered[T]] = []
        known: dict[Key, bool] = {}  # caught_up answers: nothing is fetched during this call
        heads: list[Head[T]] = []
        for partition in {p for (_, p), q in self._queues.items() if q}:
            head = self._head(partition, now, drained, known)
            if head is not None:
                heads.append(head)
        heapq.heapify(heads)
        bound = math.inf if limit is None else limit
        while heads and len(out) < bound:
            _, partition, queue, waited = heads[0]
            self.waited += waited
            out.append(queue.popleft())
            head = self._head(partition, now, drained, known)
            if head is None:
                heapq.heappop(heads)
            else:  # one sift instead of a pop and a push
                heapq.heapreplace(heads, head)
        return out

    def _head(
        self, partition: int, now: float, drained: bool, known: dict[Key, bool]
    ) -> Head[T] | None:
        """The task's next record to release (as its FIFO), unless it must wait."""
        first: deque[Buffered[T]] | None = None
        at = 0
        some_empty = False
        for queue in self._task_queues[partition]:
            if not queue:
                some_empty = True
            elif first is None or queue[0].event_time_ms < at:
                first, at = queue, queue[0].event_time_ms  # ties: input topic order
        if first is None:
            self._blocked_since.pop(partition, None)
            return None
        # an input with nothing buffered may still hold an earlier record
        waited = some_empty and any(
            not q and not self._ended(key, known)
            for key, q in zip(self._keys(partition), self._task_queues[partition], strict=True)
        )
        if waited:
            since = self._blocked_since.setdefault(partition, now)
            if not drained or now - since < self.wait_s:
                return None
        elif self._blocked_since:
            self._blocked_since.pop(partition, None)
        return (at, partition, first, waited)

    def _keys(self, partition: int) -> tuple[Key, ...]:
        keys = self._keys_of.get(partition)
        if keys is None:
            keys = self._keys_of[partition] = tuple((t, partition) for t in self.inputs)
        return keys

    def _ended(self, key: Key, known: dict[Key, bool]) -> bool:
        """Nothing unread is known to be in this input partition."""
        if key in self._at_end:
            return True
        after = self._next.get(key)
        if self.caught_up is None or after is None:
            return False
        if key not in known:
            known[key] = self.caught_up(key[0], key[1], after)
        return known[key]

    def put_back(self, records: list[Buffered[T]]) -> None:
        """Records `ready` released but the caller did not fold: first again, in order."""
        for record in reversed(records):
            self._queues[(record.topic, record.partition)].appendleft(record)

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
        for p in gone:
            self._task_queues.pop(p, None)
        for key in [k for k in self._next if k[1] in gone]:
            del self._next[key]
        self._at_end = {k for k in self._at_end if k[1] not in gone}
        for p in gone:
            self._blocked_since.pop(p, None)
        held = sorted(k for k in self.paused if k[1] in gone)
        self.paused.difference_update(held)
        return held
