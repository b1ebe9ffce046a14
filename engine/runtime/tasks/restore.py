"""A blocking restore of local stores from the changelog, reading only the delta, and how a
changelog record becomes a store write (`_store_write`, shared with step A2).

The engine restores in its loop, a bounded piece per iteration (engine/runtime/restorer.py);
`restore_partitions` is the same reading done in one call, with the same reader, for
tools/bench_restore.py. A partition is done at its end of partition (the last stable offset).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from engine.runtime.tasks.changelog import KafkaChangelogReader
from engine.runtime.tasks.headers import (
    HEALTH_HEADER,
    PARKED_HEADER,
    PENDING_HEADER,
    WATERMARK_HEADER,
    parse_pending_header,
)
from engine.runtime.tasks.store import NO_OFFSET, LocalStore, StoreWrite

RESTORE_BATCH = 5_000  # changelog records one read (one restore step of the loop) takes at most


@dataclass(frozen=True)
class RestoreReport:
    partition: int
    records: int
    seconds: float
    wiped: bool


def restore_partitions(
    client_config: Mapping[str, Any],
    changelog_topic: str,
    stores: Mapping[int, LocalStore],
    timeout_s: float = 45.0,
    progress: Callable[[], None] = lambda: None,
) -> list[RestoreReport]:
    """Apply the changelog records after each store's offset; one report per partition.
    `progress` is called after every call that returned (the watchdog and liveness)."""
    started = time.monotonic()
    consumer = KafkaChangelogReader(client_config, changelog_topic).consumer
    try:
        wiped: set[int] = set()
        pending: set[int] = set()
        assignment: list[TopicPartition] = []
        for partition, store in stores.items():
            low, high = consumer.get_watermark_offsets(
                TopicPartition(changelog_topic, partition), timeout=10, cached=False
            )
            progress()
            stored = store.changelog_offset()
            if stored != NO_OFFSET and (stored >= high or stored + 1 < low):
                # The changelog was recreated, or retention left a gap we cannot see past.
                store.wipe()
                stored = NO_OFFSET
                wiped.add(partition)
            if stored != NO_OFFSET and stored + 1 >= high:
                continue  # nothing after our offset
            start = stored + 1 if stored != NO_OFFSET else OFFSET_BEGINNING
            assignment.append(TopicPartition(changelog_topic, partition, start))
            pending.add(partition)
        counts = dict.fromkeys(stores, 0)
        if assignment:
            consumer.assign(assignment)
        deadline = time.monotonic() + timeout_s
        while pending:
            progress()
            writes: dict[int, list[StoreWrite]] = {}
            last: dict[int, int] = {}
            for message in consumer.consume(RESTORE_BATCH, timeout=0.05):
                partition = message.partition() or 0
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(partition)
                        continue
                    raise KafkaException(error)
                key = message.key()
                if key is None:
                    continue
                writes.setdefault(partition, []).append(_store_write(key, message))
                last[partition] = max(last.get(partition, -1), message.offset() or 0)
            for partition, batch in writes.items():
                stores[partition].apply(batch, last[partition])
                counts[partition] += len(batch)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(
                    f"restoring {changelog_topic} partitions {sorted(pending)} did not reach the "
                    f"end in {timeout_s:.0f}s; an open transaction may hold the last stable offset "
                    "back. The engine rejoins and restores again."
                )
        elapsed = time.monotonic() - started
        return [RestoreReport(p, counts[p], elapsed, p in wiped) for p in stores]
    finally:
        consumer.close()


def restore_partition(
    client_config: Mapping[str, Any],
    changelog_topic: str,
    partition: int,
    store: LocalStore,
    timeout_s: float = 120.0,
) -> RestoreReport:
    """One partition (the benchmark's entry point)."""
    (report,) = restore_partitions(client_config, changelog_topic, {partition: store}, timeout_s)
    return report


def _store_write(key: bytes, message: Any) -> StoreWrite:
    status: str | None = None
    since: int | None = None
    health: str | None = None
    numbers: dict[str, int] = {}
    headers = message.headers()
    for name, value in headers if isinstance(headers, list) else []:
        if name == PENDING_HEADER and isinstance(value, bytes):
            status, since = parse_pending_header(value)
        elif name == HEALTH_HEADER and isinstance(value, bytes):
            health = value.decode()
        elif name in (PARKED_HEADER, WATERMARK_HEADER) and isinstance(value, bytes):
            numbers[name] = int(value)
    return StoreWrite(
        key.decode(),
        message.value(),
        status,
        since,
        health,
        numbers.get(PARKED_HEADER),
        numbers.get(WATERMARK_HEADER),
    )
