"""`reconciler topics create` against the real broker: idempotent, and strict about layout."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from engine.admin.topics import cluster_report, create_topics, verify_topics
from engine.cli import main
from engine.errors import TopicLayoutError
from engine.settings import load_settings
from tests.integration.kafka_helpers import create_topic

pytestmark = pytest.mark.kafka


def test_create_is_idempotent_and_changelog_is_compacted(
    kafka_bootstrap: str, unique_name: str
) -> None:
    settings = load_settings(
        environ={}, bootstrap_servers=kafka_bootstrap, topic_prefix=f"{unique_name}.", partitions=3
    )
    first = create_topics(settings)
    assert len(first) == 6
    assert create_topics(settings) == []

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    metadata = admin.list_topics(timeout=10)
    for name in first:
        assert len(metadata.topics[name].partitions) == 3
    resource = ConfigResource(ResourceType.TOPIC, settings.topics.changelog)
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["cleanup.policy"].value == "compact"


def test_a_topic_with_another_partition_count_is_refused(
    kafka_bootstrap: str, unique_name: str
) -> None:
    prefix = f"{unique_name}."
    create_topic(kafka_bootstrap, f"{prefix}acks", partitions=2)
    settings = load_settings(
        environ={}, bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, partitions=3
    )
    with pytest.raises(TopicLayoutError, match=r"acks=2"):
        create_topics(settings)
    with pytest.raises(TopicLayoutError, match="not co-partitioned"):
        verify_topics(settings)


def test_cli_reports_layout_error_with_exit_1(
    kafka_bootstrap: str, unique_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"{unique_name}."
    create_topic(kafka_bootstrap, f"{prefix}resumes", partitions=5)
    code = main(
        [
            "topics",
            "create",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--topic-prefix",
            prefix,
            "--partitions",
            "4",
        ]
    )
    assert code == 1
    assert "Fix:" in capsys.readouterr().err


def test_report_on_one_broker_and_a_transaction_timeout_above_the_brokers_maximum(
    kafka_bootstrap: str, unique_name: str
) -> None:
    """Would catch: RF 1 flagged on a single broker (where it is all there is), and an engine
    transaction timeout the brokers refuse (InitProducerId fails) going unreported."""
    settings = load_settings(
        environ={}, bootstrap_servers=kafka_bootstrap, topic_prefix=f"{unique_name}.", partitions=1
    )
    create_topics(settings)
    report = cluster_report(settings)
    assert report.brokers == 1
    assert report.problems == []
    assert "replication factor 1, min.insync.replicas 1" in report.facts[0]
    too_long = settings.model_copy(update={"transaction_timeout_ms": 1_000_000})
    (problem,) = cluster_report(too_long).problems
    assert "transaction.max.timeout.ms (900000)" in problem
