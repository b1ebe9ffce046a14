"""The cycle collector policy (collector.py): freeze after every commit, and collect the whole
heap only when the frozen set has doubled or the full interval has passed."""

from __future__ import annotations

import gc
from pathlib import Path

from engine.runtime.engine import Engine
from engine.runtime.process.collector import MIN_FROZEN, Collector
from engine.settings import load_settings
from tests.integration.engine_harness import CODEC
from tests.unit.runtime.fakes import FakeBroker, FakeClients, Faults
from tools.bench_fold import build_log


class FakeGc:
    """Counts objects as the real collector would: `alive` tracked objects, `garbage` of them
    cyclic garbage that only a full collection frees."""

    def __init__(self) -> None:
        self.alive = 0
        self.garbage = 0
        self.frozen = 0
        self.calls: list[str] = []

    def freeze(self) -> None:
        self.frozen = self.alive
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.frozen = 0
        self.calls.append("unfreeze")

    def get_freeze_count(self) -> int:
        self.calls.append("count")
        return self.frozen

    def collect(self) -> int:
        found, self.garbage = self.garbage, 0
        self.alive -= found
        self.calls.append("collect")
        return found


def test_every_commit_freezes_and_the_count_waits_for_the_check_interval() -> None:
    fake = FakeGc()
    collector = Collector(check_interval_s=10, api=fake, now=0.0)
    fake.alive = MIN_FROZEN
    assert not collector.committed(1.0)
    assert not collector.committed(9.9)
    assert fake.calls == ["freeze", "freeze"], "no walk of the heap between checks"
    assert not collector.committed(10.0), "the first count is where doubling starts from"
    assert fake.calls[-1] == "count"
    fake.alive = 2 * MIN_FROZEN
    assert not collector.committed(19.9)
    assert collector.committed(20.0)
    assert fake.calls[-3:] == ["collect", "freeze", "count"]


def test_a_full_collection_once_the_frozen_set_has_doubled() -> None:
    fake = FakeGc()
    collector = Collector(check_interval_s=1, full_interval_s=1e9, api=fake, now=0.0)
    fake.alive = 10
    assert not collector.committed(1.0)
    fake.alive = MIN_FROZEN - 1
    assert not collector.committed(2.0), "a small heap is not worth a pause"
    fake.alive, fake.garbage = MIN_FROZEN, 50
    assert collector.committed(3.0)
    assert (fake.alive, fake.frozen) == (MIN_FROZEN - 50, MIN_FROZEN - 50)
    fake.alive = 2 * (MIN_FROZEN - 50) - 1
    assert not collector.committed(4.0)
    fake.alive += 1
    assert collector.committed(5.0)
    assert collector.full_collections == 2


def test_a_full_collection_at_least_every_full_interval() -> None:
    fake = FakeGc()
    collector = Collector(check_interval_s=1, full_interval_s=60, api=fake, now=0.0)
    fake.alive, fake.garbage = 10, 3
    assert not collector.committed(1.0)
    assert not collector.committed(59.0)
    assert collector.committed(60.0)
    assert fake.alive == 7
    assert not collector.committed(61.0)


def test_with_the_real_collector_commits_freeze_what_is_alive() -> None:
    collector = Collector()
    try:
        kept = [[n] for n in range(1_000)]  # tracked objects alive at the commit
        collector.committed(0.0)
        assert gc.get_freeze_count() >= len(kept)
    finally:
        collector.close()
    assert gc.get_freeze_count() == 0


def test_the_engine_hands_every_commit_to_its_collector(tmp_path: Path) -> None:
    settings = load_settings(environ={}, partitions=2, state_dir=tmp_path, metrics_port=0)
    broker = FakeBroker(2, Faults())
    for event in build_log(10):
        broker.append(
            settings.topics.topic_for(event), event.session_id.encode(), CODEC.encode(event)
        )
    fake = FakeGc()
    clients = FakeClients(broker, batch=4)
    engine = Engine(settings, clients=clients, collector=Collector(api=fake))
    clients.on_idle = engine.stop
    engine.run()
    (histogram,) = engine.metrics.commit_seconds.collect()
    count = next(s.value for s in histogram.samples if s.name.endswith("_count"))
    assert count > 1
    assert fake.calls.count("freeze") == count
