"""Shared fixtures. Tests marked `kafka` talk to a real Apache Kafka broker.

`make test` starts the broker and passes its address in RECONCILER_TEST_BOOTSTRAP. A plain
`pytest` run without it starts a broker of its own (instance `pytest`) the first time a kafka test
asks, and stops it at the end of the session. A failing kafka test prints the broker log tail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator

import pytest

from tools import kafka_local


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
    return report
