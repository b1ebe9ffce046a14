"""`reconciler run --processes 2`: two engine children in one consumer group share the
partitions, and every input is still answered exactly once, also when one child is killed -9
mid-load (the supervisor restarts it under the same static group member id).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from engine.settings import Settings
from tests.integration.engine_harness import (
    EngineProcess,
    engine_settings,
    produce,
    read_decisions,
)
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload

pytestmark = pytest.mark.kafka


def engine_children(supervisor_pid: int) -> list[int]:
    """The supervisor's children, whichever of its threads started them."""
    pids: list[int] = []
    for task in Path(f"/proc/{supervisor_pid}/task").iterdir():
        children = task / "children"
        if children.exists():
            pids += [int(pid) for pid in children.read_text().split()]
    return sorted(pids)


def group_members(settings: Settings) -> dict[str, int]:
    """Member client id -> partitions assigned, as the group coordinator sees it now."""
    admin = AdminClient(settings.client_config())
    group = admin.describe_consumer_groups([settings.group_id])[settings.group_id].result(10)
    return {
        member.client_id + member.member_id: len(member.assignment.topic_partitions)
        for member in group.members
    }


def wait_for_two_busy_members(settings: Settings, timeout_s: float = 90) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    members: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            members = group_members(settings)
        except KafkaException:  # the group or its coordinator does not exist yet
            members = {}
        if len(members) == 2 and all(members.values()):
            return members
        time.sleep(0.5)
    raise AssertionError(f"the group never had two members with partitions: {members}")


@pytest.mark.timeout(300)
def test_two_processes_share_the_partitions_and_answer_everything_exactly_once(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    events = workload(300, seed=12)
    half = len(events) // 2
    engine = EngineProcess(
        settings, tmp_path / "engine.log", extra_env={"RECONCILER_PROCESSES": "2"}
    ).start()
    assert engine.proc is not None
    try:
        produce(kafka_bootstrap, settings, events[:half])
        members = wait_for_two_busy_members(settings)
        assert sum(members.values()) == 3 * settings.partitions  # three co-partitioned inputs
        children = engine_children(engine.proc.pid)
        assert len(children) == 2
        os.kill(children[0], signal.SIGKILL)  # the supervisor restarts it
        produce(kafka_bootstrap, settings, events[half:])
        seen = read_decisions(kafka_bootstrap, settings, until=len(events), timeout_s=180)
        wait_for_two_busy_members(settings)  # the restarted child rejoined and got work again
        assert engine.terminate() == 0, "SIGTERM must drain both children and exit 0"
    finally:
        if engine.alive():
            engine.kill_all()
    inputs = read_inputs(kafka_bootstrap, settings)
    assert len(inputs) == len(events)
    assert_exactly_once(events, seen, inputs)
    log = (tmp_path / "engine.log").read_text()
    assert "restart #1" in log, "the killed child was not restarted"
    for n in (0, 1):  # each child has its own transactional id and state folder
        assert f"'instance_id': '{settings.instance_id}-{n}'" in log
        assert (tmp_path / "state" / f"process-{n}").is_dir()
