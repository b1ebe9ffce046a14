"""Per-session state of the fold: digests and small structural facts only, never content.

Record shape (``SessionState.to_record()``, every value Avro-friendly)::

    session_id: str
    binding: Binding | null               # set by the first accepted intent or grant
    health: "CLEAR" | "AMBIGUOUS" | "VIOLATED"
    health_reason: Reason | null          # why it is not CLEAR; only a repair clears it
    holder: str | null                    # runner id holding continuation authority
    fence_token: int                      # 0 = never granted; only grows
    lease_expires_ms: int | null          # event time at which the holder's lease lapses
    grant_request_id: str | null          # resume event id of the last grant (re-answered on dup)
    grant_verdict: Verdict | null
    granted_checkpoint_id: str | null     # a checkpoint that was granted is consumed
    progress_sequence: int                # highest write sequence the session reached (-1)
    slot: IntentSlot | null               # the single pending-write slot (like the SDK's)
    previous_intent_id: str | null        # the intent the slot superseded
    parked_intents: list[IntentEvent]     # intents carrying a fence not granted yet (bounded)
    parked_acks: list[AckEvent]           # acks ahead of their intent, fence or release (bounded)
    parked_resumes: list[ParkedResume]    # resumes that arrived before their intent (bounded)
    recent_event_ids: list[str]           # de-duplication window (bounded)
    producers: list[ProducerMark]         # per producer, the highest causal seq folded (bounded)
    causal_waiting: list[CausalWait]      # v3 inputs whose named causes are not folded (bounded)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from msgspec import Struct, ValidationError, convert, field, to_builtins

from engine.core.errors import StateRecordError
from engine.core.events import (
    AckEvent,
    Binding,
    Digest,
    IntentEvent,
    ItemFacts,
    Reason,
    ResumeEvent,
    Verdict,
)

LEASE_MS = 60_000
"""How long (event time) a grant or a holder's last write keeps other runners out."""
PARK_MS = LEASE_MS
"""How long (event time) an input may wait for what it refers to (a resume for the intent its
checkpoint names, an ack for its intent, fence, release or re-arm, an intent for its fence's
grant, a re-arm for its failure) before it is answered as it stands (`parked.py`)."""
RECENT_EVENT_IDS = 8
PARKED_LIMIT = 4
"""Resumes that may wait for their intent at once; the oldest beyond it gets a final answer."""
PARKED_WRITES_LIMIT = 32
"""Intents and acks (each) that may wait for what they refer to: a backlog's worth of writes.
The oldest beyond it gets its final answer at once (`parked.park_intent`, `parked.park_ack`)."""


PRODUCERS_LIMIT = 16
"""Producers whose highest folded event the session remembers (`causal.py`). Beyond it, the one
whose last event is oldest in event time is forgotten: an input naming it waits for the
watermark, then is folded as it stands."""
CAUSAL_WAIT_LIMIT = 32
"""Inputs that may wait for the events they name (`causal.py`); the oldest beyond it is folded
at once, as a producer without causal context would be."""


class Health(StrEnum):
    CLEAR = "CLEAR"
    AMBIGUOUS = "AMBIGUOUS"  # the outcome of a write cannot be known: repair needed
    VIOLATED = "VIOLATED"  # an invariant broke (held batch leaked, late fenced append)


class SlotStatus(StrEnum):
    HELD = "HELD"  # registered, must not be in the Session
    PENDING = "PENDING"  # registered ordinary write, outcome not known
    APPEND_GRANTED = "APPEND_GRANTED"  # a holder was told to append it once
    COMMITTED = "COMMITTED"  # known durable (ack, classification or repair)
    ABSENT = "ABSENT"  # an operator verified nothing of it landed
    DISCARDED = "DISCARDED"  # a held batch dropped without a settle
    ABANDONED = "ABANDONED"  # given up by an operator


UNRESOLVED = frozenset({SlotStatus.HELD, SlotStatus.PENDING, SlotStatus.APPEND_GRANTED})


class _Frozen(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """Immutable value: change one with `msgspec.structs.replace` (no validation on the way).

    ``gc=False``: values never refer back to themselves, so the cycle collector need not track
    them; a full collection over a large read cache then visits only the states' lists.
    """


class IntentSlot(_Frozen, frozen=True, kw_only=True):
    intent_id: str
    runner_id: str
    sequence: int
    held: bool
    status: SlotStatus
    before: list[Digest] | None = None  # always an intent's (validated) before digests
    items: list[ItemFacts] = field(default_factory=list)
    persisted_count: int | None = None  # null: the registration could not see it
    committed_by_store: bool = False
    committed_by_runner: bool = False
    not_written: bool = False
    partial_seen: bool = False

    @property
    def batch(self) -> list[str]:
        return [facts.digest for facts in self.items]


class ParkedResume(_Frozen, frozen=True, kw_only=True):
    resume: ResumeEvent
    position: int


class ProducerMark(_Frozen, frozen=True, kw_only=True):
    """The highest causal ``seq`` of ``producer`` folded, and the event time of that event."""

    producer: str
    seq: int
    at_ms: int


class CausalWait(_Frozen, frozen=True, kw_only=True):
    """A v3 input that arrived before an event it names (exactly one of the three is set)."""

    intent: IntentEvent | None = None
    ack: AckEvent | None = None
    resume: ResumeEvent | None = None
    position: int


class SessionState(_Frozen, frozen=True, kw_only=True):
    session_id: str
    binding: Binding | None = None
    health: Health = Health.CLEAR
    health_reason: Reason | None = None
    holder: str | None = None
    fence_token: int = 0
    lease_expires_ms: int | None = None
    grant_request_id: str | None = None
    grant_verdict: Verdict | None = None
    granted_checkpoint_id: str | None = None
    progress_sequence: int = -1
    slot: IntentSlot | None = None
    previous_intent_id: str | None = None
    parked_intents: list[IntentEvent] = field(default_factory=list)
    parked_acks: list[AckEvent] = field(default_factory=list)
    parked_resumes: list[ParkedResume] = field(default_factory=list)
    recent_event_ids: list[str] = field(default_factory=list)
    producers: list[ProducerMark] = field(default_factory=list)
    causal_waiting: list[CausalWait] = field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        """Plain dict of str/int/bool/None/list/dict values (the changelog record)."""
        record: dict[str, Any] = to_builtins(self)
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SessionState:
        try:
            return convert(record, cls)
        except ValidationError as exc:
            raise StateRecordError(
                f"session state record does not match the documented shape: {exc}; "
                "rebuild the partition's state by replaying its input topics.",
                session_id=str(record.get("session_id")),
            ) from exc

    def lease_active(self, at_ms: int) -> bool:
        return self.holder is not None and (
            self.lease_expires_ms is not None and at_ms < self.lease_expires_ms
        )
