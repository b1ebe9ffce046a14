"""An in-process `ReconcilerApi` that folds the client's events with the engine's pure core.

It builds every event with the same `consumers.messages` builders the Kafka client uses, so the
SDK integration can be checked against the real fold without a broker. Positions are a global
counter (the Kafka engine uses the partition offset; both only grow).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers import messages
from consumers.errors import ResumeTimeoutError
from consumers.outcomes import ResumeOutcome, answers, outcome_from_decision
from engine.core.events import (
    AckOutcome,
    Binding,
    Cause,
    Decision,
    Event,
    IntentKind,
    PendingRecord,
)
from engine.core.fold import fold
from engine.core.state import SessionState


@dataclass
class FoldEngine:
    states: dict[str, SessionState] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    position: int = 0

    def feed(self, event: Event) -> tuple[Decision, ...]:
        self.position += 1
        result = fold(self.states.get(event.session_id), event, self.position)
        self.states[event.session_id] = result.state
        self.events.append(event)
        self.decisions.extend(result.decisions)
        return result.decisions


class FoldClient:
    def __init__(self, engine: FoldEngine, runner_id: str, clock: Callable[[], int]) -> None:
        self.engine = engine
        self.runner_id = runner_id
        self.clock = clock
        self.causal = messages.CausalCounter(runner_id)

    def last_published(self, session_id: str) -> Cause | None:
        return self.causal.last(session_id)

    def _feed(self, event: Event) -> tuple[Decision, ...]:
        decisions = self.engine.feed(event)
        causal = getattr(event, "causal", None)
        if causal is not None:
            self.causal.acknowledged(event.session_id, causal)
        return decisions

    def register_intent(
        self,
        *,
        session_id: str,
        binding: Binding,
        items: Sequence[Mapping[str, Any]],
        before_tail: Sequence[Mapping[str, Any]] | None,
        sequence: int,
        fence_token: int | None = None,
        intent_id: str | None = None,
        kind: IntentKind = IntentKind.REGISTER,
        persisted_count: int | None = None,
        tools_ran: bool = False,
    ) -> str:
        intent_id = intent_id or uuid.uuid4().hex
        self._feed(
            messages.intent_event(
                event_id=uuid.uuid4().hex,
                session_id=session_id,
                at_ms=self.clock(),
                intent_id=intent_id,
                runner_id=self.runner_id,
                binding=binding,
                items=items,
                before_tail=before_tail,
                sequence=sequence,
                fence_token=fence_token,
                persisted_count=persisted_count,
                kind=kind,
                tools_ran=tools_ran,
                causal=self.causal.next(session_id),
            )
        )
        return intent_id

    def acknowledge(
        self,
        *,
        session_id: str,
        intent_id: str,
        outcome: AckOutcome,
        fence_token: int | None = None,
        ignore_ids: bool = False,
        observed_tail: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self._feed(
            messages.ack_event(
                event_id=uuid.uuid4().hex,
                session_id=session_id,
                at_ms=self.clock(),
                intent_id=intent_id,
                runner_id=self.runner_id,
                outcome=outcome,
                fence_token=fence_token,
                observed_tail=observed_tail,
                ignore_ids=ignore_ids,
                causal=self.causal.next(session_id),
            )
        )

    def resume(
        self,
        *,
        session_id: str,
        binding: Binding,
        checkpoint_id: str,
        checkpoint_sequence: int,
        pending: PendingRecord | None,
        observed_tail: Sequence[Mapping[str, Any]],
        timeout_s: float = 15.0,
        request_id: str | None = None,
        checkpoint_session_id: str | None = None,
        after: Sequence[Cause] = (),
    ) -> ResumeOutcome:
        request_id = request_id or uuid.uuid4().hex
        decisions = self._feed(
            messages.resume_event(
                request_id=request_id,
                session_id=session_id,
                at_ms=self.clock(),
                runner_id=self.runner_id,
                checkpoint_id=checkpoint_id,
                binding=binding,
                pending=pending,
                observed_tail=observed_tail,
                checkpoint_sequence=checkpoint_sequence,
                checkpoint_session_id=checkpoint_session_id,
                causal=self.causal.next(session_id, after),
            )
        )
        final = [d for d in decisions if answers(d, request_id)]
        if not final:  # parked: in-process nobody will register the intent later
            raise ResumeTimeoutError(
                session_id=session_id, request_id=request_id, waited_s=0.0, partition=0
            )
        return outcome_from_decision(final[0])
