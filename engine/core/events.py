"""Typed input events and output decisions of the reconciliation fold.

Every value is a frozen, slotted `msgspec.Struct` whose fields are Avro-friendly (str, int, bool,
str enums, lists, nested values, Optional). Constructing one checks nothing: the fold builds
them from values it already trusts, and a state change costs one object. Validation (types, enum
symbols, digest formats) happens once, where bytes become values: ``engine.wire.values``.

Every input event carries ``event_id`` (de-duplication key), ``session_id`` (the partition key)
and ``event_time_ms`` (event time, int milliseconds since the epoch; the only clock the fold
knows). No model ever carries item content: items are described by :class:`ItemFacts`
(digest, item type, call id).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from msgspec import Meta, Struct, field

DIGEST_PATTERN = r"^[0-9a-f]{64}\Z"
Digest = Annotated[str, Meta(pattern=DIGEST_PATTERN)]
"""A SHA-256 hex digest (64 lowercase hex characters) of one Session item."""
_DIGEST = re.compile(DIGEST_PATTERN)


def is_digest(text: str) -> bool:
    """Whether ``text`` is a `Digest` (for code that builds values from untrusted strings)."""
    return _DIGEST.match(text) is not None


SDK_DIGEST_SCHEME = "sdk-sha256-v1"
"""The openai-agents 0.24.0 item digest: sha256 of ``json.dumps(item, sort_keys=True)``."""


class _Frozen(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """Immutable value: change one with `msgspec.structs.replace` (no validation on the way).

    ``gc=False``: values never refer back to themselves, so the cycle collector need not track
    them; a full collection over a large read cache then visits only the states' lists.
    """


class Binding(_Frozen, frozen=True, kw_only=True):
    """What equality of digests means for a session: where its history lives and how it is read.

    The first accepted intent binds the session; anything that points elsewhere is withheld.
    ``store_enforces_fence`` says whether the backend adapter rejects appends carrying a stale
    fence token (then an append grant is STORE_ENFORCED) or not (ADVISORY). ``chunk_size`` is set
    for backends that split one append into several requests (OpenAI Conversations: 20), which
    enables the chunk-prefix partial-commit rule. ``items_digest_stable`` says a stored item
    digests exactly like the item that was appended (false for backends that add fields or
    normalise ids): without it, a tail that merely looks unchanged is no evidence that the batch
    is absent, so the engine never grants APPEND_ONCE on digests alone.
    """

    backend_id: str
    namespace: str
    digest_scheme: str = SDK_DIGEST_SCHEME
    ignore_ids: bool = False
    checkpoint_schema_version: str = "1.21"
    store_enforces_fence: bool = False
    chunk_size: int | None = None
    items_digest_stable: bool = True


class ItemFacts(_Frozen, frozen=True, kw_only=True):
    """Payload-free facts about one Session item: never its content."""

    digest: Digest
    item_type: str
    call_id: str | None = None


class Cause(_Frozen, frozen=True, kw_only=True):
    """One event of one producer: the ``seq``-th event ``producer`` published about the session."""

    producer: str
    seq: int


class CausalContext(_Frozen, frozen=True, kw_only=True):
    """What an event's producer had already published about the session, and knew Kafka had
    acknowledged, when it published this event (intent, ack and resume v3).

    ``producer`` names the publishing process (a runner id; a store's own producer id for store
    acks) and ``seq`` numbers its events in the session from 0. ``after`` lists the events this
    one follows: the producer's own previous event (``seq - 1``), and, for a resume, the last
    event the checkpoint's runner had published when it saved the checkpoint and the last ack
    the store had written when the tail was read. The fold folds an event only after everything
    it names (`causal.py`), so it orders by cause, not by arrival (README "Causal order").
    """

    producer: str
    seq: int
    after: list[Cause] = field(default_factory=list)


class IntentKind(StrEnum):
    REGISTER = "REGISTER"  # an ordinary pending write, published before the append
    HELD = "HELD"  # a held batch: registered, must not reach the Session yet
    RELEASE = "RELEASE"  # the held batch settles: becomes an ordinary pending write
    DISCARD = "DISCARD"  # the held batch is dropped without a settle


class IntentEvent(_Frozen, frozen=True, kw_only=True):
    """A runner's pending-write intent, published durably before it touches the Session.

    ``sequence`` is the runner's monotonically increasing write number within the session: a
    checkpoint knows the sequence of the last write it saw, so the engine can tell a stale one.
    ``before`` is the digests of the tail read right before the append (None: the append has not
    started; always None for HELD). ``items`` is the batch (for RELEASE: the settle batch, which
    must start with the held batch). ``tools_ran`` says the batch's tool calls already executed
    (meaningful for DISCARD: discarding then loses their outputs). ``persisted_count`` is the
    SDK's counter from the pending record when the client can see it (held batches), null when
    it cannot (an ordinary append registered from inside ``add_items``); the engine compares it
    with the resume's record whenever it is known.
    """

    event_id: str
    session_id: str
    event_time_ms: int
    kind: IntentKind
    intent_id: str
    runner_id: str
    fence_token: int | None = None
    binding: Binding
    before: list[Digest] | None = None
    items: list[ItemFacts] = field(default_factory=list)
    persisted_count: int | None = None
    sequence: int
    tools_ran: bool = False
    causal: CausalContext | None = None


class AckOutcome(StrEnum):
    COMMITTED = "COMMITTED"  # the batch is durable in the Session
    NOT_WRITTEN = "NOT_WRITTEN"  # definitively not written (nothing of it landed)
    UNKNOWN = "UNKNOWN"  # the append failed in a way that hides its outcome


class AckSource(StrEnum):
    RUNNER = "RUNNER"  # the runner's view of its own add_items call
    STORE = "STORE"  # the Session store itself (outbox / CDC): authoritative


class AckEvent(_Frozen, frozen=True, kw_only=True):
    """The outcome of an append, as seen by the runner or reported by the store.

    ``committed_count`` (store acks) is how many items of the batch are durable; a value strictly
    between 0 and the batch length is a partial commit.
    """

    event_id: str
    session_id: str
    event_time_ms: int
    intent_id: str
    runner_id: str = ""
    outcome: AckOutcome
    source: AckSource
    fence_token: int | None = None
    observed_tail: list[Digest] | None = None
    committed_count: int | None = None
    causal: CausalContext | None = None


class PendingRecord(_Frozen, frozen=True, kw_only=True):
    """The payload-free view of a checkpoint's ``pending_session_write`` record.

    ``intent_id`` is the id the client library registered the record under.
    """

    intent_id: str
    items: list[ItemFacts]
    before: list[Digest] | None = None
    persisted_count: int = 0
    held: bool = False
    append_acknowledged: bool = False


class ResumeEvent(_Frozen, frozen=True, kw_only=True):
    """A restored runner asks for continuation authority. ``event_id`` is the request id.

    ``observed_tail`` is the digests of the Session tail the runner just reread (for a record with
    ``before``: ``len(before) + len(items)`` items, like the SDK). ``checkpoint_sequence`` is the
    last write sequence the checkpoint knew (-1: none).
    """

    event_id: str
    session_id: str
    event_time_ms: int
    runner_id: str
    checkpoint_id: str
    binding: Binding
    pending: PendingRecord | None = None
    observed_tail: list[Digest] = field(default_factory=list)
    checkpoint_sequence: int = -1
    checkpoint_session_id: str | None = None
    causal: CausalContext | None = None


class RepairResolution(StrEnum):
    ACCEPT_COMMITTED = "ACCEPT_COMMITTED"  # the operator verified the batch is in the Session
    ACCEPT_ABSENT = "ACCEPT_ABSENT"  # the operator verified nothing of it is in the Session
    ABANDON = "ABANDON"  # give the pending write up; the session restarts from a new checkpoint


class RepairEvent(_Frozen, frozen=True, kw_only=True):
    """An operator's resolution of an ambiguous or violated session, recorded in the trail."""

    event_id: str
    session_id: str
    event_time_ms: int
    resolution: RepairResolution
    actor: str
    reason: str
    intent_id: str | None = None


