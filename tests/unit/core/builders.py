"""Small builders for core events in tests (digests of synthetic items, no content kept)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.core.digest import item_facts
from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Binding,
    Decision,
    Event,
    IntentEvent,
    IntentKind,
    ItemFacts,
    PendingRecord,
    RepairEvent,
    RepairResolution,
    ResumeEvent,
)
from engine.core.fold import fold
from engine.core.state import SessionState

SID = "s1"
BINDING = Binding(backend_id="mem", namespace="tests")


def msg(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(cid: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": cid, "name": "charge", "arguments": "{}"}


def out(cid: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": cid, "output": "ok"}


def facts(items: list[dict[str, Any]], ignore_ids: bool = False) -> list[ItemFacts]:
    return [item_facts(i, ignore_ids=ignore_ids) for i in items]


def d(items: list[dict[str, Any]]) -> list[str]:
    return [f.digest for f in facts(items)]


def intent(
    eid: str,
    items: list[dict[str, Any]],
    before: list[dict[str, Any]] | None,
    *,
    kind: IntentKind = IntentKind.REGISTER,
    intent_id: str = "i1",
    runner: str = "r1",
    fence: int | None = None,
    seq: int = 1,
    t: int = 1_000,
    binding: Binding = BINDING,
    tools_ran: bool = False,
) -> IntentEvent:
    return IntentEvent(
        event_id=eid,
        session_id=SID,
        event_time_ms=t,
        kind=kind,
        intent_id=intent_id,
        runner_id=runner,
        fence_token=fence,
        binding=binding,
        before=None if before is None else d(before),
        items=facts(items),
        persisted_count=len(items),
        sequence=seq,
        tools_ran=tools_ran,
    )


def ack(
    eid: str,
    outcome: AckOutcome,
    *,
    source: AckSource = AckSource.RUNNER,
    intent_id: str = "i1",
    runner: str = "r1",
    fence: int | None = None,
    count: int | None = None,
    t: int = 1_100,
) -> AckEvent:
    return AckEvent(
        event_id=eid,
        session_id=SID,
        event_time_ms=t,
        intent_id=intent_id,
        runner_id=runner,
        outcome=outcome,
        source=source,
        fence_token=fence,
        committed_count=count,
    )


def record(
    items: list[dict[str, Any]],
    before: list[dict[str, Any]] | None,
    *,
    intent_id: str = "i1",
    held: bool = False,
    acknowledged: bool = False,
) -> PendingRecord:
    return PendingRecord(
        intent_id=intent_id,
        items=facts(items),
        before=None if before is None else d(before),
        persisted_count=len(items),
        held=held,
        append_acknowledged=acknowledged,
    )


def resume(
    eid: str,
    pending: PendingRecord | None,
    tail: list[dict[str, Any]],
    *,
    runner: str = "r2",
    checkpoint: str = "c1",
    seq: int = 1,
    t: int = 100_000,
    binding: Binding = BINDING,
) -> ResumeEvent:
    return ResumeEvent(
        event_id=eid,
        session_id=SID,
        event_time_ms=t,
        runner_id=runner,
        checkpoint_id=checkpoint,
        binding=binding,
        pending=pending,
        observed_tail=d(tail),
        checkpoint_sequence=seq,
    )


def repair(
    eid: str, resolution: RepairResolution, *, intent_id: str | None = "i1", t: int = 200_000
) -> RepairEvent:
    return RepairEvent(
        event_id=eid,
        session_id=SID,
        event_time_ms=t,
        resolution=resolution,
        actor="ops@example",
        reason="checked the store",
        intent_id=intent_id,
    )


def fold_all(events: Sequence[Event]) -> tuple[SessionState, list[Decision]]:
    """Fold the events of one session in order (each at its list position); the last state and
    every decision."""
    state: SessionState | None = None
    decisions: list[Decision] = []
    for position, event in enumerate(events):
        result = fold(state, event, position)
        state, decisions = result.state, [*decisions, *result.decisions]
    assert state is not None
    return state, decisions
