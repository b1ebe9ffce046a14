"""What the parts of one engine process share, built once by `Engine` and handed to the loop,
the committer and the rebalance callbacks: no part reaches another through inheritance."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException, Message, TopicPartition

from engine.core.events import Event
from engine.runtime.clients import ClientFactory, ConsumerLike
from engine.runtime.intake.ingest import Ingest, Rejected
from engine.runtime.intake.ordering import InputOrder
from engine.runtime.process.collector import Collector
from engine.runtime.process.duplicate import Joined
from engine.runtime.process.memory import Trimmer
from engine.runtime.process.metrics import EngineMetrics
from engine.runtime.process.steps import Steps
from engine.runtime.process.trace import LatencyTrace
from engine.runtime.tasks.assignment import Assignment
from engine.settings import Settings
from engine.wire import Codec
from engine.wire.topics import TopicNames

Consumed = tuple[Message, Event | Rejected]  # a record and what it decoded to


@dataclass
class Flags:
    """Decisions one part makes for another, read once per loop iteration."""

    stopping: bool = False  # stop() or SIGTERM: drain, commit, leave
    rejoin_requested: bool = False  # a rebalance callback wants new clients
    committed_since_rejoin: bool = False  # the rejoin backoff starts over after a commit


@dataclass
class Parts:
    settings: Settings
    codec: Codec
    metrics: EngineMetrics
    factory: ClientFactory
    steps: Steps
    ingest: Ingest
    owned: Assignment
    trimmer: Trimmer
    trace: LatencyTrace | None
    collector: Collector | None
    flags: Flags = field(default_factory=Flags)
    consumer: ConsumerLike | None = None  # the current clients' (None between them)
    joined: Joined = field(default_factory=Joined)  # member ids of our joins (duplicate.py)
    order: InputOrder[Consumed] = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.order = InputOrder(
            self.topics.inputs, s.order_wait_ms / 1000, s.order_max_buffered, self._caught_up
        )

    @property
    def topics(self) -> TopicNames:
        return self.settings.topics

    @property
    def state_root(self) -> Path:
        s = self.settings
        return Path(s.state_dir) / s.group_id / s.topic_prefix

    def _caught_up(self, topic: str, partition: int, after: int) -> bool:
        """Everything before the end offset librdkafka last heard of is buffered: no need to
        wait for this input (a cached answer, no broker round trip; unknown: wait)."""
        consumer = self.consumer
        if consumer is None:
            return False
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except KafkaException:
            return False
        return high >= 0 and after >= high
