"""Step A2: bring a task's local store up to the changelog's end, reading only the delta."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from engine.runtime.store import NO_OFFSET, LocalStore, StoreWrite
from engine.runtime.task import PENDING_HEADER, parse_pending_header

RESTORE_BATCH = 5_000


@dataclass(frozen=True)
class RestoreReport:
    partition: int
    records: int
    seconds: float
    wiped: bool


def restore_partition(
    client_config: dict[str, str | int | float | bool],
    changelog_topic: str,
    partition: int,
    store: LocalStore,
    timeout_s: float = 120.0,
) -> RestoreReport:
    """Apply changelog records after the store's offset, in batches, with an assigned consumer."""
    started = time.monotonic()
    consumer = Consumer(
        {
            **client_config,
            "group.id": f"restore-{changelog_topic}",  # never joins or commits: assign() only
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.max.bytes": 52_428_800,
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(changelog_topic, partition), timeout=30, cached=False
        )
        stored = store.changelog_offset()
        wiped = False
        if stored != NO_OFFSET and (stored >= high or stored + 1 < low):
            # The changelog was recreated, or compaction/retention left a gap we cannot see past.
            store.wipe()
            stored, wiped = NO_OFFSET, True
        start = stored + 1 if stored != NO_OFFSET else OFFSET_BEGINNING
        if stored != NO_OFFSET and stored + 1 >= high:
            return RestoreReport(partition, 0, time.monotonic() - started, wiped)
        consumer.assign([TopicPartition(changelog_topic, partition, start)])
        count = 0
        last = stored
        deadline = time.monotonic() + timeout_s
        while True:
            batch = consumer.consume(RESTORE_BATCH, timeout=0.1)
            writes: list[StoreWrite] = []
            at_end = False
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end = True
                        continue
                    raise KafkaException(error)
                key = message.key()
                if key is None:
                    continue
                status: str | None = None
                since: int | None = None
                headers = message.headers()
                for name, value in headers if isinstance(headers, list) else []:
                    if name == PENDING_HEADER and isinstance(value, bytes):
                        status, since = parse_pending_header(value)
                writes.append(StoreWrite(key.decode(), message.value(), status, since))
                last = max(last, message.offset() or 0)
            if writes:
                store.apply(writes, last)
                count += len(writes)
            position = consumer.position([TopicPartition(changelog_topic, partition)])[0].offset
            if at_end or position >= high:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"restoring {changelog_topic}[{partition}] did not reach the end in "
                    f"{timeout_s:.0f}s ({count} records applied); an open transaction may hold "
                    "the last stable offset back. It is retried on the next assignment."
                )
        return RestoreReport(partition, count, time.monotonic() - started, wiped)
    finally:
        consumer.close()
