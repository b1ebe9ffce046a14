"""Step A0's pure parts: who committed an offset, and whom a new owner may fence."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import TopicPartition

from engine.runtime.assignment import Assignment
from engine.runtime.clients import producer_config
from engine.runtime.engine import Engine
from engine.runtime.fencing import (
    METADATA_PREFIX,
    owner_metadata,
    owner_of,
    to_fence,
    transactional_id,
)
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
