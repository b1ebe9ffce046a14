"""State record round trip and the idle-session size budget."""

from __future__ import annotations

import json

import pytest

from engine.core.errors import StateRecordError
from engine.core.events import AckOutcome, Event
from engine.core.fold import fold
from engine.core.state import SessionState
from tests.unit.core.builders import ack, call, intent, msg, out, record, resume

U, C, OUTPUT = msg("charge 7"), call("charge-1"), out("charge-1")


def _idle_state() -> SessionState:
    state = None
    events: list[Event] = [
        intent("e1", [OUTPUT], [U, C]),
        ack("k1", AckOutcome.UNKNOWN),
        resume("r", record([OUTPUT], [U, C]), [U, C, OUTPUT]),
    ]
    for pos, ev in enumerate(events):
        state = fold(state, ev, pos).state
    assert state is not None
    return state


def idle_size_bytes() -> int:
    record_ = _idle_state().to_record()
    return len(json.dumps(record_, separators=(",", ":")).encode())


def test_record_round_trip() -> None:
    state = _idle_state()
    record_ = state.to_record()
    json.dumps(record_)  # only JSON/Avro-friendly values
    assert state == SessionState.from_record(record_)


def test_idle_session_is_under_one_kilobyte() -> None:
    size = idle_size_bytes()
    print(f"idle session state: {size} bytes (compact JSON)")
    # 1 KB until session_state v2 added Binding.items_digest_stable and the parked_intents list.
    assert size < 1100


def test_corrupt_record_raises_the_core_error() -> None:
    with pytest.raises(StateRecordError):
        SessionState.from_record({"session_id": "s", "fence_token": "x"})
