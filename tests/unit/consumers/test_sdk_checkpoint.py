"""The SDK checkpoint reader accepts and refuses exactly what openai-agents 0.24.0 does."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.errors import SdkCheckpointError
from consumers.sdk_checkpoint import (
    BASE_KEYS,
    COMPACTION_KEYS,
    HELD_KEYS,
    PENDING_WRITE_KEY,
    SDK_SCHEMA_VERSIONS,
    pending_record,
    read_pending_session_write,
)
from engine.core.digest import item_digest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "wire" / "sdk_run_state"
EXPECTED = {
    "v1_18_compaction_metadata.json": True,
    "v1_19_held_pending_session_write.json": True,
    "v1_18_held_pending_session_write.json": False,
    "v1_18_pending_input_session_write.approx.json": False,
}
CALL = {"arguments": "{}", "call_id": "c1", "name": "write_thing", "type": "function_call"}
OUTPUT = {"call_id": "c1", "output": "wrote", "type": "function_call_output"}


def _load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return document


def _accepts(document: dict[str, Any]) -> bool:
    try:
        read_pending_session_write(document)
    except SdkCheckpointError:
        return False
    return True


def _sdk_accepts(document: dict[str, Any]) -> bool:
    """The real loader: openai-agents 0.24.0 ``RunState.from_json``."""
    from agents import Agent, RunState
    from agents.exceptions import UserError

    try:
        asyncio.run(RunState.from_json(Agent(name="compat-agent"), copy.deepcopy(document)))
    except UserError as error:
        message = str(error)
    else:
        return True
    # Only the loader's own refusals count; the base documents pass everything else.
    assert "pending Session write" in message or "schema version" in message, message
    return False


@pytest.mark.parametrize(("name", "accepted"), sorted(EXPECTED.items()))
def test_reference_fixture_verdict(name: str, accepted: bool) -> None:
    assert _accepts(_load(name)) is accepted


def test_reference_fixture_verdicts_agree_with_the_installed_sdk() -> None:
    for name in EXPECTED:
        assert _accepts(_load(name)) is _sdk_accepts(_load(name)), name


def test_held_fixture_reads_into_a_held_record() -> None:
    write = read_pending_session_write(_load("v1_19_held_pending_session_write.json"))
    assert write is not None
    assert (write.held, write.before, write.current_response, write.persisted_count) == (
        True,
        None,
        (0, 0),
        2,
    )
    record = pending_record(write, intent_id="in-1", ignore_ids=False)
    assert [facts.call_id for facts in record.items] == ["call_held_1", "call_held_1"]
    assert record.items[0].digest == item_digest(write.items[0], ignore_ids=False)


def test_compaction_fixture_before_is_not_usable_by_the_engine() -> None:
    """The SDK's own fixture stores 'digest-1' as a digest: accepted there, unusable here."""
    write = read_pending_session_write(_load("v1_18_compaction_metadata.json"))
    assert write is not None
    assert (write.append_acknowledged, write.before) == (True, ("digest-1", "digest-2"))
    with pytest.raises(SdkCheckpointError, match="the engine cannot use it: before"):
        pending_record(write, intent_id="in-1", ignore_ids=False)


def test_absent_or_null_record_is_no_pending_write() -> None:
    document = _load("v1_19_held_pending_session_write.json")
    document[PENDING_WRITE_KEY] = None
    assert read_pending_session_write(document) is None
    del document[PENDING_WRITE_KEY]
    assert read_pending_session_write(document) is None


def _base(label: str, current_turn: int, step: Any) -> dict[str, Any]:
    document = _load("v1_19_held_pending_session_write.json")
    document.pop(PENDING_WRITE_KEY)
    document["$schemaVersion"] = label
    document["current_turn"] = current_turn
    document["current_step"] = step
    return document


@pytest.mark.parametrize("label", ["1.16", *SDK_SCHEMA_VERSIONS])
def test_base_documents_without_a_pending_write_load_in_the_sdk(label: str) -> None:
    """Guards the differential test: its mutations are the only reason for a refusal."""
    document = _base(label, 1, {"type": "next_step_run_again"})
    assert _sdk_accepts(document)
    assert read_pending_session_write(document) is None