Event = IntentEvent | AckEvent | ResumeEvent | RepairEvent
"""Every input the fold accepts."""

EventKind = Literal["intent", "ack", "resume", "repair"]


class Verdict(StrEnum):
    CONTINUE = "CONTINUE"  # authority granted: the batch is committed, do not replay it
    APPEND_ONCE = "APPEND_ONCE"  # authority granted: the batch is absent, append it once, fenced
    WITHHELD = "WITHHELD"  # no authority: see reason and operator_action
    DEFERRED = "DEFERRED"  # no authority yet: evidence is missing; a final decision follows
    RECORDED = "RECORDED"  # a non-resume input was accepted
    REJECTED = "REJECTED"  # a non-resume input was refused (stale fence, bad batch, ...)


GRANTING_VERDICTS = frozenset({Verdict.CONTINUE, Verdict.APPEND_ONCE})


class RunnerAction(StrEnum):
    """The one thing a runner does with a decision (the verdict alone says CONTINUE twice)."""

    DO_NOT_REPLAY = "DO_NOT_REPLAY"  # granted: the batch is in the Session (or none was pending)
    APPEND_ONCE = "APPEND_ONCE"  # granted: append the batch once, with the fence token
    RELEASE_HELD = "RELEASE_HELD"  # granted: the held batch is not in the Session; keep it held
    # and settle it later with a RELEASE intent (one ordered append)
    STOP = "STOP"  # no authority: do not touch the Session; see reason and operator_action
    WAIT = "WAIT"  # no authority yet: a final decision for this request follows
    NONE = "NONE"  # an answer to an intent, ack or repair: nothing to do beyond the verdict


