"""Steady load and decision timing for the cluster fault tests.

The load and the timing reader use the cluster's direct listener: runners and the checker sit
outside the fault, only the engine (on the proxied bootstrap) is in it. Times are
`time.monotonic()` of this test process.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message, Producer

from engine.core.events import Decision, Event
from engine.settings import Settings
from engine.wire import RecordType
from tests.integration.engine_harness import CODEC

TICK_S = 0.02


class SteadyLoad(threading.Thread):
    """Produces `events` at `rate` inputs/s; `sent[event_id]` is when each was handed over.

    Deliveries retry for `delivery_timeout_s` (a starved ISR refuses them for a while); one
    that fails for good is kept in `failures` and fails the test."""

    def __init__(
        self,
        bootstrap: str,
        settings: Settings,
        events: list[Event],
        rate: float,
        delivery_timeout_s: float = 180.0,
    ) -> None:
        super().__init__(name="steady-load", daemon=True)
        self.bootstrap = bootstrap
        self.topics = settings.topics
        self.events = events
        self.rate = rate
        self.delivery_timeout_s = delivery_timeout_s
        self.sent: dict[str, float] = {}
        self.failures: list[str] = []
        self.started_at = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": int(self.delivery_timeout_s * 1000),
                "log_level": 0,
            }
        )

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                self.failures.append(f"{message.topic()}: {error}")

        self.started_at = time.monotonic()
        for n, event in enumerate(self.events):
            if self.stopping.is_set():
                break
            due = self.started_at + n / self.rate
            pause = due - time.monotonic()
            if pause > TICK_S:
                producer.poll(0)
                time.sleep(pause)
            producer.produce(
                self.topics.topic_for(event),
                key=event.session_id.encode(),
                value=CODEC.encode(event),
                on_delivery=delivered,
            )
            self.sent[event.event_id] = time.monotonic()
        left = producer.flush(self.delivery_timeout_s + 10)
        if left:
            self.failures.append(f"{left} inputs not delivered")

    def seconds_left(self) -> float:
        """Seconds until every event is sent at `rate` (the whole run before it starts)."""
        if not self.started_at:
            return len(self.events) / self.rate
        return self.started_at + len(self.events) / self.rate - time.monotonic()

    def finish(self, timeout_s: float) -> list[Event]:
        """Stop producing; the inputs sent, once every one of them is delivered."""
        self.stopping.set()
        self.join(timeout=timeout_s)
        assert not self.is_alive(), f"the load did not finish within {timeout_s:.0f}s"
        assert not self.failures, f"inputs not delivered: {self.failures[:3]}"
        return [event for event in self.events if event.event_id in self.sent]


@dataclass
class Timeline:
    """When each decision became readable (read_committed)."""

    arrivals: list[tuple[float, str]] = field(default_factory=list)

    def stall(self, start: float, end: float) -> float:
        """The longest time in [start, end] without a decision becoming readable."""
        times = [t for t, _ in self.arrivals if start <= t <= end]
        edges = [start, *times, end]
        return max(b - a for a, b in itertools.pairwise(edges))

    def recovered_after(self, fault: float, sent: dict[str, float]) -> float | None:
        """Seconds from `fault` to the first decision of an input sent after it."""
        for t, decision_id in self.arrivals:
            when = sent.get(decision_id)
            if t >= fault and when is not None and when > fault:
                return t - fault
        return None

    def latencies(self, sent: dict[str, float], start: float, end: float) -> list[float]:
        """Input handed to the producer -> its decision readable, for inputs sent in the window."""
        return sorted(
            t - sent[d] for t, d in self.arrivals if d in sent and start <= sent[d] <= end
        )


class DecisionTimer(threading.Thread):
    """Reads the decisions topic as it grows and stamps each decision's arrival."""

    def __init__(self, bootstrap: str, settings: Settings) -> None:
        super().__init__(name="decision-timer", daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"timer-{time.time_ns()}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        self.consumer.subscribe([settings.topics.decisions])
        self.timeline = Timeline()
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                for message in self.consumer.consume(500, timeout=0.1):
                    if message.error() is not None:
                        continue
                    now = time.monotonic()
                    decision = CODEC.decode(RecordType.DECISION, message.value() or b"")
                    assert isinstance(decision, Decision)
                    self.timeline.arrivals.append((now, decision.decision_id))
        finally:
            self.consumer.close()

    def stop(self) -> Timeline:
        self.stopping.set()
        self.join(timeout=30)
        return self.timeline


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
