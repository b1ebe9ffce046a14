"""The exactly-once check shared by the crash, rebalance and broker-restart tests.

Given everything on the input topics and everything read_committed on the decisions topic:
1. every input event has exactly one answer (`decision_id == event_id`), none lost;
2. no decision id appears twice, none duplicated;
3. per session, replaying the inputs through the pure fold in the order the engine folded them
   (the `source` header of each decision) yields exactly the decisions the engine published; a
   source `watermark:<partition>:<ms>` replays the partition watermark's expiry of parked resumes;
4. every DEFERRED resume has its final answer once its partition's intents reached `PARK_MS`
   past it (bounded event time, with or without traffic of its own session).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition
from msgspec.structs import replace

from engine.core.events import (
    AckEvent,
    AckOutcome,
    Decision,
    Event,
    IntentEvent,
    ResumeEvent,
    Verdict,
)
from engine.core.fold import fold
from engine.core.state import PARK_MS, SessionState
from engine.core.watermark import expire
from engine.runtime.tasks.headers import parse_watermark_source
from engine.settings import Settings
from engine.wire import DecodeError, RecordType
from tests.integration.engine_harness import CODEC, Seen
from tests.unit.core.builders import ack, call, intent, msg, out, record, resume

U, C, OUT = msg("charge 7"), call("charge-1"), out("charge-1")
TAILS = ([U, C, OUT], [U, C], [U, C, msg("other writer")])


def workload(sessions: int, seed: int) -> list[Event]:
    """Per session: an intent, an ack, one or two resumes (two copies of one checkpoint).
    About one session in ten also has an orphan: a resume of another session naming an intent
    that never comes, `PARK_MS` earlier than the intents, so the partition watermark answers it
    (and a crash or restart in between has to keep that answer exactly once)."""
    rng = random.Random(seed)
    orphans = random.Random(seed + 1)  # apart, so the sessions above stay as they were
    events: list[Event] = []
    for n in range(sessions):
        sid = f"session-{seed}-{n}"
        tail = rng.choice(TAILS)
        t = PARK_MS + n
        chosen: list[Event] = [
            intent("e1", [OUT], [U, C], t=1_000 + t),
            ack("e2", rng.choice(list(AckOutcome)), t=1_100 + t),
            resume("e3", record([OUT], [U, C]), tail, runner="copy-a", t=2_000 + t),
        ]
        if rng.random() < 0.3:
            chosen.append(resume("e4", record([OUT], [U, C]), tail, runner="copy-b", t=2_100 + t))
        events += [replace(e, session_id=sid, event_id=f"{sid}/{e.event_id}") for e in chosen]
        if orphans.random() < 0.1:
            orphan = f"orphan-{seed}-{n}"
            lost = resume("r", record([OUT], [U, C], intent_id="never"), [U, C], t=n)
            events.append(replace(lost, session_id=orphan, event_id=orphan))
    rng.shuffle(events)  # sessions interleave, and cross-topic order is arbitrary anyway
    return events


def read_inputs(bootstrap: str, settings: Settings) -> dict[str, tuple[Event, int]]:
    """Every input record by its `topic/partition/offset`, with its offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    wanted = [(t, p) for t in settings.topics.inputs for p in range(settings.partitions)]
    consumer.assign([TopicPartition(t, p, 0) for t, p in wanted])
    found: dict[str, tuple[Event, int]] = {}
    done: set[tuple[str, int]] = set()
    try:
        while len(done) < len(wanted):
            for message in consumer.consume(1000, timeout=1.0):
                error = message.error()
                if error is not None:
                    done.add((message.topic() or "", message.partition() or 0))
                    continue
                topic, partition = message.topic() or "", message.partition() or 0
                try:
                    event = _decode_input(topic, settings, message.value() or b"")
                except DecodeError:
                    continue  # a dead letter: never folded, so never in a replay
                found[f"{topic}/{partition}/{message.offset()}"] = (event, message.offset() or 0)
    finally:
        consumer.close()
    return found


def _decode_input(topic: str, settings: Settings, value: bytes) -> Event:
    record_type = {
        settings.topics.intents: RecordType.INTENT,
        settings.topics.acks: RecordType.ACK,
    }.get(topic, RecordType.RESUME)
    model = CODEC.decode(record_type, value)
    assert isinstance(model, IntentEvent | AckEvent | ResumeEvent)
    return model


def assert_exactly_once(
    events: list[Event],
    seen: list[Seen],
    inputs: dict[str, tuple[Event, int]],
    same: Callable[[Decision], Decision] = lambda d: d,
) -> None:
    """Every input answered once, and every session's published decisions equal to the pure
    fold of its inputs in the order they were folded. `same` maps both sides before they are
    compared: decisions of an earlier release differ where SPEC §7 lists an answer changed
    without a schema change."""
    counts = Counter(s.decision.decision_id for s in seen)  # O(n): the soak checks millions
    ids = set(counts)
    duplicated = {i for i, n in counts.items() if n > 1}
    assert not duplicated, f"decisions published twice: {sorted(duplicated)[:5]}"
    missing = {e.event_id for e in events} - ids
    assert not missing, f"{len(missing)} inputs without a decision: {sorted(missing)[:5]}"

    by_session: dict[str, list[Seen]] = defaultdict(list)
    for s in sorted(seen, key=lambda s: (s.partition, s.offset)):
        by_session[s.decision.session_id].append(s)
    for session_id, published in by_session.items():
        order: list[str] = []
        for s in published:
            if not order or order[-1] != s.source:
                order.append(s.source)
        state: SessionState | None = None
        replayed: list[Decision] = []
        for source in order:
            watermark = parse_watermark_source(source)
            if watermark is not None:
                assert state is not None, f"{session_id}: expired before any input"
                state, expired = expire(state, watermark)
                replayed.extend(expired)
                continue
            event, offset = inputs[source]
            result = fold(state, event, offset)
            state = result.state
            replayed.extend(result.decisions)
        expected = [same(d) for d in replayed]
        assert expected == [same(s.decision) for s in published], f"replay differs for {session_id}"
    _assert_deferred_answered(seen, inputs)


def _assert_deferred_answered(seen: list[Seen], inputs: dict[str, tuple[Event, int]]) -> None:
    watermarks: dict[int, int] = defaultdict(lambda: -1)
    for source, (event, _) in inputs.items():
        if isinstance(event, IntentEvent):
            partition = int(source.split("/")[-2])
            watermarks[partition] = max(watermarks[partition], event.event_time_ms)
    answered = {s.decision.decision_id for s in seen}
    overdue = [
        s.decision.decision_id
        for s in seen
        if s.decision.verdict is Verdict.DEFERRED
        and s.decision.event_time_ms + PARK_MS <= watermarks[s.partition]
        and f"{s.decision.decision_id}/final" not in answered
    ]
    assert not overdue, f"{len(overdue)} DEFERRED resumes never answered: {overdue[:5]}"
