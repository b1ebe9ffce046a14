"""Who holds which partition, whether every partition answers, and steady runner traffic: the
checks of the tests that hand partitions between engine instances (upgrade, network partition).

Every function takes the bootstrap it talks to, so a test on the cluster points them at the
direct listener, outside any fault it injects into the engine's connections."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from engine.core.events import Binding, Decision, Event, ResumeEvent
from engine.settings import Settings
from engine.wire import RecordType
from tests.integration.engine_harness import CODEC, session_on

Encode = Callable[[Event], bytes]
"""How the runners write an input: the current schemas (`CODEC.encode`), or older versions."""


def _producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )


def members(bootstrap: str, group_id: str) -> dict[str, tuple[str, set[int]]]:
    """Static member id -> (the coordinator's member id of its current join, the partition
    numbers it holds). A process that joins under a static id gets a new member id."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    group = admin.describe_consumer_groups([group_id])[group_id].result(10)
    return {
        member.group_instance_id or member.member_id: (
            member.member_id,
            {tp.partition for tp in member.assignment.topic_partitions},
        )
        for member in group.members
    }


def owners(bootstrap: str, group_id: str) -> dict[str, set[int]]:
    """Static member id -> the partition numbers it holds, as the group coordinator sees it."""
    return {name: parts for name, (_, parts) in members(bootstrap, group_id).items()}


def member_ids(bootstrap: str, settings: Settings, timeout_s: float = 30) -> dict[str, str]:
    """Static member id -> the member id of its current join, as the coordinator sees it now."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return {name: mid for name, (mid, _) in members(bootstrap, settings.group_id).items()}
        except (KafkaException, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wait_for_holders(
    bootstrap: str,
    settings: Settings,
    want: set[str],
    timeout_s: float,
    replaced: Mapping[str, str] | None = None,
) -> tuple[float, dict[str, set[int]]]:
    """Seconds until exactly the members `want` hold partitions and every partition is held,
    and who holds what then.

    `replaced`: static member id -> the member id its stopped process joined with. A stopped
    static member keeps its partitions until its session times out (seconds), so each of
    these must hold partitions under a newer member id: the replacement's own join."""
    stale = dict(replaced or {})
    started = time.monotonic()
    found: dict[str, tuple[str, set[int]]] = {}
    while time.monotonic() - started < timeout_s:
        # a group still forming or rebalancing: no answer, or not in time
        with contextlib.suppress(KafkaException, TimeoutError):
            found = members(bootstrap, settings.group_id)
        holding = {name for name, (_, parts) in found.items() if parts}
        held: set[int] = set().union(*(parts for _, parts in found.values()))
        joined = all(found.get(name, (old, set()))[0] != old for name, old in stale.items())
        if holding == want and held == set(range(settings.partitions)) and joined:
            return time.monotonic() - started, {n: parts for n, (_, parts) in found.items()}
        time.sleep(0.2)
    not_joined = sorted(n for n, old in stale.items() if found.get(n, (old, set()))[0] == old)
    never = f"; no join of a replacement (only the stopped process's member, or none): {not_joined}"
    raise AssertionError(
        f"after {timeout_s:.0f}s the group is {found}, not held by {sorted(want)}"
        + (never if not_joined else "")
    )


def end_offsets(bootstrap: str, settings: Settings) -> dict[tuple[str, int], int]:
    """The end offset of every input partition now: inputs at or past it are produced later."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        return {
            (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
            for t in settings.topics.inputs
            for p in range(settings.partitions)
        }
    finally:
        consumer.close()


def sessions_carried(
    inputs: dict[str, tuple[Event, int]],
    partitions: set[int],
    before: tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]],
    after: dict[tuple[str, int], int],
) -> set[str]:
    """Sessions on `partitions` with an input produced in the window `before` (from, to) and
    one produced from `after` on: state one owner wrote that the next one had to read.
    `inputs` as `exactly_once.read_inputs` returns them."""
    start, end = before
    earlier: set[str] = set()
    later: set[str] = set()
    for source, (event, offset) in inputs.items():
        topic, partition_text, _ = source.rsplit("/", 2)
        tp = (topic, int(partition_text))
        if tp[1] not in partitions:
            continue
        if start[tp] <= offset < end[tp]:
            earlier.add(event.session_id)
        elif offset >= after[tp]:
            later.add(event.session_id)
    return earlier & later


def probes(settings: Settings, tag: str) -> list[Event]:
    """A resume of a new session on every partition: each gets a final answer at once."""
    return [
        ResumeEvent(
            event_id=sid,
            session_id=sid,
            event_time_ms=1,
            runner_id="r",
            checkpoint_id="c",
            binding=Binding(backend_id="sqlite:probe", namespace="probe"),
        )
        for sid in (session_on(p, settings.partitions, tag) for p in range(settings.partitions))
    ]


def every_partition_answers(
    bootstrap: str, settings: Settings, tag: str, timeout_s: float, encode: Encode = CODEC.encode
) -> tuple[list[Event], float]:
    """Sends `probes` and waits for their final answers (read_committed): the probes sent and
    the seconds it took; AssertionError after `timeout_s`."""
    sent = probes(settings, tag)
    started = time.monotonic()
    producer = _producer(bootstrap)
    for event in sent:
        producer.produce(
            settings.topics.topic_for(event), key=event.session_id.encode(), value=encode(event)
        )
    assert producer.flush(30) == 0, "probes not delivered within 30 s"
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
    left = {p.event_id for p in sent}
    try:
        while left and time.monotonic() - started < timeout_s:
            for message in reader.consume(500, timeout=0.2):
                if message.error() is None:
                    decision = CODEC.decode(RecordType.DECISION, message.value() or b"")
                    if isinstance(decision, Decision) and decision.final:
                        left.discard(decision.in_reply_to)
    finally:
        reader.close()
    assert not left, f"no final answer within {timeout_s:.0f} s to {sorted(left)}"
    return sent, time.monotonic() - started


@contextlib.contextmanager
def runner_traffic(
    bootstrap: str,
    settings: Settings,
    events: list[Event],
    per_second: float = 150,
    encode: Encode = CODEC.encode,
) -> Iterator[list[Event]]:
    """`events` produced at about `per_second` until they run out or the block ends; yields
    the list of those handed over, complete once the block is left and every one delivered."""
    sent: list[Event] = []
    failures: list[str] = []
    stop = threading.Event()

    def load() -> None:
        producer = _producer(bootstrap)
        started = time.monotonic()
        for n, event in enumerate(events):
            if stop.is_set():
                break
            pause = started + n / per_second - time.monotonic()
            if pause > 0:
                producer.poll(0)
                time.sleep(pause)
            producer.produce(
                settings.topics.topic_for(event),
                key=event.session_id.encode(),
                value=encode(event),
            )
            sent.append(event)
        if producer.flush(60) != 0:
            failures.append("inputs not delivered within 60 s")

    loader = threading.Thread(target=load, name="runners", daemon=True)
    loader.start()
    try:
        yield sent
    finally:
        stop.set()
        loader.join(timeout=90)
    assert not loader.is_alive(), "the runner traffic did not stop"
    assert not failures, failures