class Reason(StrEnum):
    # grants
    COMMITTED = "COMMITTED"
    COMMITTED_BY_STORE = "COMMITTED_BY_STORE"
    UNCHANGED = "UNCHANGED"
    APPEND_NOT_STARTED = "APPEND_NOT_STARTED"
    NO_PENDING_WRITE = "NO_PENDING_WRITE"
    REGRANT_DUPLICATE_REQUEST = "REGRANT_DUPLICATE_REQUEST"
    HELD_RIDES = "HELD_RIDES"
    KNOWN_COMMITTED = "KNOWN_COMMITTED"  # an earlier ack, classification or repair said so
    ACCEPTED_ABSENT = "ACCEPTED_ABSENT"
    # withholds
    AMBIGUOUS = "AMBIGUOUS"
    PARTIAL_COMMIT = "PARTIAL_COMMIT"
    SESSION_AMBIGUOUS = "SESSION_AMBIGUOUS"
    SESSION_VIOLATED = "SESSION_VIOLATED"
    HELD_BY_OTHER = "HELD_BY_OTHER"
    STALE_CHECKPOINT = "STALE_CHECKPOINT"
    CHECKPOINT_ALREADY_RESUMED = "CHECKPOINT_ALREADY_RESUMED"
    BINDING_MISMATCH = "BINDING_MISMATCH"
    RECORD_MISMATCH = "RECORD_MISMATCH"
    CONTENT_NOT_AUTHORSHIP = "CONTENT_NOT_AUTHORSHIP"
    GATE_VIOLATION = "GATE_VIOLATION"
    HELD_NOT_SETTLED = "HELD_NOT_SETTLED"
    AWAITING_INTENT = "AWAITING_INTENT"
    ABANDONED = "ABANDONED"
    # non-resume inputs
    ACCEPTED = "ACCEPTED"
    PARKED = "PARKED"
    DUPLICATE = "DUPLICATE"
    STALE_FENCE = "STALE_FENCE"
    UNKNOWN_FENCE = "UNKNOWN_FENCE"
    NOT_HOLDER = "NOT_HOLDER"
    SLOT_OCCUPIED = "SLOT_OCCUPIED"
    INTENT_CONFLICT = "INTENT_CONFLICT"
    UNKNOWN_INTENT = "UNKNOWN_INTENT"
    SETTLE_ORDER = "SETTLE_ORDER"
    ORPHAN_OUTPUT = "ORPHAN_OUTPUT"
    HELD_LOSS = "HELD_LOSS"
    LATE_APPEND = "LATE_APPEND"
    NOTHING_TO_REPAIR = "NOTHING_TO_REPAIR"
    REPAIRED = "REPAIRED"
    INVALID = "INVALID"
    PARKED_OVERFLOW = "PARKED_OVERFLOW"
    # added in decision/session_state v2 (an enum only grows at its end)
    HISTORY_CHANGED = "HISTORY_CHANGED"  # committed, but the tail is no longer before + batch
    DIGEST_UNSTABLE = "DIGEST_UNSTABLE"  # the binding's stored items do not digest identically
    INTENT_NEVER_ARRIVED = "INTENT_NEVER_ARRIVED"  # a deferred resume's intent is overdue


