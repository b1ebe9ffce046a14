"""Create and verify the engine's topics.

Invariants the engine relies on, checked here before it starts:
1. The three input topics and the decisions and changelog topics have the same partition count,
   so partition p of every one of them belongs to the same task (co-partitioning; records are
   keyed by session id with the Java murmur2 partitioner everywhere).
2. The changelog is compacted: it keeps the latest state of every session forever.

On a cluster of several brokers `cluster_report` also reads what exactly-once across a broker
loss needs: the replication factor and `min.insync.replicas` of every topic, the partitions whose
ISR lacks a replica, and the broker-side settings the chart documents (`default.replication.factor`,
`min.insync.replicas`, `transaction.state.log.replication.factor` and `.min.isr`,
`transaction.max.timeout.ms`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
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


def _broker_config(admin: AdminClient, broker_id: int) -> dict[str, str]:
    resource = ConfigResource(ResourceType.BROKER, str(broker_id))
    described = admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    return {name: entry.value for name, entry in described.items()}


def _replication_factor(settings: Settings, admin: AdminClient, force: bool) -> int:
    """The replication factor for new topics: the setting, else the cluster's default; -1 lets
    the broker apply its default when its configuration cannot be read (no DescribeConfigs)."""
    brokers = sorted(admin.list_topics(timeout=ADMIN_TIMEOUT_S).brokers)
    wanted = settings.replication_factor
    if wanted is None:
        try:
            wanted = int(_broker_config(admin, brokers[0])["default.replication.factor"])
        except (KafkaException, KeyError, ValueError):
            return -1
    if wanted > len(brokers):
        raise TopicLayoutError(
            f"replication factor {wanted} needs {wanted} brokers; the cluster has {len(brokers)}.",
            "set RECONCILER_REPLICATION_FACTOR (--replication-factor) to the broker count or less.",
        )
    if wanted == 1 and len(brokers) > 1 and not force:
        raise TopicLayoutError(
            f"replication factor 1 on a cluster of {len(brokers)} brokers: losing one broker would "
            "stop (or lose) the partitions it holds.",
            "use --replication-factor 3 (with min.insync.replicas=2), or --force to accept it.",
        )
    return wanted


def create_topics(settings: Settings, force: bool = False) -> list[str]:
    """Create the missing topics, verify the existing ones; returns the names created.

    Idempotent: running it again changes nothing and succeeds while the layout is right.
    `force` accepts replication factor 1 on a cluster of several brokers.
    """
    admin = AdminClient(quiet_config(settings))
    existing = _describe(admin)
    specs = topic_specs(settings)
    missing = [spec for spec in specs if spec.name not in existing]
    if missing:
        factor = _replication_factor(settings, admin, force)
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, factor, config=s.config) for s in missing],
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
    described = _topic_config(admin, changelog)
    policy = described["cleanup.policy"].value
    if policy != "compact":  # "compact,delete" would delete the last state of idle sessions
        raise TopicLayoutError(
            f"the changelog topic {changelog} has cleanup.policy={policy}, not compact.",
            f"set cleanup.policy=compact on {changelog} (kafka-configs --alter).",
        )


def _topic_config(admin: AdminClient, topic: str) -> Any:
    """A topic's configuration. One created a moment ago can still be unknown to the broker
    asked (metadata reaches the brokers one by one: seen on three brokers right after
    `create_topics`), so UNKNOWN_TOPIC_OR_PART is asked again until ADMIN_TIMEOUT_S."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while True:
        try:
            return admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            unknown = exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            if not unknown or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class ClusterReport:
    """What `topics verify` prints: facts, and the problems that make it exit non-zero."""

    brokers: int
    facts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    under_replicated: list[str] = field(default_factory=list)


def cluster_report(settings: Settings, admin: AdminClient | None = None) -> ClusterReport:
    """Replication of the engine's topics and the broker settings exactly-once relies on.

    Problems: replication factor 1 with several brokers; `min.insync.replicas` of 1 with a
    replication factor of 3 or more (an acknowledged decision could live on one broker only) or
    not below the replication factor (one broker down stops every write); a broker's
    `transaction.max.timeout.ms` below the engine's transaction timeout (the producer is refused);
    the transaction state topic with fewer replicas than the topics. Under-replicated partitions
    are reported, not a problem: a rolling restart has them for a while.
    """
    admin = admin or AdminClient(quiet_config(settings))
    try:
        metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"no answer from the brokers ({exc}).", "check that Kafka is up, then run it again."
        ) from exc
    report = ClusterReport(brokers=len(metadata.brokers))
    names = [spec.name for spec in topic_specs(settings) if spec.name in metadata.topics]
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    configs = admin.describe_configs(resources) if resources else {}
    least_rf = 0
    for name, resource in zip(names, resources, strict=True):
        partitions = metadata.topics[name].partitions
        rf = min(len(p.replicas) for p in partitions.values())
        least_rf = min(least_rf or rf, rf)
        min_isr = int(
            configs[resource].result(timeout=ADMIN_TIMEOUT_S)["min.insync.replicas"].value
        )
        report.facts.append(f"{name}: replication factor {rf}, min.insync.replicas {min_isr}")
        report.under_replicated += [
            f"{name}/{p}" for p, meta in partitions.items() if len(meta.isrs) < len(meta.replicas)
        ]
        if rf == 1 and report.brokers > 1:
            report.problems.append(
                f"{name} has replication factor 1 on {report.brokers} brokers: recreate it with "
                "replication factor 3 (kafka-reassign-partitions can add replicas in place)."
            )
        elif rf >= 3 and min_isr < 2:
            report.problems.append(
                f"{name} has min.insync.replicas {min_isr}: set it to 2 (kafka-configs --alter),"
                " so an acknowledged decision is on two brokers."
            )
        elif rf > 1 and min_isr >= rf:
            report.problems.append(
                f"{name} has min.insync.replicas {min_isr} with replication factor {rf}: one broker"
                f" down stops every write; set it to {rf - 1}."
            )
    try:
        broker = _broker_config(admin, min(metadata.brokers))
    except KafkaException as exc:
        report.facts.append(f"broker settings not readable ({exc}); not checked")
        return report
    for key in (
        "default.replication.factor",
        "min.insync.replicas",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "transaction.max.timeout.ms",
    ):
        report.facts.append(f"broker {key}={broker.get(key)}")
    max_timeout = int(broker.get("transaction.max.timeout.ms") or 0)
    if max_timeout < settings.transaction_timeout_ms:
        report.problems.append(
            f"the brokers' transaction.max.timeout.ms ({max_timeout}) is below the engine's "
            f"transaction timeout ({settings.transaction_timeout_ms} ms): raise it on the brokers"
            " or lower RECONCILER_TRANSACTION_TIMEOUT_MS."
        )
    state_rf = int(broker.get("transaction.state.log.replication.factor") or 0)
    if least_rf and state_rf < min(least_rf, 3):
        report.problems.append(
            f"transaction.state.log.replication.factor is {state_rf}, below the topics' {least_rf}:"
            " losing that broker loses every transaction's outcome; set it to 3 (with"
            " transaction.state.log.min.isr=2) before the first transaction."
        )
    return report


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
