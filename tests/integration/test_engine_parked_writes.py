"""A parked ack and a parked intent whose awaited input never comes are answered finally by the
engine's partition watermark, with no further input of their own session (SPEC.md §6 "Parked
inputs"), and the answers replay exactly (`assert_exactly_once`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from engine.core.events import AckOutcome, Event, Reason, Verdict
from engine.core.state import PARK_MS
from tests.integration.engine_harness import (
    engine_settings,
    engine_thread,
    produce,
    read_decisions,
    session_on,
)
from tests.integration.exactly_once import assert_exactly_once, read_inputs
from tests.unit.core.builders import ack, call, intent, msg, out

pytestmark = pytest.mark.kafka

U, C, OUT = msg("u"), call("c1"), out("c1")
T0 = 10_000


def test_the_watermark_answers_a_parked_ack_and_a_fenced_intent(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    quiet, other = (session_on(0, settings.partitions, stem) for stem in ("quiet", "other"))
    waiting: list[Event] = [
        # A commit under a fence the engine never granted, and an intent under it.
        ack("a", AckOutcome.COMMITTED, intent_id="i1", fence=7, t=T0),
        intent("i", [OUT], [U, C], fence=7, t=T0 + 1),
    ]
    waiting = [replace(e, session_id=quiet, event_id=f"{quiet}/{e.event_id}") for e in waiting]
    mover = intent("e", [OUT], [U, C], t=T0 + 1 + PARK_MS)
    mover = replace(mover, session_id=other, event_id=f"{other}/e")
    with engine_thread(settings):
        produce(kafka_bootstrap, settings, waiting)
        read_decisions(kafka_bootstrap, settings, until=2, idle_s=1)
        produce(kafka_bootstrap, settings, [mover])
        seen = read_decisions(kafka_bootstrap, settings, until=5, idle_s=2)
    found = {s.decision.decision_id: s for s in seen}
    assert found[f"{quiet}/a"].decision.reason is Reason.PARKED
    assert found[f"{quiet}/i"].decision.reason is Reason.PARKED
    ack_final, intent_final = found[f"{quiet}/a/final"], found[f"{quiet}/i/final"]
    assert (ack_final.decision.verdict, ack_final.decision.reason) == (
        Verdict.REJECTED,
        Reason.UNKNOWN_FENCE,
    )
    assert ack_final.decision.alert  # the Session may hold a write no grant accounts for
    assert (intent_final.decision.verdict, intent_final.decision.reason) == (
        Verdict.REJECTED,
        Reason.UNKNOWN_FENCE,
    )
    assert ack_final.source == intent_final.source == f"watermark:0:{T0 + 1 + PARK_MS}"
    assert len(seen) == 5
    assert_exactly_once([*waiting, mover], seen, read_inputs(kafka_bootstrap, settings))
