"""Shared fixtures. Tests marked `kafka` talk to a real Apache Kafka broker.

`make test` starts the broker and passes its address in RECONCILER_TEST_BOOTSTRAP. A plain
`pytest` run without it starts a broker of its own (instance `pytest`) the first time a kafka test
asks, and stops it at the end of the session. A failing kafka test prints the broker log tail.

Tests marked `cluster` also get three brokers behind the fault proxy (tools/kafka_cluster.py):
started once per session by the first test that asks, stopped at its end (or the running cluster
named by RECONCILER_TEST_CLUSTER, left running). After each test every fault is healed, every
stopped broker started again and the ISR full, so no test inherits another's fault.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator

import pytest

from tools import kafka_cluster, kafka_local, toxiproxy

CLUSTER_INSTANCE = "pytest-cluster"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """host:port of a running real Kafka broker."""
    given = os.environ.get("RECONCILER_TEST_BOOTSTRAP")
    if given:
        yield given
        return
    instance = "pytest"
    already = kafka_local.read_info(instance)
    try:
        info = kafka_local.start(instance, fresh=already is None)
    except kafka_local.SetupError as exc:
        pytest.fail(f"could not start the test broker: {exc}")
    yield info.bootstrap
    if already is None:
        kafka_local.stop(instance)


@pytest.fixture(scope="session")
def kafka_instance(kafka_bootstrap: str) -> str:
    """The kafka_local instance name of the test broker (for tests that restart it)."""
    return os.environ.get("RECONCILER_TEST_INSTANCE", "pytest")


@pytest.fixture(scope="session")
def kafka_cluster_session() -> Iterator[kafka_cluster.Cluster]:
    """The three-broker cluster of this pytest session (see the module docstring)."""
    given = os.environ.get("RECONCILER_TEST_CLUSTER")
    if given:
        yield kafka_cluster.connect(given)
        return
    try:
        cluster = kafka_cluster.start(CLUSTER_INSTANCE, fresh=True)
    except (kafka_local.SetupError, toxiproxy.ProxyError) as exc:
        pytest.fail(f"could not start the test cluster: {exc}")
    yield cluster
    kafka_cluster.stop(CLUSTER_INSTANCE)


@pytest.fixture
def cluster(kafka_cluster_session: kafka_cluster.Cluster) -> Iterator[kafka_cluster.Cluster]:
    """The session's cluster, whole and healed before and after the test."""
    kafka_cluster_session.recover()
    yield kafka_cluster_session
    kafka_cluster_session.recover()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A topic/group/transactional-id stem nobody else uses."""
    return f"t-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and item.get_closest_marker("kafka") is not None:
        instance = os.environ.get("RECONCILER_TEST_INSTANCE", "pytest")
        report.sections.append(("kafka broker log", kafka_local.tail(instance, 40)))
    if report.failed and item.get_closest_marker("cluster") is not None:
        name = os.environ.get("RECONCILER_TEST_CLUSTER", CLUSTER_INSTANCE)
        for node in (1, 2, 3):
            tail = kafka_local.tail(kafka_cluster.node_instance(name, node), 15)
            report.sections.append((f"cluster broker {node} log", tail))
    return report
