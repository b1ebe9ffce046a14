"""`reconciler run --processes 2`: two engine children in one consumer group share the
partitions, and every input is still answered exactly once, also when one child is killed -9
mid-load (the supervisor restarts it under the same static group member id). Failover: a
killed instance's partitions answer again within a bound set by the group's timers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from engine.core.events import Binding, Decision, ResumeEvent
from engine.runtime.clients import consumer_config
from engine.runtime.commit.fencing import owner_metadata, transactional_id
from engine.settings import Settings
from engine.wire import RecordType
from tests.integration.engine_harness import (
    CODEC,
    EngineProcess,
    engine_settings,
    produce,
    read_decisions,
    session_on,
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
        seen = read_decisions(
            kafka_bootstrap, settings, until=len(events), timeout_s=180, inputs=True
        )
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


# Failover (engine/runtime/commit/fencing.py, step A0). The dead owner's transaction timeout is
# set far above the group's session timeout, so a new owner that waited for it would miss the bound.
FAILOVER = {"session_timeout_ms": 3_000, "transaction_timeout_ms": 30_000}

ZOMBIE = """
import os, sys
from confluent_kafka import Consumer, Producer, TopicPartition
bootstrap, group, txn_id, metadata, decisions, *inputs = sys.argv[1:]
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                     "transaction.timeout.ms": int(os.environ["TXN_TIMEOUT_MS"])})
producer.init_transactions(30)
group_metadata = Consumer({"bootstrap.servers": bootstrap, "group.id": group}
                          ).consumer_group_metadata()
offsets = [TopicPartition(t, int(p), 0, metadata=metadata)
           for t, p in (i.rsplit(":", 1) for i in inputs)]
for last in ((True,) if os.environ.get("FIRST") else (False, True)):  # FIRST: no commit before
    producer.begin_transaction()
    producer.send_offsets_to_transaction(offsets, group_metadata, 30)
    if not last:
        producer.commit_transaction(30)
for p in {o.partition for o in offsets}:  # records that hold back the decisions' LSO
    producer.produce(decisions, value=b"never committed", partition=p)
producer.flush(30)
print("open", flush=True)
os._exit(0)  # killed inside its transaction: offsets pending, records open
"""


def _probes(settings: Settings, tag: str) -> list[ResumeEvent]:
    """One resume of a new session on every partition: each gets a final answer at once."""
    return [
        ResumeEvent(
            event_id=sid,
            session_id=sid,
            event_time_ms=int(time.time() * 1000),
            runner_id="r",
            checkpoint_id="c",
            binding=Binding(backend_id="sqlite:failover", namespace="failover"),
        )
        for sid in (session_on(p, settings.partitions, tag) for p in range(settings.partitions))
    ]


def _wait_answers(bootstrap: str, settings: Settings, ids: set[str], timeout_s: float) -> float:
    """Monotonic time when every id had a final answer (read_committed), or AssertionError."""
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.time_ns()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        }
    )
    reader.subscribe([settings.topics.decisions])
    left = set(ids)
    deadline = time.monotonic() + timeout_s
    try:
        while left and time.monotonic() < deadline:
            for message in reader.consume(500, timeout=0.1):
                if message.error() is None:
                    decision = CODEC.decode(RecordType.DECISION, message.value() or b"")
                    if isinstance(decision, Decision) and decision.final:
                        left.discard(decision.in_reply_to)
        assert not left, f"no final answer within {timeout_s:.0f} s to {sorted(left)}"
        return time.monotonic()
    finally:
        reader.close()


@pytest.mark.timeout(180)
def test_a_dead_owners_open_transaction_is_fenced_not_waited_for(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    """An instance that died inside a transaction (offsets pending, decisions written) left
    the group. The next owner of its partitions answers before that transaction would have
    timed out: without step A0 the committed-offset read and every read_committed reader of
    the decisions wait for the timeout."""
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state", **FAILOVER)
    gone = settings.model_copy(update={"instance_id": "gone"})
    inputs = [f"{t}:{p}" for t in settings.topics.inputs for p in range(settings.partitions)]
    opened = time.monotonic()
    zombie = subprocess.run(
        [
            *(sys.executable, "-c", ZOMBIE, kafka_bootstrap, settings.group_id),
            *(transactional_id(gone), owner_metadata(gone), settings.topics.decisions, *inputs),
        ],
        env=os.environ | {"TXN_TIMEOUT_MS": str(settings.transaction_timeout_ms)},
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert zombie.stdout.strip() == b"open", zombie.stderr
    probes = _probes(settings, "after-death")
    engine = EngineProcess(settings, tmp_path / "engine.log").start()
    try:
        produce(kafka_bootstrap, settings, probes)
        budget_s = settings.transaction_timeout_ms / 1000
        answered = _wait_answers(kafka_bootstrap, settings, {p.event_id for p in probes}, budget_s)
    finally:
        engine.kill_all()
    log = (tmp_path / "engine.log").read_text()
    assert f"fenced ['{transactional_id(gone)}']" in log, "step A0 did not fence the dead owner"
    assert answered - opened < budget_s


@pytest.mark.timeout(240)
def test_a_killed_instances_partitions_answer_again_before_its_transaction_timeout(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    """Two instances under a steady load; one is killed -9 (supervisor and engine: a pod
    gone). Decisions on its partitions come back once the coordinator drops it (session
    timeout) and the survivor is assigned them, not when the killed instance's open
    transaction times out."""
    base = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state", **FAILOVER)
    instances = [
        base.model_copy(update={"instance_id": n, "state_dir": tmp_path / n}) for n in ("a", "b")
    ]
    procs = [EngineProcess(s, tmp_path / f"{s.instance_id}.log").start() for s in instances]
    stop = threading.Event()

    def load() -> None:  # keeps transactions opening on every partition
        n = 0
        while not stop.is_set():
            produce(kafka_bootstrap, base, _probes(base, f"load-{n}"))
            n += 1
            time.sleep(0.02)

    loader = threading.Thread(target=load, daemon=True)
    try:
        wait_for_two_busy_members(base)
        loader.start()
        _wait_answers(kafka_bootstrap, base, {p.event_id for p in _probes(base, "load-5")}, 60)
        killed = time.monotonic()
        procs[0].kill_all()
        probes = _probes(base, "after-kill")
        produce(kafka_bootstrap, base, probes)
        ids = {p.event_id for p in probes}
        answered = _wait_answers(kafka_bootstrap, base, ids, base.transaction_timeout_ms / 1000)
    finally:
        stop.set()
        if loader.is_alive():
            loader.join(timeout=60)
        for proc in procs:
            if proc.alive():
                proc.kill_all()
    elapsed = answered - killed
    heartbeat_s = consumer_config(base)["heartbeat.interval.ms"] / 1000
    print(
        f"failover: decisions on every partition {elapsed:.1f} s after the kill (session "
        f"timeout {base.session_timeout_ms / 1000:.0f} s, heartbeat {heartbeat_s:.1f} s)"
    )
    # The coordinator drops the killed member after the session timeout and the survivor
    # hears of it at its next heartbeat; a killed instance's open transaction (about half the
    # time under this load) would add the transaction timeout, ten times the session timeout.
    assert elapsed < base.transaction_timeout_ms / 1000
    # The killed instance has an open transaction only about half the time, when the bound
    # above holds without A0 too: the survivor's A0 must have fenced it in every run.
    survivor_log = (tmp_path / "b.log").read_text()
    victim = transactional_id(instances[0])
    assert f"fenced ['{victim}']" in survivor_log, "step A0 did not fence the killed instance"


def _committed_owners(settings: Settings) -> dict[str, str | None]:
    """The offset metadata of every input partition's last stable commit (None: none)."""
    admin = AdminClient(settings.client_config())
    wanted = [
        TopicPartition(t, p) for t in settings.topics.inputs for p in range(settings.partitions)
    ]
    request = ConsumerGroupTopicPartitions(settings.group_id, wanted)
    result = admin.list_consumer_group_offsets([request])[settings.group_id].result(10)
    return {f"{tp.topic}:{tp.partition}": tp.metadata or None for tp in result.topic_partitions}


