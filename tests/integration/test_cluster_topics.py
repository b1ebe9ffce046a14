"""`reconciler topics create|verify` on three brokers: the cluster's replication factor, RF 1
refused unless forced, and the replication report."""

from __future__ import annotations

import pytest

from engine.admin.topics import cluster_report, create_topics
from engine.cli import main
from engine.errors import TopicLayoutError
from engine.settings import load_settings
from tools.kafka_cluster import Cluster

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.timeout(120)]


def test_topics_get_the_clusters_replication_and_verify_reports_it(
    cluster: Cluster, unique_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Would catch: topics created with RF 1 on a cluster (the old default), a min ISR that
    is not 2, and a report that misses the broker-side transaction settings."""
    prefix = f"{unique_name}."
    args = ["--bootstrap-servers", cluster.bootstrap, "--topic-prefix", prefix, "--partitions", "3"]
    assert main(["topics", "create", *args]) == 0
    out = capsys.readouterr().out
    assert out.count("replication factor 3, min.insync.replicas 2") == 6, out
    assert "brokers: 3" in out
    assert "broker transaction.state.log.min.isr=2" in out
    assert "broker transaction.max.timeout.ms=" in out
    assert "under-replicated partitions: 0" in out
    assert main(["topics", "verify", *args]) == 0


def test_replication_factor_1_on_a_cluster_needs_force_and_verify_flags_it(
    cluster: Cluster, unique_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Would catch: RF 1 accepted silently on several brokers (one broker loss loses data)."""
    settings = load_settings(
        environ={},
        bootstrap_servers=cluster.bootstrap,
        topic_prefix=f"{unique_name}.",
        partitions=1,
        replication_factor=1,
    )
    with pytest.raises(TopicLayoutError, match="replication factor 1 on a cluster of 3"):
        create_topics(settings)
    assert create_topics(settings, force=True)
    report = cluster_report(settings)
    assert len(report.problems) == 6
    assert "replication factor 1 on 3 brokers" in report.problems[0]
    args = ["--bootstrap-servers", cluster.bootstrap, "--topic-prefix", f"{unique_name}."]
    assert main(["topics", "verify", *args, "--partitions", "1"]) == 1
    assert "problem:" in capsys.readouterr().err


def test_a_replication_factor_above_the_broker_count_is_refused(
    cluster: Cluster, unique_name: str
) -> None:
    settings = load_settings(
        environ={},
        bootstrap_servers=cluster.bootstrap,
        topic_prefix=f"{unique_name}.",
        replication_factor=4,
    )
    with pytest.raises(TopicLayoutError, match="needs 4 brokers; the cluster has 3"):
        create_topics(settings)
