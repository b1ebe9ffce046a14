"""Step 2's input side: consume what librdkafka has queued, decode each record into its task's
time-ordered buffer (ordering.py), and pause or resume the inputs that buffer asks for."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, Message, TopicPartition

from engine.runtime.clients import ConsumerLike
from engine.runtime.commit.errors import RejoinError
from engine.runtime.intake.ingest import Rejected
from engine.runtime.intake.ordering import FIRST, Buffered
from engine.runtime.parts import Consumed, Parts
from engine.runtime.tasks.corrupt import detecting

log = logging.getLogger("reconciler.engine")

CONSUME_BATCH = 1_000

# Consumer errors that librdkafka reports as non-fatal but that no retry inside the same clients
# fixes (an ACL changed under us): rejoin with new clients, backing off, so the log counts them.
REJOIN_CODES = frozenset(
    {
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


class Intake:
    """The consumer's side of the loop for one pair of clients."""

    def __init__(self, parts: Parts, consumer: ConsumerLike) -> None:
        self.parts = parts
        self.consumer = consumer

    @property
    def batch(self) -> int:
        """Records one consume() returns at most; a full batch means more are queued."""
        return CONSUME_BATCH

    def consume(self, wait_s: float) -> tuple[list[Message], bool]:
        """What librdkafka has queued; if nothing, wait up to `wait_s` for the first record
        (consume(n) would wait for all n). True with it when the local queue was drained.
        No second call once a callback asked for a rejoin: after a lost assignment librdkafka
        rejoins on its own, and the next consume() would run on_assign (A0-A2, a restore) for
        clients the loop is about to drop."""
        flags, consumer, batch = self.parts.flags, self.consumer, CONSUME_BATCH
        messages = consumer.consume(batch, timeout=0)
        if not messages and not flags.rejoin_requested:
            messages = consumer.consume(1, timeout=wait_s)
            if messages and not flags.rejoin_requested:
                messages += consumer.consume(batch - 1, timeout=0)
        return messages, len(messages) < batch

    def consume_now(self) -> list[Message]:
        """What librdkafka has queued, never waiting (folds ahead of a commit in flight)."""
        return self.consumer.consume(CONSUME_BATCH, timeout=0)

    def raise_if_rejoining(self) -> None:
        """A rebalance callback that ran inside consume() asked for new clients."""
        flags = self.parts.flags
        if flags.rejoin_requested:
            flags.rejoin_requested = False
            raise RejoinError("the assignment was lost or a revoke-time commit failed")

    def take(self, messages: list[Message]) -> None:
        """Decode consumed records into the tasks' time-ordered buffer (ordering.py): one
        pass, each accessor called once, the lookups hoisted (this runs once per input)."""
        parts = self.parts
        fresh, accept, push = parts.owned.fresh, parts.ingest.accept, parts.order.push
        tasks, unready = parts.owned.tasks, parts.owned.fetched_unready
        trace = parts.trace
        for message in messages:
            if message.error() is not None:
                self._consumer_error(message)
                continue
            topic, partition = message.topic() or "", message.partition() or 0
            offset = message.offset() or 0
            if not fresh(topic, partition, offset):
                if partition not in tasks:  # not ready: the restorer reads it again at A3
                    unready.add(partition)
                continue  # or a record folded already
            outcome = accept(message, topic, partition, offset)
            if trace is not None:
                trace.arrived((topic, partition, offset), float(message.timestamp()[1]))
            at = FIRST if isinstance(outcome, Rejected) else outcome.event_time_ms
            push(Buffered(topic, partition, offset, at, (message, outcome)))

    def _consumer_error(self, message: Message) -> None:
        error = message.error()
        assert error is not None
        if error.code() == KafkaError._PARTITION_EOF:
            self.parts.order.at_end(message.topic() or "", message.partition() or 0)
            return
        # A consumer's fatal error (e.g. a static member fenced after a broker restart)
        # arrives as code _FATAL without fatal() set on the message error.
        if error.fatal() or error.code() == KafkaError._FATAL:
            raise RejoinError(str(error))
        if error.code() in REJOIN_CODES:
            raise RejoinError(
                f"{error}: grant the engine's principal access to its group, input topics "
                "and transactional id (README, Security)"
            )
        log.warning("consumer error (librdkafka retries): %s", error)

    def release(self, now: float, drained: bool, limit: int) -> list[Buffered[Consumed]]:
        """What the order buffer releases, up to `limit` (ordering.py): the loop takes records
        from the intake alone, so one input goes intake -> fold -> commit and never back."""
        return self.parts.order.ready(now, drained, limit)

    def put_back(self, records: list[Buffered[Consumed]]) -> None:
        """Released records the open transaction had no room for wait again, in order."""
        self.parts.order.put_back(records)

    def prefetch(self, batch: list[Buffered[Consumed]]) -> None:
        """One store query per partition for the sessions of the batch (step 2 reads them)."""
        sessions: dict[int, list[str]] = {}
        for record in batch:
            outcome = record.item[1]
            if not isinstance(outcome, Rejected):
                sessions.setdefault(record.partition, []).append(outcome.session_id)
        tasks = self.parts.owned.tasks
        for partition, ids in sessions.items():
            task = tasks.get(partition)
            if task is not None:
                with detecting(partition):
                    task.prefetch(ids)

    def apply_flow(self) -> None:
        """Pause the inputs that are ahead, resume those the buffer drained (ordering.py)."""
        flow = self.parts.order.flow()
        if flow.pause:
            self.consumer.pause([TopicPartition(t, p) for t, p in flow.pause])
        if flow.resume:
            self.consumer.resume([TopicPartition(t, p) for t, p in flow.resume])

    def resume(self, held: list[tuple[str, int]]) -> None:
        if held:
            self.consumer.resume([TopicPartition(t, p) for t, p in held])