@pytest.mark.timeout(180)
def test_an_owner_that_dies_inside_its_first_transaction_is_fenced(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    """A0's blind spot, closed by the owner mark: an instance assigned partitions that nobody has
    committed with its id yet names itself in their committed offsets before its first
    transaction. It dies inside that transaction (offsets pending, decisions written); the
    next owner fences it instead of waiting for its transaction timeout. The check is the
    survivor's log line (A0 fenced the victim); the bound of the transaction timeout (30 s)
    on the answers only guards against a hang (with the fence they came after ~4 s)."""
    base = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state", **FAILOVER)
    victim, survivor = (
        base.model_copy(update={"instance_id": n, "state_dir": tmp_path / n}) for n in ("v", "s")
    )
    proc = EngineProcess(victim, tmp_path / "v.log").start()
    try:
        deadline = time.monotonic() + 60
        while "step A2" not in (tmp_path / "v.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        owners = _committed_owners(base)
    finally:
        proc.kill_all()  # no input yet: it never began a transaction
    # the owner mark landed before any transaction: every input partition names the victim
    assert set(owners.values()) == {owner_metadata(victim)}, owners
    inputs = [f"{t}:{p}" for t in base.topics.inputs for p in range(base.partitions)]
    opened = time.monotonic()
    zombie = subprocess.run(  # the victim's first transaction, under its id, left open
        [
            *(sys.executable, "-c", ZOMBIE, kafka_bootstrap, base.group_id),
            *(transactional_id(victim), owner_metadata(victim), base.topics.decisions, *inputs),
        ],
        env=os.environ | {"TXN_TIMEOUT_MS": str(base.transaction_timeout_ms), "FIRST": "1"},
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert zombie.stdout.strip() == b"open", zombie.stderr
    probes = _probes(base, "after-first")
    engine = EngineProcess(survivor, tmp_path / "s.log").start()
    try:
        produce(kafka_bootstrap, base, probes)
        budget_s = base.transaction_timeout_ms / 1000
        answered = _wait_answers(kafka_bootstrap, base, {p.event_id for p in probes}, budget_s)
    finally:
        engine.kill_all()
    print(
        f"first-transaction failover: every partition answered {answered - opened:.1f} s "
        f"after the victim's transaction opened"
    )
    log = (tmp_path / "s.log").read_text()
    assert f"fenced ['{transactional_id(victim)}']" in log, "A0 did not fence the victim"
    assert answered - opened < budget_s
