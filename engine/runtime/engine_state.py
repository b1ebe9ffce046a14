"""What the engine's parts share: settings, clients' factory, metrics, the tasks it owns, the
order buffer and the open transaction. `CommitLoop` (commit_loop.py), `Rebalancing`
(rebalance.py) and `Engine` (engine.py) build on it in that order.
"""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import KafkaException, Message, TopicPartition

from engine.core.events import Event
from engine.runtime.assignment import Assignment
from engine.runtime.clients import ClientFactory, ConsumerLike, KafkaClients
from engine.runtime.collector import Collector
from engine.runtime.commit.transaction import Transactions
from engine.runtime.ingest import Ingest, Rejected
from engine.runtime.memory import Trimmer
from engine.runtime.metrics import EngineMetrics
from engine.runtime.ordering import InputOrder
from engine.runtime.task import PartitionTask
from engine.runtime.trace import LatencyTrace
from engine.runtime.watchdog import Watchdog
from engine.settings import Settings
from engine.wire import Codec
from engine.wire.registry import codec_for

Consumed = tuple[Message, Event | Rejected]  # a record and what it decoded to


class EngineState:
    """The state of one engine process; no step of the protocol lives here."""

    def __init__(
        self,
        settings: Settings,
        *,
        codec: Codec | None = None,
        metrics: EngineMetrics | None = None,
        clients: ClientFactory | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.codec = codec or codec_for(settings.schema_registry_url, write_registry=False)
        self.metrics = metrics or EngineMetrics()
        self.factory: ClientFactory = clients or KafkaClients()
        self.watchdog = watchdog or Watchdog()
        self.budget_s = settings.transaction_timeout_ms / 1000 + settings.watchdog_margin_s
        self.metrics.liveness = self.alive
        self.ingest = Ingest(self.codec, self.topics, settings.partitions)
        self.owned = Assignment(self.topics.inputs)
        self.order: InputOrder[Consumed] = InputOrder(
            self.topics.inputs,
            settings.order_wait_ms / 1000,
            settings.order_max_buffered,
            self._caught_up,
        )
        self._stopping = False
        self._rejoin_requested = False
        self._consumer: ConsumerLike | None = None
        self._txn: Transactions | None = None
        self._state_root = Path(settings.state_dir) / settings.group_id / settings.topic_prefix
        self.trimmer = Trimmer(settings.memory_trim_interval_s)
        self.collector: Collector | None = None  # the process's (collector.py); tests: none
        self._committed_since_rejoin = False
        path = settings.latency_trace_path
        self.trace = LatencyTrace(path) if path is not None else None

    @property
    def tasks(self) -> dict[int, PartitionTask]:
        return self.owned.tasks

    def stop(self) -> None:
        self._stopping = True

    def alive(self) -> bool:
        """Liveness: the loop completed an iteration within `liveness_timeout_s`."""
        return self.watchdog.since_progress_s() <= self.settings.liveness_timeout_s

    def _progress(self) -> None:
        self.watchdog.progress()
        self.metrics.last_progress.set(self.watchdog.last_progress_wall)

    def _caught_up(self, topic: str, partition: int, after: int) -> bool:
        """Everything before the end offset librdkafka last heard of is buffered: no need to
        wait for this input (a cached answer, no broker round trip; unknown: wait)."""
        consumer = self._consumer
        if consumer is None:
            return False
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except KafkaException:
            return False
        return high >= 0 and after >= high
