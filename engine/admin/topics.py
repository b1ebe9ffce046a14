"""Create and verify the engine's topics.

Invariants the engine relies on, checked here before it starts:
1. The three input topics and the decisions and changelog topics have the same partition count,
   so partition p of every one of them belongs to the same task (co-partitioning; records are
   keyed by session id with the Java murmur2 partitioner everywhere).
2. The changelog is compacted: it keeps the latest state of every session forever.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from engine.admin.brokers import quiet_config
from engine.errors import KafkaUnavailableError, TopicLayoutError
from engine.settings import Settings

ADMIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TopicSpec:
    """One topic of the layout: its name, partition count and topic configuration."""

    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic of the design with its partition count and configuration."""
    names = settings.topics
    n = settings.partitions
    plain = {"cleanup.policy": "delete"}
    return [
        TopicSpec(names.intents, n, plain),
        TopicSpec(names.acks, n, plain),
        TopicSpec(names.resumes, n, plain),
        TopicSpec(names.decisions, n, plain),
        # A dead letter keeps the refused value verbatim (up to the codec's 1 MiB record limit)
        # plus its position and reason, so it may be larger than the broker's default limit.
        TopicSpec(
            names.dead_letters,
            n,
            {"cleanup.policy": "delete", "retention.ms": "-1", "max.message.bytes": "2200000"},
        ),
        TopicSpec(
            names.changelog,
            n,
            # Small segments let the cleaner compact soon; the latest state per session stays.
            {
                "cleanup.policy": "compact",
                "segment.ms": "600000",
                "min.cleanable.dirty.ratio": "0.1",
            },
        ),
    ]


def _describe(admin: AdminClient) -> dict[str, int]:
    try:
        metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"no answer from the brokers ({exc}).",
            "check --bootstrap-servers / RECONCILER_BOOTSTRAP_SERVERS and that Kafka is up.",
        ) from exc
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


def create_topics(settings: Settings) -> list[str]:
    """Create the missing topics, verify the existing ones; returns the names created.

    Idempotent: running it again changes nothing and succeeds while the layout is right.
    """
    admin = AdminClient(quiet_config(settings))
    existing = _describe(admin)
    specs = topic_specs(settings)
    missing = [spec for spec in specs if spec.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(s.name, s.partitions, settings.replication_factor, config=s.config)
                for s in missing
            ],
            operation_timeout=ADMIN_TIMEOUT_S,
        )
        for name, future in futures.items():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":  # a concurrent creator won
                    raise TopicLayoutError(
                        f"creating topic {name} failed: {exc}.", "check the broker log and ACLs."
                    ) from exc
        _await_metadata(admin, [spec.name for spec in missing])
    verify_topics(settings, admin)
    return [spec.name for spec in missing]


def _await_metadata(admin: AdminClient, names: list[str]) -> None:
    """A created topic can be missing from the next metadata answer for a moment."""
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while not set(names) <= _describe(admin).keys() and time.monotonic() < deadline:
        time.sleep(0.2)


def verify_topics(settings: Settings, admin: AdminClient | None = None) -> None:
    """Raise TopicLayoutError unless every topic exists, co-partitioned, changelog compacted."""
    admin = admin or AdminClient(quiet_config(settings))
    existing = _describe(admin)
    specs = topic_specs(settings)
    absent = [spec.name for spec in specs if spec.name not in existing]
    if absent:
        raise TopicLayoutError(
            f"topics missing: {', '.join(absent)}.", "run `reconciler topics create`."
        )
    counts = {spec.name: existing[spec.name] for spec in specs}
    if len(set(counts.values())) != 1 or settings.partitions not in counts.values():
        listing = ", ".join(f"{name}={count}" for name, count in counts.items())
        raise TopicLayoutError(
            f"topics are not co-partitioned with {settings.partitions} partitions ({listing}).",
            "every input, decisions and changelog topic needs the same partition count: set "
            "RECONCILER_PARTITIONS to the existing count, or recreate the odd topics.",
        )
    changelog = settings.topics.changelog
    resource = ConfigResource(ResourceType.TOPIC, changelog)
    described = admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    policy = described["cleanup.policy"].value
    if policy != "compact":  # "compact,delete" would delete the last state of idle sessions
        raise TopicLayoutError(
            f"the changelog topic {changelog} has cleanup.policy={policy}, not compact.",
            f"set cleanup.policy=compact on {changelog} (kafka-configs --alter).",
        )


def delete_topics(settings: Settings) -> list[str]:
    """Delete every topic of the layout that exists (the demo's cleanup); returns their names.

    Only for throw-away prefixes: the changelog holds the sessions' state.
    """
    admin = AdminClient(quiet_config(settings))
    existing = _describe(admin)
    names = [spec.name for spec in topic_specs(settings) if spec.name in existing]
    if not names:
        return []
    for name, future in admin.delete_topics(names, operation_timeout=ADMIN_TIMEOUT_S).items():
        try:
            future.result()
        except KafkaException as exc:
            raise TopicLayoutError(
                f"deleting topic {name} failed: {exc}.", "check the broker log and ACLs."
            ) from exc
    return names
