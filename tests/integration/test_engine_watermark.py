"""A resume whose intent never comes is answered by its partition's intents watermark, with no
further event of its own session, also by an engine that restored the watermark from the
changelog alone (a fresh state directory)."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from engine.core.events import Event, Reason, Verdict
from engine.core.state import PARK_MS
from tests.integration.engine_harness import (
    Seen,
    engine_settings,
    engine_thread,
    produce,
    read_decisions,
    session_on,
)
from tests.integration.exactly_once import assert_exactly_once, read_inputs
from tests.unit.core.builders import call, intent, msg, out, record, resume

pytestmark = pytest.mark.kafka

U, C, OUT = msg("u"), call("c1"), out("c1")
T0 = 10_000


def _orphan(sid: str, t: int) -> Event:
    """A resume naming an intent that is never published."""
    event = resume("r", record([OUT], [U, C], intent_id="never"), [U, C], t=t)
    return replace(event, session_id=sid, event_id=f"{sid}/r")


def _intent(sid: str, t: int) -> Event:
    return replace(intent("e", [OUT], [U, C], t=t), session_id=sid, event_id=f"{sid}/e")


def _by_id(seen: list[Seen]) -> dict[str, Seen]:
    return {s.decision.decision_id: s for s in seen}


def test_an_orphan_resume_is_answered_once_other_sessions_move_the_watermark(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state-1")
    parts = settings.partitions
    first = session_on(0, parts, "orphan")
    near, late, second = (session_on(0, parts, stem) for stem in ("near", "late", "orphan-b"))
    elsewhere = session_on(1, parts, "orphan-c")
    phase1 = [_orphan(first, T0), _intent(near, T0 + PARK_MS - 1), _orphan(elsewhere, T0)]
    with engine_thread(settings):
        produce(kafka_bootstrap, settings, phase1)
        seen = read_decisions(kafka_bootstrap, settings, until=3, idle_s=1)
    assert _by_id(seen)[f"{first}/r"].decision.verdict is Verdict.DEFERRED
    assert f"{first}/r/final" not in _by_id(seen), "answered before its deadline"

    # A new engine with an empty state directory: the watermark comes back from the changelog.
    restarted = settings.model_copy(update={"state_dir": tmp_path / "state-2"})
    phase2 = [_orphan(second, T0 - 1), _intent(late, T0 + PARK_MS)]
    with engine_thread(restarted):
        produce(kafka_bootstrap, settings, phase2[:1])
        read_decisions(kafka_bootstrap, settings, until=5, idle_s=1)
        produce(kafka_bootstrap, settings, phase2[1:])
        seen = read_decisions(kafka_bootstrap, settings, until=7, idle_s=2)

    found = _by_id(seen)
    for sid, watermark in ((second, T0 + PARK_MS - 1), (first, T0 + PARK_MS)):
        final = found[f"{sid}/r/final"]
        assert (final.decision.verdict, final.decision.reason) == (
            Verdict.WITHHELD,
            Reason.INTENT_NEVER_ARRIVED,
        )
        assert final.decision.alert
        assert final.source == f"watermark:0:{watermark}"
    # Partition 1's intents never moved: its orphan still waits (bounded by *its* intents).
    assert f"{elsewhere}/r/final" not in found
    assert found[f"{elsewhere}/r"].decision.verdict is Verdict.DEFERRED
    assert len(seen) == 7
    assert_exactly_once(phase1 + phase2, seen, read_inputs(kafka_bootstrap, settings))
