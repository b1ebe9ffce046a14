"""Step A0's pure parts: who committed an offset, and whom a new owner may fence; and its one
deadline (fake admin and producers on a fake clock)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from confluent_kafka import TopicPartition

from engine.runtime.clients import producer_config
from engine.runtime.commit.fencing import (
    METADATA_PREFIX,
    fence_previous_owners,
    owner_metadata,
    owner_of,
    to_fence,
    transactional_id,
)
from engine.runtime.engine import Engine
from engine.runtime.tasks.assignment import Assignment
from engine.settings import Settings, load_settings
from tests.unit.runtime.fakes import FakeBroker, FakeClients, Faults


def _settings(tmp_path: Path, instance: str = "engine-3") -> Settings:
    return load_settings(
        environ={},
        group_id="g",
        instance_id=instance,
        state_dir=tmp_path / "state",
        metrics_port=0,
    )


def test_the_metadata_names_the_producers_transactional_id(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert (
        producer_config(settings)["transactional.id"] == transactional_id(settings) == "g-engine-3"
    )
    assert owner_of(owner_metadata(settings)) == "g-engine-3"


def test_metadata_not_written_by_the_engine_names_no_owner() -> None:
    assert owner_of(None) is None
    assert owner_of("") is None
    assert owner_of("g-engine-3") is None  # someone else's commit: never fenced on a guess
    assert owner_of(METADATA_PREFIX) is None


def test_only_previous_owners_that_left_the_group_are_fenced() -> None:
    previous = ["g-a", "g-b", None, "g-a", "g-me", "g-c"]
    members = {"g-b", "g-me"}
    assert to_fence(previous, members, own="g-me") == ["g-a", "g-c"]
    assert to_fence(previous, {"g-a", "g-b", "g-c"}, own="g-me") == []
    assert to_fence([None, None], set(), own="g-me") == []


def test_step_4_offsets_carry_the_metadata_once_set() -> None:
    owned = Assignment(["in"])
    owned.add([TopicPartition("in", 0)])
    owned.tasks[0] = object()  # type: ignore[assignment]  # positions() asks which are ready
    owned.start_at([TopicPartition("in", 0, 7)])
    (plain,) = owned.positions()
    assert plain.offset == 7
    assert plain.metadata is None
    owned.metadata = "reconciler-owner:g-x"
    (tagged,) = owned.positions()
    assert tagged.offset == 7
    assert tagged.metadata == "reconciler-owner:g-x"


def test_an_engine_commits_under_its_own_name(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "engine-9")
    engine = Engine(settings, clients=FakeClients(FakeBroker(settings.partitions, Faults())))
    assert engine.owned.metadata == owner_metadata(settings)
    assert owner_of(engine.owned.metadata) == producer_config(settings)["transactional.id"]


class _Result:
    """A future already resolved; each look at it costs `step_s` of the fake clock."""

    def __init__(self, value: Any, now: list[float], step_s: float) -> None:
        self.value, self.now, self.step_s = value, now, step_s

    def result(self, timeout: float) -> Any:
        self.now[0] += self.step_s
        return self.value


class _Admin:
    def __init__(self, now: list[float], owners: list[str]) -> None:
        self.now, self.owners = now, owners

    def list_consumer_group_offsets(
        self, requests: list[Any], require_stable: bool, request_timeout: float
    ) -> dict[str, _Result]:
        tps = [
            TopicPartition("in", p, 5, metadata=METADATA_PREFIX + owner)
            for p, owner in enumerate(self.owners)
        ]
        return {"g": _Result(SimpleNamespace(topic_partitions=tps), self.now, 1.0)}

    def describe_consumer_groups(
        self, groups: list[str], request_timeout: float
    ) -> dict[str, _Result]:
        members = [SimpleNamespace(group_instance_id="engine-3")]
        return {"g": _Result(SimpleNamespace(members=members), self.now, 1.0)}


class _FencingProducer:
    """Each init_transactions takes 3 s of the fake clock."""

    def __init__(self, now: list[float], config: dict[str, Any]) -> None:
        self.now, self.txn_id = now, config["transactional.id"]
        self.timeouts: list[float] = []
        self.closed = False

    def init_transactions(self, timeout: float) -> None:
        self.timeouts.append(timeout)
        self.now[0] += 3.0

    def close(self) -> bool:
        self.closed = True
        return True


def test_a0_has_one_deadline_for_all_its_calls_and_closes_every_producer(
    tmp_path: Path,
) -> None:
    now = [100.0]
    dead = [f"engine-{i}" for i in (4, 5, 6, 7, 8)]
    made: list[_FencingProducer] = []

    def producer(config: dict[str, Any]) -> _FencingProducer:
        made.append(_FencingProducer(now, config))
        return made[-1]

    report = fence_previous_owners(
        _settings(tmp_path),
        [TopicPartition("in", p) for p in range(len(dead))],
        10.0,
        clock=lambda: now[0],
        admin_client=lambda config: _Admin(now, [f"g-{d}" for d in dead]),
        producer=producer,
    )
    # lookups 2 s, then fences of 3 s each: the third starts at 8 s with 2 s left, and the
    # deadline has passed before the fourth, which is not tried
    assert report.fenced == ("g-engine-4", "g-engine-5", "g-engine-6")
    assert report.failed == ("g-engine-7", "g-engine-8")
    assert [p.timeouts for p in made] == [[8.0], [5.0], [2.0]]
    assert all(p.closed for p in made)
    assert report.lookup_s == 2.0
