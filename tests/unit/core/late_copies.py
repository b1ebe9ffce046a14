"""Late exact copies: an input re-sent after its answer and out of the de-duplication window.

A runner re-sends after a crash (it did not see its answer), a producer retries, a lagging copy
arrives after the session moved on. The copy has the first's event id, content and event time;
the fold no longer remembers the id (`RECENT_EVENT_IDS`), so it is folded as a new input.

`audit` injects such a copy of every input of a lifecycle prefix, after enough other inputs to
push its id out of the window, and compares with the same log without it. The lifecycle after
the copy (`followups`) is the legitimate next step of the session; the copy must not change its
answers (no second grant, no wedge, nothing lost), nor what the state says about the write, the
holder or the session's health. Used by `test_late_copies.py` (the audit, pinned) and by the
lifecycle property.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from msgspec.structs import replace

from engine.core.events import (
    AckEvent,
    Decision,
    Event,
    IntentEvent,
    Reason,
    RepairEvent,
    RepairResolution,
    ResumeEvent,
)
from engine.core.fold import fold
from engine.core.state import RECENT_EVENT_IDS, SessionState
from tests.unit.core.builders import SID

# What a stale copy may be answered with, besides its first answer: a refusal that changes
# nothing and tells a runner that acts on it to stop.
STALE_REASONS = frozenset(
    {
        Reason.DUPLICATE,
        Reason.STALE_FENCE,
        Reason.STALE_CHECKPOINT,
        Reason.CHECKPOINT_ALREADY_RESUMED,
        Reason.HELD_BY_OTHER,
        Reason.UNKNOWN_INTENT,
        Reason.NOTHING_TO_REPAIR,
        Reason.NOT_HOLDER,
        Reason.REGRANT_DUPLICATE_REQUEST,  # a copy of the granting request: the same grant
        Reason.SESSION_AMBIGUOUS,  # ... or withheld, when the session needs a repair since
        Reason.SESSION_VIOLATED,
    }
)


def fillers(n: int, t: int) -> list[Event]:
    """Inputs that change nothing but the de-duplication window: repairs naming an intent the
    session never had (REJECTED UNKNOWN_INTENT). A repair times no waiting input."""
    return [
        RepairEvent(
            event_id=f"fill-{k}",
            session_id=SID,
            event_time_ms=t + k,
            resolution=RepairResolution.ABANDON,
            actor="audit",
            reason="filler",
            intent_id="ghost",
        )
        for k in range(n)
    ]


def kind_of(event: Event) -> str:
    """The audit table's row: the input kind, with the intent kind or ack outcome."""
    if isinstance(event, IntentEvent):
        return f"intent {event.kind.value}"
    if isinstance(event, AckEvent):
        partial = event.committed_count not in (None, 0) and event.outcome.value == "COMMITTED"
        return f"ack {event.source.value} {'PARTIAL' if partial else event.outcome.value}"
    if isinstance(event, ResumeEvent):
        return "resume"
    return "repair"


@dataclass(frozen=True)
class Finding:
    scenario: str
    copied: str  # event id of the copied input
    kind: str
    problems: tuple[str, ...]


def _fold(events: Sequence[Event]) -> tuple[SessionState | None, list[Decision], list[int]]:
    """Fold in order at list positions; the state after the last, every decision, and the index
    in `decisions` at which each event's answers start."""
    state: SessionState | None = None
    decisions: list[Decision] = []
    starts: list[int] = []
    for position, event in enumerate(events):
        result = fold(state, event, position)
        starts.append(len(decisions))
        state = result.state
        decisions.extend(result.decisions)
    return state, decisions, starts


def _essence(state: SessionState | None) -> SessionState | None:
    """The state without the de-duplication window (a copy legitimately moves it)."""
    return None if state is None else replace(state, recent_event_ids=[])


def _answers(decisions: Sequence[Decision], ids: set[str]) -> dict[str, tuple[object, ...]]:
    """Per decision id of the given inputs: what a runner acts on (not the fence's number,
    which follows partition positions)."""
    return {
        d.decision_id: (d.verdict, d.reason, d.runner_action, d.alert, d.fence_token is None)
        for d in decisions
        if d.in_reply_to in ids
    }


def audit_copy(
    scenario: str, prefix: Sequence[Event], followups: Sequence[Event], index: int
) -> Finding:
    """Copy `prefix[index]` after the window moved past it; compare with the log without it.

    Both logs have the same length (the copy takes one filler's place), so every later input
    sits at the same position and gets the same fence token.
    """
    original = prefix[index]
    pad_time = max(e.event_time_ms for e in prefix)
    pad = fillers(RECENT_EVENT_IDS + 1, t=pad_time)
    base = [*prefix, *pad, *followups]
    copied = [*prefix, *pad[:-1], original, *followups]
    cut = len(prefix) + len(pad)
    base_state, _, _ = _fold(base[:cut])
    copy_state, copy_decisions, starts = _fold(copied[:cut])
    problems: list[str] = []
    if _essence(base_state) != _essence(copy_state):
        problems.append("state changed")
    first = next(d for d in _fold(prefix)[1] if d.decision_id == original.event_id)
    mine = copy_decisions[starts[cut - 1] :]
    if any(d.grants and d.fence_token != first.fence_token for d in mine):
        problems.append("granted again")
    if any(d.alert for d in mine):
        problems.append("alerted")
    if len(mine) != 1 or mine[0].decision_id != original.event_id:
        problems.append(f"answered {[d.decision_id for d in mine]}")
    elif (mine[0].verdict, mine[0].runner_action) != (first.verdict, first.runner_action) and (
        mine[0].grants or mine[0].reason not in STALE_REASONS
    ):
        was, now = f"{first.verdict}/{first.reason}", f"{mine[0].verdict}/{mine[0].reason}"
        problems.append(f"answer {was} -> {now}")
    ids = {e.event_id for e in followups}
    after_base = _answers(_fold(base)[1], ids)
    after_copy = _answers(_fold(copied)[1], ids)
    if after_base != after_copy:
        changed = sorted(k for k in after_base if after_base[k] != after_copy.get(k))
        problems.append(f"followups changed {changed}: {[after_copy.get(k) for k in changed]}")
    return Finding(scenario, original.event_id, kind_of(original), tuple(problems))


def audit(scenario: str, prefix: Sequence[Event], followups: Sequence[Event]) -> list[Finding]:
    """One finding per input of `prefix` (a repaired filler-free lifecycle)."""
    return [audit_copy(scenario, prefix, followups, i) for i in range(len(prefix))]
