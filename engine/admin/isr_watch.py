"""Whether the brokers can take the engine's writes: the ISR of its output topics.

A partition with fewer in-sync replicas than its `min.insync.replicas` refuses every acks=all
write. The engine's transactional producer retries that refusal (NOT_ENOUGH_REPLICAS is
retriable) until the transaction times out, so inside the loop it only looks like a slow
commit. This watcher, a daemon thread beside the loop with its own quiet admin client, names the
cause: `/readyz` answers 503 with it (`EngineMetrics.writes_refused`), two gauges count the
partitions (the chart's alert rules read them) and one log line marks its start and its end.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from prometheus_client import CollectorRegistry, Gauge

from engine.admin.brokers import quiet_config
from engine.settings import Settings

log = logging.getLogger("reconciler.isr")

INTERVAL_S = 5.0
CALL_TIMEOUT_S = 3.0
CONFIG_REFRESH_S = 60.0


class _Metrics(Protocol):
    registry: CollectorRegistry
    writes_refused: str | None


class IsrWatch:
    """Every `INTERVAL_S`: the decisions, changelog and dead-letter partitions whose ISR is
    below their min.insync.replicas (writes refused) or below their replica count."""

    def __init__(self, settings: Settings, metrics: _Metrics) -> None:
        self.metrics = metrics
        names = settings.topics
        self.topics = (names.decisions, names.changelog, names.dead_letters)
        self.admin = AdminClient(quiet_config(settings))
        self.min_isr: dict[str, int] = {}
        self._configs_read = 0.0
        self.under_min_isr = Gauge(
            "reconciler_partitions_under_min_isr",
            "Output partitions (decisions, changelog, dead letters) whose in-sync replicas are"
            " fewer than min.insync.replicas: the brokers refuse the engine's writes",
            registry=metrics.registry,
        )
        self.under_replicated = Gauge(
            "reconciler_partitions_under_replicated",
            "Output partitions with a replica out of the ISR",
            registry=metrics.registry,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="isr-watch", daemon=True)

    def start(self) -> IsrWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=CALL_TIMEOUT_S * 3)

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            try:
                reason = self.check()
            except KafkaException:
                continue  # brokers unreachable: the loop's own errors say so
            if reason != self.metrics.writes_refused:
                if reason:
                    log.error("writes refused by the brokers: %s", reason)
                else:
                    log.warning("the brokers take writes again: in-sync replicas restored")
            self.metrics.writes_refused = reason

    def _read_min_isr(self) -> None:
        resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in self.topics]
        for topic, resource in zip(self.topics, resources, strict=True):
            future = self.admin.describe_configs([resource])[resource]
            self.min_isr[topic] = int(
                future.result(timeout=CALL_TIMEOUT_S)["min.insync.replicas"].value
            )
        self._configs_read = time.monotonic()

    def check(self) -> str | None:
        """One look; the reason writes are refused, or None."""
        if time.monotonic() - self._configs_read > CONFIG_REFRESH_S:
            self._read_min_isr()
        metadata = self.admin.list_topics(timeout=CALL_TIMEOUT_S)
        starved: list[str] = []
        lagging = 0
        for topic in self.topics:
            found = metadata.topics.get(topic)
            if found is None:
                continue
            least = self.min_isr.get(topic, 1)
            for partition, meta in sorted(found.partitions.items()):
                if len(meta.isrs) < len(meta.replicas):
                    lagging += 1
                if len(meta.isrs) < least:
                    starved.append(f"{topic}/{partition} ({len(meta.isrs)} in sync)")
        self.under_min_isr.set(len(starved))
        self.under_replicated.set(lagging)
        if not starved:
            return None
        shown = ", ".join(starved[:4]) + (
            f" and {len(starved) - 4} more" if len(starved) > 4 else ""
        )
        return (
            f"in-sync replicas below min.insync.replicas on {shown}: the brokers refuse the "
            "engine's writes until a broker returns to the ISR"
        )