class Fence(StrEnum):
    STORE_ENFORCED = "STORE_ENFORCED"  # the store rejects appends with a stale token
    ADVISORY = "ADVISORY"  # only well-behaved runners honour the token


class Classification(StrEnum):
    """The SDK's three-way table plus what the engine can tell beyond it."""

    NONE = "NONE"  # nothing to classify
    NOT_STARTED = "NOT_STARTED"  # before is None: no append began
    COMMITTED = "COMMITTED"  # (T, F)
    UNCHANGED = "UNCHANGED"  # (F, T)
    AMBIGUOUS_BOTH = "AMBIGUOUS_BOTH"  # (T, T): repeated content makes both rules true
    CHANGED = "CHANGED"  # (F, F): another writer, a rollback, a transformation
    PARTIAL = "PARTIAL"  # a prefix of the batch landed


class TrailStep(StrEnum):
    """The kinds of step a decision trail is made of (the wire carries the value as a string)."""

    OBSERVED = "observed"  # what the input said (counts, ids; never content)
    EVIDENCE = "evidence"  # what the engine knew about the pending write when it decided
    CLASSIFICATION = "classification"  # the SDK-compatible classification of the tail
    AUTHORITY = "authority"  # who holds authority after the decision, with which fence
    WHY = "why"  # the rule that decided
    REPAIR = "repair"  # an operator's resolution
    ALERT = "alert"  # what an operator must look at


class AnswerSuffix(StrEnum):
    """Appended to the answered event id to form ``decision_id``.

    A resume parked for its intent is answered twice: ``DEFERRED`` at once (FIRST) and its final
    answer later (FINAL), so a consumer can tell the two apart and de-duplicate each.
    """

    FIRST = ""
    FINAL = "/final"


class TrailEntry(_Frozen, frozen=True, kw_only=True):
    """One step of the decision trail: small, payload-free, readable by an operator."""

    step: str  # a TrailStep value; a plain string on the wire so a new step breaks no reader
    detail: str


class Decision(_Frozen, frozen=True, kw_only=True):
    """The engine's answer to one input event (or a deferred answer to a parked resume).

    ``decision_id`` is derived from the event it answers, so replays and duplicates produce the
    same id and downstream consumers can de-duplicate.
    """

    decision_id: str
    session_id: str
    in_reply_to: str
    verdict: Verdict
    reason: Reason
    fence_token: int | None = None
    fence: Fence | None = None
    holder: str | None = None
    classification: Classification = Classification.NONE
    operator_action: str | None = None
    alert: bool = False
    final: bool = True
    event_time_ms: int
    trail: list[TrailEntry] = field(default_factory=list)
    runner_action: RunnerAction = RunnerAction.NONE

    @property
    def grants(self) -> bool:
        return self.verdict in GRANTING_VERDICTS
