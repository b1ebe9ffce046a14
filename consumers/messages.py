"""Pure builders of the events a runner publishes: items in, payload-free events out.

Digests come from `engine.core.digest` (the engine's own helper), never reimplemented here.
Nothing in this module does I/O or reads a clock: time and ids are arguments. `CausalCounter`
numbers a producer's events per session (the causal context of intent/ack/resume v3).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from engine.core.digest import digests, item_facts
from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Binding,
    CausalContext,
    Cause,
    IntentEvent,
    IntentKind,
    PendingRecord,
    ResumeEvent,
)

Item = Mapping[str, Any]


class CausalCounter:
    """The causal context of one producer's events, per session (intent/ack/resume v3).

    Every event takes the next ``seq`` (also one whose delivery failed: a number is never
    reused), and names in ``after`` only the last event whose delivery Kafka acknowledged, so
    the engine never waits for an event that is not in the topic. Thread-safe.
    """

    def __init__(self, producer: str) -> None:
        self.producer = producer
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}
        self._acknowledged: dict[str, int] = {}

    def next(self, session_id: str, also: Sequence[Cause] = ()) -> CausalContext:
        """The context of the next event about ``session_id``; ``also``: other events it
        follows (a resume: what its checkpoint named)."""
        with self._lock:
            seq = self._next.get(session_id, 0)
            self._next[session_id] = seq + 1
            last = self._acknowledged.get(session_id)
        own = [] if last is None else [Cause(producer=self.producer, seq=last)]
        return CausalContext(producer=self.producer, seq=seq, after=[*own, *also])

    def acknowledged(self, session_id: str, context: CausalContext) -> None:
        """Kafka acknowledged the event that carried ``context``."""
        with self._lock:
            if context.seq > self._acknowledged.get(session_id, -1):
                self._acknowledged[session_id] = context.seq

    def last(self, session_id: str) -> Cause | None:
        """The last acknowledged event about ``session_id`` (a checkpoint stores it)."""
        with self._lock:
            seq = self._acknowledged.get(session_id)
        return None if seq is None else Cause(producer=self.producer, seq=seq)


def intent_event(
    *,
    event_id: str,
    session_id: str,
    at_ms: int,
    intent_id: str,
    runner_id: str,
    binding: Binding,
    items: Sequence[Item],
    before_tail: Sequence[Item] | None,
    sequence: int,
    fence_token: int | None = None,
    persisted_count: int | None = None,
    kind: IntentKind = IntentKind.REGISTER,
    tools_ran: bool = False,
    causal: CausalContext | None = None,
) -> IntentEvent:
    """An intent for ``items``; ``before_tail`` is the Session tail read right before the append
    (``len(items) + 1`` items, like the SDK), None when the append has not started."""
    ignore = binding.ignore_ids
    return IntentEvent(
        event_id=event_id,
        session_id=session_id,
        event_time_ms=at_ms,
        kind=kind,
        intent_id=intent_id,
        runner_id=runner_id,
        fence_token=fence_token,
        binding=binding,
        before=None if before_tail is None else digests(before_tail, ignore_ids=ignore),
        items=[item_facts(item, ignore_ids=ignore) for item in items],
        persisted_count=persisted_count,
        sequence=sequence,
        tools_ran=tools_ran,
        causal=causal,
    )


def ack_event(
    *,
    event_id: str,
    session_id: str,
    at_ms: int,
    intent_id: str,
    runner_id: str,
    outcome: AckOutcome,
    fence_token: int | None = None,
    observed_tail: Sequence[Item] | None = None,
    ignore_ids: bool = False,
    causal: CausalContext | None = None,
) -> AckEvent:
    """The runner's view of its own append (source RUNNER)."""
    return AckEvent(
        event_id=event_id,
        session_id=session_id,
        event_time_ms=at_ms,
        intent_id=intent_id,
        runner_id=runner_id,
        outcome=outcome,
        source=AckSource.RUNNER,
        fence_token=fence_token,
        observed_tail=None
        if observed_tail is None
        else digests(observed_tail, ignore_ids=ignore_ids),
        causal=causal,
    )


def resume_event(
    *,
    request_id: str,
    session_id: str,
    at_ms: int,
    runner_id: str,
    checkpoint_id: str,
    binding: Binding,
    pending: PendingRecord | None,
    observed_tail: Sequence[Item],
    checkpoint_sequence: int,
    checkpoint_session_id: str | None = None,
    causal: CausalContext | None = None,
) -> ResumeEvent:
    """A resume request; ``observed_tail`` is what the runner just reread from the Session."""
    return ResumeEvent(
        event_id=request_id,
        session_id=session_id,
        event_time_ms=at_ms,
        runner_id=runner_id,
        checkpoint_id=checkpoint_id,
        binding=binding,
        pending=pending,
        observed_tail=digests(observed_tail, ignore_ids=binding.ignore_ids),
        checkpoint_sequence=checkpoint_sequence,
        checkpoint_session_id=checkpoint_session_id,
        causal=causal,
    )


def tail_limit(pending: PendingRecord | None) -> int:
    """How many tail items the SDK rereads for this record: ``len(before) + len(items)`` once the
    append started, ``len(items) + 1`` before that (the first-attempt read), 0 with no record
    (the engine classifies nothing then)."""
    if pending is None:
        return 0
    if pending.before is None:
        return len(pending.items) + 1
    return len(pending.before) + len(pending.items)