DIGEST = "ab" * 32
VALUES: dict[str, list[Any]] = {
    "session_id": ["s1", 7, None],
    "items": [[CALL, OUTPUT], [CALL], [], [CALL, "x"], "items", None],
    "before": [None, [], [DIGEST], [DIGEST, 3], "x"],
    "persisted_count": [0, 2, -1, True, 2.0, "2", None],
    "response_id": [None, "resp_1", 5],
    "store": [None, True, False, "yes", 0],
    "has_local_tool_outputs": [True, False, None, 1],
    "append_acknowledged": [True, False, None, "true"],
    "compaction_model_exchange": [
        {"item_digests": [DIGEST], "reasoning_item_id_policy": None},
        {"item_digests": [DIGEST], "reasoning_item_id_policy": "omit"},
        {"item_digests": [1], "reasoning_item_id_policy": None},
        {"item_digests": [], "reasoning_item_id_policy": "drop"},
        {"item_digests": []},
        [],
    ],
    "held": [True, False, "true", 1, None],
    "reasoning_item_id_policy": [None, "preserve", "omit", "keep"],
    "current_response": [
        {"turn": 0, "start": 0},
        {"turn": 1, "start": 2},
        {"turn": 2, "start": 0},
        {"turn": 0, "start": 3},
        {"turn": True, "start": 0},
        {"turn": 0},
        {"turn": 0, "start": 0, "extra": 1},
        "x",
    ],
    "pending_input": [[]],
}
# How many leading entries of each VALUES list are well-typed (the rest are mutations).
WELL_TYPED = {
    "session_id": 1,
    "items": 2,
    "before": 3,
    "store": 3,
    "reasoning_item_id_policy": 3,
    "current_response": 3,
}
STEPS = [
    {"type": "next_step_run_again"},
    {"type": "next_step_interruption", "data": {"interruptions": []}},
    None,
    {"type": "next_step_final_output"},
]


def _often(draw: st.DrawFn) -> bool:
    """True three times in four (Hypothesis does not draw integers uniformly)."""
    return draw(st.sampled_from([True, True, True, False]))


@st.composite
def mutated_documents(draw: st.DrawFn) -> dict[str, Any]:
    label = draw(st.sampled_from([*SDK_SCHEMA_VERSIONS, "1.19", "1.21", "1.16"]))
    step = draw(st.sampled_from(STEPS[:2] if _often(draw) else STEPS))
    document = _base(label, draw(st.sampled_from([0, 1, 2])), step)
    # Mostly well-formed records (so acceptance paths are reached), then mutated.
    keys = set(BASE_KEYS)
    keys |= draw(st.sets(st.sampled_from(sorted(COMPACTION_KEYS | HELD_KEYS)), max_size=4))
    if not _often(draw):
        keys -= {draw(st.sampled_from(sorted(BASE_KEYS)))}
    if not _often(draw) and not _often(draw):
        keys.add("pending_input")
    well_typed = _often(draw)
    record = {
        key: draw(
            st.sampled_from(VALUES[key][: WELL_TYPED.get(key, 2)] if well_typed else VALUES[key])
        )
        for key in sorted(keys)
    }
    if record.get("held") is True and _often(draw):  # otherwise trivially refused
        record["before"] = None
        record.setdefault("current_response", {"turn": 0, "start": 0})
    if record.get("held") is not True and _often(draw):
        record.pop("reasoning_item_id_policy", None)
        record.pop("current_response", None)
    shaped = record if _often(draw) or _often(draw) else draw(st.sampled_from([[record], "x"]))
    document[PENDING_WRITE_KEY] = shaped
    return document


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_documents())
def test_accepts_exactly_what_the_sdk_loader_accepts(document: dict[str, Any]) -> None:
    assert _accepts(document) is _sdk_accepts(document)


def test_differential_generator_reaches_both_verdicts() -> None:
    """The generator above is only meaningful if the SDK accepts some samples and refuses some."""
    held = _base("1.19", 0, {"type": "next_step_run_again"})
    held[PENDING_WRITE_KEY] = {
        "session_id": "s1",
        "items": [CALL, OUTPUT],
        "before": None,
        "persisted_count": 2,
        "held": True,
        "current_response": {"turn": 0, "start": 0},
    }
    assert _sdk_accepts(held)
    assert _accepts(held)
    held["$schemaVersion"] = "1.18"
    assert not _sdk_accepts(held)
    assert not _accepts(held)
