"""The fault layer itself (tools/kafka_cluster.py, tools/toxiproxy.py): each fault does to a
client what it claims, and only to clients going through the proxy."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tools.kafka_cluster import Cluster

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.timeout(120)]


def _metadata_seconds(bootstrap: str, timeout_s: float) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    started = time.monotonic()
    admin.list_topics(timeout=timeout_s)
    return time.monotonic() - started


def test_proxy_faults_reach_clients_and_not_the_brokers(cluster: Cluster) -> None:
    """Would catch: advertised listeners that bypass the proxy (a partition would not isolate
    the engine), a partition that also cuts inter-broker traffic (the ISR would shrink), a
    latency toxic that is not applied, or a heal that leaves a toxic behind."""
    assert _metadata_seconds(cluster.bootstrap, 10) < 2
    cluster.faults.latency(200)
    # A fresh client: connect + ApiVersions + Metadata through the proxy, each answer delayed.
    assert _metadata_seconds(cluster.bootstrap, 10) >= 0.4
    cluster.faults.heal()
    cluster.faults.partition_all()
    with pytest.raises(KafkaException):
        _metadata_seconds(cluster.bootstrap, 3)
    assert _metadata_seconds(cluster.direct_bootstrap, 10) < 2, "direct listener must not be cut"
    time.sleep(1)
    assert cluster.under_replicated() == [], "a client partition must not touch replication"
    cluster.faults.heal()
    assert _metadata_seconds(cluster.bootstrap, 10) < 2


def test_kill_moves_leadership_and_restart_refills_the_isr(
    cluster: Cluster, unique_name: str
) -> None:
    """Would catch: RF below 3 or no min ISR 2 by default, a kill that leaves the broker
    running, a fencing timeout above the documented 6 s, or a restart on other ports/data."""
    admin = AdminClient({"bootstrap.servers": cluster.direct_bootstrap})
    admin.create_topics([NewTopic(unique_name, 3)])[unique_name].result(timeout=30)
    deadline = time.monotonic() + 30
    while len(cluster.partitions(unique_name)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    replicas = {p: meta.replicas for p, meta in cluster.partitions(unique_name).items()}
    assert all(len(r) == 3 for r in replicas.values()), replicas
    victim = cluster.leaders(unique_name)[0]
    killed = time.monotonic()
    cluster.kill(victim)
    assert not cluster.is_up(victim)
    while (
        victim in cluster.leaders(unique_name).values()
        or -1 in cluster.leaders(unique_name).values()
    ):
        assert time.monotonic() - killed < 15, "leadership did not move within 15 s of kill -9"
        time.sleep(0.2)
    assert any(f"{unique_name}/" in name for name in cluster.under_replicated())
    cluster.start_node(victim)
    cluster.wait_in_sync(timeout_s=60)
    assert victim in cluster.registered_brokers()
