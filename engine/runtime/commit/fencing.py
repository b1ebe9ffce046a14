"""Step A0: end a dead previous owner's open transaction at once instead of at its timeout.

An instance killed inside a transaction leaves it open on the broker until the coordinator
times it out (`transaction.timeout.ms` from the transaction's start, plus the broker's abort
sweep, `transaction.abort.timed.out.transaction.cleanup.interval.ms`: 10 s by Kafka's
default). Until then its records hold back the last stable offset of every partition they
landed in: the new owner's decisions on those partitions are invisible to read_committed
readers, and a pending offset commit makes the new owner's committed-offset read wait.

Every transaction's offsets carry the committing producer's `transactional.id` as offset
metadata (`owner_metadata`). A new owner reads it (last stable commit, no waiting), asks the
coordinator who is in the group now, and for each previous owner that is not a member calls
`init_transactions` under that id: the coordinator aborts its open transaction and fences it,
exactly what the dead instance's own restart would do. Why this is safe: COMMIT_PROTOCOL.md,
"A0 under every interleaving".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from engine.settings import Settings

log = logging.getLogger("reconciler.engine")

METADATA_PREFIX = "reconciler-owner:"
"""Offset metadata of our commits: this prefix and the producer's transactional.id."""


def transactional_id(settings: Settings, instance_id: str | None = None) -> str:
    """The stable transactional.id of an instance of this group (clients.py's producer)."""
    return f"{settings.group_id}-{instance_id or settings.instance_id}"


def owner_metadata(settings: Settings) -> str:
    return METADATA_PREFIX + transactional_id(settings)


def owner_of(metadata: str | None) -> str | None:
    """The transactional.id a committed offset names, or None (none, or not written by us)."""
    if metadata and metadata.startswith(METADATA_PREFIX):
        return metadata[len(METADATA_PREFIX) :] or None
    return None


def to_fence(previous: Iterable[str | None], members: Iterable[str], own: str) -> list[str]:
    """Previous owners' ids that are neither this instance nor a member of the group now."""
    alive = set(members) | {own}
    return sorted({p for p in previous if p is not None and p not in alive})


@dataclass(frozen=True)
class FenceReport:
    fenced: tuple[str, ...]  # transactional.ids whose open transaction was ended
    failed: tuple[str, ...] = ()  # tried and not done: their transaction times out instead
    skipped: str = ""  # why nothing was tried, when the lookup itself failed
    lookup_s: float = 0.0  # reading the previous owners and the members


def fence_previous_owners(
    settings: Settings,
    partitions: Iterable[TopicPartition],
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    admin_client: Callable[[dict[str, Any]], Any] = AdminClient,
    producer: Callable[[dict[str, Any]], Any] = Producer,
) -> FenceReport:
    """A0 for these input partitions, all of it within `timeout_s` (the lookups and every
    fencing call share one deadline: A0 delays the assignment, so its cost must not grow with
    the number of dead owners). Never raises; the report says what was done."""
    config = settings.client_config()
    started = clock()
    deadline = started + timeout_s

    def left() -> float:
        return max(0.0, deadline - clock())

    admin = admin_client(config)
    try:
        previous = _previous_owners(admin, settings.group_id, list(partitions), left())
        members = _member_ids(admin, settings, left())
    except (KafkaException, TimeoutError, OSError) as exc:
        return FenceReport((), (), f"previous owners not known ({exc})")
    finally:
        # AdminClient has no close(): dropping the last reference destroys its librdkafka
        # handle now (reference counting) rather than whenever the collector runs.
        del admin
    lookup_s = clock() - started
    fenced, failed = [], []
    for txn_id in to_fence(previous.values(), members, transactional_id(settings)):
        remaining = left()
        if remaining > 0 and _fence(
            producer, config, txn_id, settings.transaction_timeout_ms, remaining
        ):
            fenced.append(txn_id)
        else:
            failed.append(txn_id)
    return FenceReport(tuple(fenced), tuple(failed), lookup_s=lookup_s)


def _previous_owners(
    admin: AdminClient, group: str, partitions: list[TopicPartition], timeout_s: float
) -> Mapping[tuple[str, int], str | None]:
    # require_stable=False: the last *stable* commit, returned at once; a stable read is what
    # waits for the open transaction this step wants to end.
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(tp.topic, tp.partition) for tp in partitions]
    )
    futures = admin.list_consumer_group_offsets(
        [request], require_stable=False, request_timeout=timeout_s
    )
    result: Any = futures[group].result(timeout=timeout_s)
    return {(tp.topic, tp.partition): owner_of(tp.metadata) for tp in result.topic_partitions}


def _member_ids(admin: AdminClient, settings: Settings, timeout_s: float) -> set[str]:
    futures = admin.describe_consumer_groups([settings.group_id], request_timeout=timeout_s)
    group: Any = futures[settings.group_id].result(timeout=timeout_s)
    return {
        transactional_id(settings, member.group_instance_id)
        for member in group.members
        if member.group_instance_id
    }


def _fence(
    producer: Callable[[dict[str, Any]], Any],
    config: Mapping[str, Any],
    txn_id: str,
    txn_timeout_ms: int,
    timeout_s: float,
) -> bool:
    client = producer(
        {**config, "transactional.id": txn_id, "transaction.timeout.ms": txn_timeout_ms}
    )
    try:
        # Returns once the coordinator has aborted the id's open transaction and bumped its
        # epoch; another instance fencing the same id at once may fence this producer instead,
        # which ends the same transaction just as well.
        client.init_transactions(timeout_s)
        return True
    except KafkaException as exc:
        log.info("step A0: fencing %s did not finish: %s", txn_id, exc)
        return False
    finally:
        # It produced nothing and holds no transaction: closing it only ends its threads and
        # connections, one client per dead owner per assignment otherwise left to the collector.
        client.close()
