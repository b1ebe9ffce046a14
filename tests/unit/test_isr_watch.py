"""engine/admin/isr_watch.py: the reason /readyz gives while the brokers refuse the engine's
writes, from the ISR the metadata reports (a stand-in admin client; the cluster tests run it
against three real brokers)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.admin.isr_watch import IsrWatch
from engine.runtime.metrics import EngineMetrics, serve_health
from engine.settings import load_settings


@dataclass
class _Partition:
    replicas: list[int]
    isrs: list[int]


@dataclass
class _Topic:
    partitions: dict[int, _Partition]


@dataclass
class _Metadata:
    topics: dict[str, _Topic] = field(default_factory=dict)


class _Admin:
    def __init__(self, metadata: _Metadata) -> None:
        self.metadata = metadata

    def list_topics(self, timeout: float) -> _Metadata:
        return self.metadata


def _watch(isrs: dict[str, list[list[int]]]) -> tuple[IsrWatch, EngineMetrics]:
    settings = load_settings(environ={}, topic_prefix="p.", bootstrap_servers="127.0.0.1:1")
    metrics = EngineMetrics()
    watch = IsrWatch(settings, metrics)
    metadata = _Metadata(
        {
            topic: _Topic({p: _Partition([1, 2, 3], isr) for p, isr in enumerate(lists)})
            for topic, lists in isrs.items()
        }
    )
    admin: Any = _Admin(metadata)
    watch.admin = admin
    watch.min_isr = dict.fromkeys(watch.topics, 2)
    watch._configs_read = time.monotonic()
    return watch, metrics


def _gauge(metrics: EngineMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None
    return value


def test_isr_below_min_insync_replicas_is_the_reason() -> None:
    watch, metrics = _watch({"p.decisions": [[1, 2, 3], [2], [3]], "p.changelog": [[1, 2]]})
    reason = watch.check()
    assert reason is not None
    assert "min.insync.replicas on p.decisions/1 (1 in sync), p.decisions/2 (1 in sync)" in reason
    assert _gauge(metrics, "reconciler_partitions_under_min_isr") == 2
    assert _gauge(metrics, "reconciler_partitions_under_replicated") == 3


def test_a_replica_out_of_the_isr_alone_refuses_nothing() -> None:
    watch, metrics = _watch({"p.decisions": [[1, 2], [2, 3], [1, 2, 3]]})
    assert watch.check() is None
    assert _gauge(metrics, "reconciler_partitions_under_min_isr") == 0
    assert _gauge(metrics, "reconciler_partitions_under_replicated") == 2


def test_readyz_answers_503_with_the_reason() -> None:
    metrics = EngineMetrics()
    metrics.set_ready(True)
    metrics.writes_refused = "in-sync replicas below min.insync.replicas on p.decisions/0"
    server = serve_health(metrics, 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/readyz"
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 503
        assert b"not ready: in-sync replicas below min.insync.replicas" in refused.value.read()
        metrics.writes_refused = None
        with urllib.request.urlopen(url, timeout=5) as reply:
            assert reply.status == 200
    finally:
        server.shutdown()
