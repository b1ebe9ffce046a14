"""A rolling upgrade of the state format, on a real broker: an engine of the previous release
(it writes session_state v2) fills the changelog; the current engine, starting on an empty state
directory, restores from that v2 changelog alone and answers exactly as the pure fold does; its
own changes are written in the current version, so the partition then holds both versions side
by side."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from engine.core.events import AckEvent, Event, IntentEvent, ResumeEvent
from engine.core.fold import replay
from engine.core.state import SessionState
from engine.runtime.tasks import task
from engine.settings import Settings
from engine.wire import POLICY, SHIPPED_SCHEMAS, Codec, RecordType
from tests.integration.engine_harness import engine_settings, engine_thread, produce, read_decisions
from tools.bench_fold import session_events

pytestmark = pytest.mark.kafka

SESSIONS = range(8)
STATE_POLICY = POLICY[RecordType.SESSION_STATE]
VERSION_OF = {
    SHIPPED_SCHEMAS.get(RecordType.SESSION_STATE, v).fingerprint: v for v in STATE_POLICY.supported
}


def _changelog(bootstrap: str, settings: Settings) -> list[tuple[str, bytes]]:
    """Every (key, value) of the changelog topic, in order per partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"changelog-reader-{time.time_ns()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([settings.topics.changelog])
    records: list[tuple[str, bytes]] = []
    quiet_since = time.monotonic()
    try:
        while time.monotonic() - quiet_since < 3:
            for message in consumer.consume(1000, timeout=0.3):
                assert message.error() is None, message.error()
                if message.value():
                    records.append(((message.key() or b"").decode(), message.value() or b""))
                quiet_since = time.monotonic()
    finally:
        consumer.close()
    return records


def test_a_v2_changelog_restores_into_the_current_engine_which_writes_the_current_version(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lifecycles = {n: session_events(n) for n in SESSIONS}
    writes: list[Event] = [
        e for n in SESSIONS for e in lifecycles[n] if isinstance(e, IntentEvent | AckEvent)
    ]
    resumes: list[Event] = [
        e for n in SESSIONS for e in lifecycles[n] if isinstance(e, ResumeEvent)
    ]

    # The previous release: the same engine, writing the state as session_state v2.
    old_codec = Codec()
    with monkeypatch.context() as patch:
        patch.setattr(task, "encode_state", lambda state: old_codec.encode(state, version=2))
        settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state-old")
        with engine_thread(settings):
            produce(kafka_bootstrap, settings, writes)
            read_decisions(kafka_bootstrap, settings, until=len(writes), idle_s=1)
    before = _changelog(kafka_bootstrap, settings)
    assert {VERSION_OF[value[2:10]] for _, value in before} == {2}
    assert {key for key, _ in before} == {e.session_id for e in writes}

    # The current engine on an empty state directory: everything it knows comes from v2 records.
    upgraded = settings.model_copy(update={"state_dir": tmp_path / "state-new"})
    with engine_thread(upgraded):
        produce(kafka_bootstrap, settings, resumes)
        seen = read_decisions(kafka_bootstrap, settings, until=len(writes) + len(resumes))

    answers = {s.decision.decision_id: s.decision for s in seen}
    expected = {d.decision_id: d for d in replay(e for n in SESSIONS for e in lifecycles[n])}
    assert set(answers) == set(expected)
    for decision_id, decision in expected.items():
        got = answers[decision_id]
        assert (got.verdict, got.reason) == (decision.verdict, decision.reason), decision_id

    after = _changelog(kafka_bootstrap, settings)
    versions = [VERSION_OF[value[2:10]] for _, value in after]
    assert set(versions) == {2, STATE_POLICY.current}, (
        "a mixed changelog: the old records stay until compaction"
    )
    latest = {key: value for key, value in after}
    assert {VERSION_OF[value[2:10]] for value in latest.values()} == {STATE_POLICY.current}
    for key, value in after:  # every version in the topic reads, to a state of its own key
        state = old_codec.decode(RecordType.SESSION_STATE, value)
        assert isinstance(state, SessionState)
        assert state.session_id == key
