"""Step A2's reader of the changelog: one assigned (never subscribed) read_committed consumer,
to which partitions are added when their tasks start restoring and from which they are removed
when they finish or go. `ChangelogReader` names the calls the restorer makes (the fault tests
fake it); each returns within its own timeout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from confluent_kafka import Consumer, Message, TopicPartition

ENDS_TIMEOUT_S = 10.0  # one watermark lookup (a broker round trip)


class ChangelogReader(Protocol):
    def ends(self, partition: int) -> tuple[int, int]:
        """The partition's low and high watermarks, asked of the broker."""
        ...

    def add(self, partition: int, start: int) -> None: ...
    def remove(self, partition: int) -> None: ...
    def read(self, max_records: int, timeout_s: float) -> list[Message]:
        """Records (and `_PARTITION_EOF` once at each partition's last stable offset)."""
        ...

    def close(self) -> None: ...


class KafkaChangelogReader:
    def __init__(self, client_config: Mapping[str, Any], topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer(
            {
                **client_config,
                "group.id": f"restore-{topic}",  # never joins or commits: assign() only
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 50,
            }
        )

    def ends(self, partition: int) -> tuple[int, int]:
        tp = TopicPartition(self.topic, partition)
        low, high = self.consumer.get_watermark_offsets(tp, timeout=ENDS_TIMEOUT_S, cached=False)
        return int(low), int(high)

    def add(self, partition: int, start: int) -> None:
        self.consumer.incremental_assign([TopicPartition(self.topic, partition, start)])

    def remove(self, partition: int) -> None:
        self.consumer.incremental_unassign([TopicPartition(self.topic, partition)])

    def read(self, max_records: int, timeout_s: float) -> list[Message]:
        return self.consumer.consume(max_records, timeout=timeout_s)

    def close(self) -> None:
        self.consumer.close()
