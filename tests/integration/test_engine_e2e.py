"""End to end: events produced by a plain confluent-kafka producer become the expected
decisions on the decisions topic (read_committed); bad records go to dead letters."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from engine.core.events import AckOutcome, Decision, Event, Reason, Verdict
from engine.wire import DecodeReason
from tests.integration.engine_harness import (
    CODEC,
    Seen,
    engine_settings,
    engine_thread,
    produce,
    produce_raw,
    read_dead_letters,
    read_decisions,
)
from tests.unit.core.builders import ack, call, intent, msg, out, record, resume

pytestmark = pytest.mark.kafka

U, C, OUT = msg("charge 7"), call("charge-1"), out("charge-1")


def for_session(sid: str, events: list[Event]) -> list[Event]:
    return [replace(e, session_id=sid, event_id=f"{sid}/{e.event_id}") for e in events]


def final_answer(seen: list[Seen], event_id: str) -> Decision:
    """The final decision for an input: a parked resume is answered again (`/final`)."""
    by_id = {s.decision.decision_id: s.decision for s in seen}
    return by_id.get(f"{event_id}/final") or by_id[event_id]


def answered(seen: list[Seen], events: list[Event]) -> bool:
    ids = {s.decision.decision_id for s in seen}
    return all(e.event_id in ids for e in events)


def scenario(sid: str, tail: list[dict[str, str]]) -> list[Event]:
    return for_session(
        sid,
        [
            intent("e1", [OUT], [U, C]),
            ack("e2", AckOutcome.UNKNOWN),
            resume("e3", record([OUT], [U, C]), tail),
        ],
    )


CASES = {
    "lost-ack": ([U, C, OUT], Verdict.CONTINUE, Reason.COMMITTED),
    "atomic-failure": ([U, C], Verdict.APPEND_ONCE, Reason.UNCHANGED),
    "changed-history": ([U, C, msg("other writer")], Verdict.WITHHELD, Reason.AMBIGUOUS),
}


def test_decisions_for_produced_events(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    events = [e for name, (tail, _, _) in CASES.items() for e in scenario(name, tail)]
    copies = for_session(
        "two-copies",
        [
            intent("e1", [OUT], [U, C]),
            ack("e2", AckOutcome.UNKNOWN),
            resume("e3", record([OUT], [U, C]), [U, C], runner="copy-a"),
            resume("e4", record([OUT], [U, C]), [U, C], runner="copy-b"),
        ],
    )
    with engine_thread(settings):
        produce(kafka_bootstrap, settings, events)
        # the second copy's resume is produced after the first is decided, as in real life
        produce(kafka_bootstrap, settings, copies[:3])
        first = read_decisions(kafka_bootstrap, settings, until=len(events) + 3, idle_s=1)
        assert answered(first, events + copies[:3])
        assert final_answer(first, "two-copies/e3").grants
        produce(kafka_bootstrap, settings, copies[3:])
        seen = read_decisions(kafka_bootstrap, settings, until=len(events) + 4)

    assert answered(seen, events + copies)
    ids = [s.decision.decision_id for s in seen]
    assert len(set(ids)) == len(ids), "a decision was produced twice"
    for name, (_, verdict, reason) in CASES.items():
        final = final_answer(seen, f"{name}/e3")
        assert (final.verdict, final.reason) == (verdict, reason), name
    granted = final_answer(seen, "two-copies/e3")
    second = final_answer(seen, "two-copies/e4")
    assert granted.verdict is Verdict.APPEND_ONCE
    assert granted.fence_token is not None
    assert second.verdict is Verdict.WITHHELD
    assert second.holder == "copy-a"
    # decisions land in the partition of their session (the runner reads only that one)
    from engine.wire.partitioner import partition_for

    for s in seen:
        assert s.partition == partition_for(s.decision.session_id, settings.partitions)
        assert s.source.startswith(settings.topic_prefix)


def test_bad_input_goes_to_dead_letters_and_good_input_is_decided(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    good = scenario("good", [U, C, OUT])
    valid_intent = CODEC.encode(good[0])
    bad: list[tuple[str, bytes | None, bytes]] = [
        (settings.topics.intents, b"good", b""),  # empty
        (settings.topics.intents, b"good", b"not avro at all"),  # bad magic
        (settings.topics.intents, b"good", valid_intent[:-3]),  # truncated
        (settings.topics.acks, b"good", valid_intent),  # an intent on the acks topic
        (settings.topics.intents, b"someone-else", valid_intent),  # key is not the session
    ]
    with engine_thread(settings) as engine:
        for topic, key, value in bad:
            produce_raw(kafka_bootstrap, topic, [(key, value)])
        produce(kafka_bootstrap, settings, good)
        seen = read_decisions(kafka_bootstrap, settings, until=len(good))
        letters = read_dead_letters(kafka_bootstrap, settings, until=len(bad))
        assert engine.tasks, "the engine kept running with its tasks"
        registry = engine.metrics.registry
        assert (
            registry.get_sample_value("reconciler_dead_letters_total", {"reason": "BAD_MAGIC"}) == 1
        )
        assert (
            registry.get_sample_value(
                "reconciler_decisions_total", {"verdict": "CONTINUE", "reason": "COMMITTED"}
            )
            == 1
        )
        assert (registry.get_sample_value("reconciler_ready") or 0) == 1
        assert (registry.get_sample_value("reconciler_decision_latency_seconds_count") or 0) >= 3
    assert answered(seen, good)
    assert final_answer(seen, "good/e3").verdict is Verdict.CONTINUE
    assert len(letters) == len(bad)
    reasons = sorted(letter.reason for letter in letters)
    assert DecodeReason.BAD_MAGIC in reasons
    assert DecodeReason.EMPTY in reasons or DecodeReason.TRUNCATED in reasons
    assert DecodeReason.WRONG_RECORD_TYPE in reasons
    assert DecodeReason.INVALID_FIELDS in reasons  # key mismatch
    assert {(lt.value or b"") for lt in letters} == {value for _, _, value in bad}
    assert all(lt.source_topic.startswith(settings.topic_prefix) for lt in letters)
