"""Enum members as module constants, for the fold's hot paths.

Under Python 3.11, reading a member off its enum class (``Verdict.CONTINUE``) costs about 80 ns,
compiled or not: ``EnumType`` defines ``__getattr__``, which sends every attribute of the class
through the slow path (a method wrapper allocated per read). A ``Final`` name of a compiled
module is a C static to the modules compiled with it, and a plain global read from source.
"""

from __future__ import annotations

from typing import Final

from engine.core.events import (
    AnswerSuffix,
    Classification,
    Fence,
    IntentKind,
    Reason,
    RunnerAction,
    TrailStep,
    Verdict,
)
from engine.core.state import Health, SlotStatus

SUFFIX_FINAL: Final = AnswerSuffix.FINAL
SUFFIX_FIRST: Final = AnswerSuffix.FIRST

CLS_AMBIGUOUS_BOTH: Final = Classification.AMBIGUOUS_BOTH
CLS_CHANGED: Final = Classification.CHANGED
CLS_COMMITTED: Final = Classification.COMMITTED
CLS_NONE: Final = Classification.NONE
CLS_NOT_STARTED: Final = Classification.NOT_STARTED
CLS_PARTIAL: Final = Classification.PARTIAL
CLS_UNCHANGED: Final = Classification.UNCHANGED

HEALTH_AMBIGUOUS: Final = Health.AMBIGUOUS
HEALTH_CLEAR: Final = Health.CLEAR
HEALTH_VIOLATED: Final = Health.VIOLATED

KIND_HELD: Final = IntentKind.HELD
KIND_REGISTER: Final = IntentKind.REGISTER
KIND_RELEASE: Final = IntentKind.RELEASE

REASON_ABANDONED: Final = Reason.ABANDONED
REASON_ACCEPTED: Final = Reason.ACCEPTED
REASON_ACCEPTED_ABSENT: Final = Reason.ACCEPTED_ABSENT
REASON_AMBIGUOUS: Final = Reason.AMBIGUOUS
REASON_APPEND_NOT_STARTED: Final = Reason.APPEND_NOT_STARTED
REASON_AWAITING_INTENT: Final = Reason.AWAITING_INTENT
REASON_BINDING_MISMATCH: Final = Reason.BINDING_MISMATCH
REASON_CHECKPOINT_ALREADY_RESUMED: Final = Reason.CHECKPOINT_ALREADY_RESUMED
REASON_COMMITTED: Final = Reason.COMMITTED
REASON_COMMITTED_BY_STORE: Final = Reason.COMMITTED_BY_STORE
REASON_CONTENT_NOT_AUTHORSHIP: Final = Reason.CONTENT_NOT_AUTHORSHIP
REASON_DIGEST_UNSTABLE: Final = Reason.DIGEST_UNSTABLE
REASON_DUPLICATE: Final = Reason.DUPLICATE
REASON_GATE_VIOLATION: Final = Reason.GATE_VIOLATION
REASON_HELD_BY_OTHER: Final = Reason.HELD_BY_OTHER
REASON_HELD_LOSS: Final = Reason.HELD_LOSS
REASON_HELD_NOT_SETTLED: Final = Reason.HELD_NOT_SETTLED
REASON_HELD_RIDES: Final = Reason.HELD_RIDES
REASON_HISTORY_CHANGED: Final = Reason.HISTORY_CHANGED
REASON_INTENT_CONFLICT: Final = Reason.INTENT_CONFLICT
REASON_INTENT_NEVER_ARRIVED: Final = Reason.INTENT_NEVER_ARRIVED
REASON_INVALID: Final = Reason.INVALID
REASON_KNOWN_COMMITTED: Final = Reason.KNOWN_COMMITTED
REASON_NOT_HOLDER: Final = Reason.NOT_HOLDER
REASON_NO_PENDING_WRITE: Final = Reason.NO_PENDING_WRITE
REASON_ORPHAN_OUTPUT: Final = Reason.ORPHAN_OUTPUT
REASON_PARKED_OVERFLOW: Final = Reason.PARKED_OVERFLOW
REASON_PARTIAL_COMMIT: Final = Reason.PARTIAL_COMMIT
REASON_RECORD_MISMATCH: Final = Reason.RECORD_MISMATCH
REASON_SESSION_AMBIGUOUS: Final = Reason.SESSION_AMBIGUOUS
REASON_SESSION_VIOLATED: Final = Reason.SESSION_VIOLATED
REASON_SETTLE_ORDER: Final = Reason.SETTLE_ORDER
REASON_SLOT_OCCUPIED: Final = Reason.SLOT_OCCUPIED
REASON_STALE_CHECKPOINT: Final = Reason.STALE_CHECKPOINT
REASON_STALE_FENCE: Final = Reason.STALE_FENCE
REASON_UNCHANGED: Final = Reason.UNCHANGED
REASON_UNKNOWN_FENCE: Final = Reason.UNKNOWN_FENCE
REASON_UNKNOWN_INTENT: Final = Reason.UNKNOWN_INTENT

SLOT_ABANDONED: Final = SlotStatus.ABANDONED
SLOT_ABSENT: Final = SlotStatus.ABSENT
SLOT_APPEND_GRANTED: Final = SlotStatus.APPEND_GRANTED
SLOT_COMMITTED: Final = SlotStatus.COMMITTED
SLOT_DISCARDED: Final = SlotStatus.DISCARDED
SLOT_HELD: Final = SlotStatus.HELD
SLOT_PENDING: Final = SlotStatus.PENDING

STEP_ALERT: Final = TrailStep.ALERT
STEP_AUTHORITY: Final = TrailStep.AUTHORITY
STEP_CLASSIFICATION: Final = TrailStep.CLASSIFICATION
STEP_EVIDENCE: Final = TrailStep.EVIDENCE
STEP_OBSERVED: Final = TrailStep.OBSERVED
STEP_WHY: Final = TrailStep.WHY

VERDICT_APPEND_ONCE: Final = Verdict.APPEND_ONCE
VERDICT_CONTINUE: Final = Verdict.CONTINUE
VERDICT_DEFERRED: Final = Verdict.DEFERRED
VERDICT_RECORDED: Final = Verdict.RECORDED
VERDICT_WITHHELD: Final = Verdict.WITHHELD

FENCE_ADVISORY: Final = Fence.ADVISORY
FENCE_STORE_ENFORCED: Final = Fence.STORE_ENFORCED

RUNNER_NONE: Final = RunnerAction.NONE
RUNNER_RELEASE_HELD: Final = RunnerAction.RELEASE_HELD
