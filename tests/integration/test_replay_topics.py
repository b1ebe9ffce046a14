"""`reconciler replay --verify` against real topics: what a running engine published replays
identically with the current core, and a decision the core would not give is the first
difference, named by its input's topic, partition, offset, session and event id; a partition
whose head retention deleted is refused (exit 2), not folded from the middle."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from msgspec.structs import replace

from engine.cli import main
from engine.core.events import AckOutcome, Event, Reason, Verdict
from engine.core.state import PARK_MS
from tests.integration.engine_harness import (
    CODEC,
    engine_settings,
    engine_thread,
    produce,
    read_decisions,
    session_on,
)
from tests.unit.core.builders import ack, intent, msg, record, resume

pytestmark = pytest.mark.kafka

U, C, OUT = msg("charge 7"), msg("call"), msg("output")
T0 = 10_000


def _in(sid: str, event: Event) -> Event:
    return replace(event, session_id=sid, event_id=f"{sid}/{event.event_id}")


def _inputs(parts: int) -> list[Event]:
    """On partition 0: a lost ack resumed, an ack under a fence never granted (PARKED, then
    its /final from the watermark sweep), a resume whose intent never comes (the sweep too).
    On partition 1: an ordinary write resumed after its definite failure."""
    lost, early, orphan, failed = (
        session_on(p, parts, stem)
        for p, stem in ((0, "lost"), (0, "early"), (0, "orphan"), (1, "ok"))
    )
    return [
        _in(lost, intent("e1", [OUT], [U, C], t=T0)),
        _in(lost, ack("a1", AckOutcome.UNKNOWN, t=T0 + 100)),
        _in(lost, resume("q1", record([OUT], [U, C]), [U, C, OUT], t=T0 + 70_000)),
        _in(early, ack("a1", AckOutcome.NOT_WRITTEN, fence=99, t=T0 + 10)),
        _in(early, intent("e1", [OUT], [U, C], t=T0 + 20)),
        _in(orphan, resume("q1", record([OUT], [U, C], intent_id="never"), [U, C], t=T0 + 30)),
        _in(lost, intent("e2", [U], [U, C, OUT], intent_id="i2", seq=2, t=T0 + PARK_MS + 200)),
        _in(failed, intent("e1", [OUT], [U, C], t=T0)),
        _in(failed, ack("a1", AckOutcome.NOT_WRITTEN, t=T0 + 100)),
        _in(failed, resume("q1", record([OUT], [U, C]), [U, C], t=T0 + 70_000)),
    ]


def test_replay_verifies_what_the_engine_published_and_names_a_forged_answer(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    events = _inputs(settings.partitions)
    with engine_thread(settings):
        produce(kafka_bootstrap, settings, events)
        seen = read_decisions(kafka_bootstrap, settings, until=12, idle_s=2)
    answers = {s.decision.decision_id: s for s in seen}
    early = events[3].session_id
    assert answers[f"{early}/a1"].decision.reason is Reason.PARKED
    final = answers[f"{early}/a1/final"]
    assert (final.decision.verdict, final.decision.reason) == (
        Verdict.REJECTED,
        Reason.UNKNOWN_FENCE,
    )
    assert final.source.startswith("watermark:0:")
    orphan = events[5].session_id
    assert answers[f"{orphan}/q1/final"].source.startswith("watermark:0:")

    common = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", settings.topic_prefix]
    assert main(["replay", "--verify", *common, "--timeout", "30"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("partition 0: replayed 7 inputs and 2 watermark sweeps of 3 sessions")
    assert out[1].startswith("partition 1: replayed 3 inputs and 0 watermark sweeps of 1 sessions")
    assert out[2].startswith("partition 2: replayed 0 inputs and 0 watermark sweeps of 0 sessions")

    # An answer the core does not give: a new resume of the failed session, "granted" by hand.
    failed = events[7].session_id
    again = _in(failed, resume("q2", record([OUT], [U, C]), [U, C], runner="r9", t=T0 + 80_000))
    placed: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    producer.produce(
        settings.topics.resumes,
        key=failed.encode(),
        value=CODEC.encode(again),
        on_delivery=lambda _err, m: placed.append((m.partition() or 0, m.offset() or 0)),
    )
    assert producer.flush(30) == 0
    ((partition, offset),) = placed
    granted = answers[f"{failed}/q1"].decision
    forged = replace(granted, decision_id=again.event_id, in_reply_to=again.event_id, holder="r9")
    source = f"{settings.topics.resumes}/{partition}/{offset}"
    producer.produce(
        settings.topics.decisions,
        key=failed.encode(),
        value=CODEC.encode(forged),
        headers=[("source", source.encode())],
    )
    assert producer.flush(30) == 0
    code = main(["replay", "--verify", *common, "--partition", str(partition)])
    err = capsys.readouterr().err
    assert code == 1
    assert f"at {source} (session {failed}, input {again.event_id}): decision 1 of 1" in err
    assert "the current core gives" in err

    # Retention deleted the head of partition 0's decisions: folding the rest from empty states
    # would report differences that are only the missing head, so the replay refuses.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    head = TopicPartition(settings.topics.decisions, 0, 1)
    for future in admin.delete_records([head], request_timeout=30).values():
        future.result(timeout=30)
    code = main(["replay", "--verify", *common, "--partition", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{settings.topics.decisions}[0]: history truncated at offset 1" in err
    assert "retention.ms=-1" in err
