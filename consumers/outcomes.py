"""What a resume request was answered: three typed outcomes, built from the engine's decision.

* `ContinueWithoutReplay`: the pending batch is already in the Session (or there was none);
  continue, never append it again.
* `AppendOnce`: the batch is absent; append it exactly once under ``fence_token``.
  ``store_enforced`` says whether the Session store itself rejects a stale token (the fenced
  SQLite adapter) or whether the fence is advisory (only well-behaved runners honour it).
* `Withheld`: no authority; stop with ``reason``, tell the operator ``operator_action``.
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.errors import ProtocolError
from engine.core.events import Decision, Fence, Reason, Verdict


@dataclass(frozen=True, slots=True)
class ContinueWithoutReplay:
    """The pending batch is already in the Session (or there was none): continue, never
    append it again. ``fence_token`` is the grant's token (None when the engine gave none)."""

    decision: Decision
    fence_token: int | None

    @property
    def reason(self) -> Reason:
        """The engine's reason code for the grant."""
        return self.decision.reason


@dataclass(frozen=True, slots=True)
class AppendOnce:
    """The batch is absent: append it exactly once carrying ``fence_token``; ``store_enforced``
    says whether the store itself refuses a stale token."""

    decision: Decision
    fence_token: int
    store_enforced: bool

    @property
    def reason(self) -> Reason:
        """The engine's reason code for the grant."""
        return self.decision.reason


@dataclass(frozen=True, slots=True)
class Withheld:
    """No authority: stop. ``reason`` says why, ``holder`` who holds the session (if anyone),
    ``operator_action`` what a person should do."""

    decision: Decision
    reason: Reason
    holder: str | None
    operator_action: str | None


ResumeOutcome = ContinueWithoutReplay | AppendOnce | Withheld


def outcome_from_decision(decision: Decision) -> ResumeOutcome:
    """The typed outcome of a FINAL decision answering a resume; anything else is a
    `ProtocolError` (the client never turns a missing or odd answer into a verdict)."""
    if not decision.final:
        raise ProtocolError(
            f"decision {decision.decision_id} is not final ({decision.verdict.value})",
            session_id=decision.session_id,
        )
    if decision.verdict is Verdict.CONTINUE:
        return ContinueWithoutReplay(decision, decision.fence_token)
    if decision.verdict is Verdict.APPEND_ONCE:
        if decision.fence_token is None:
            raise ProtocolError(
                f"append grant {decision.decision_id} carries no fence token",
                session_id=decision.session_id,
            )
        return AppendOnce(
            decision, decision.fence_token, store_enforced=decision.fence is Fence.STORE_ENFORCED
        )
    if decision.verdict is Verdict.WITHHELD:
        return Withheld(decision, decision.reason, decision.holder, decision.operator_action)
    raise ProtocolError(
        f"decision {decision.decision_id} answers a resume with {decision.verdict.value}",
        session_id=decision.session_id,
    )


def answers(decision: Decision, request_id: str) -> bool:
    """True when ``decision`` is the final answer to the input (resume, intent, ack or repair)
    whose event id is ``request_id``.

    An input that waits is answered first with ``final=False`` (DEFERRED for a resume, RECORDED
    PARKED for an intent or ack; id == request id) and later once more with id
    ``request_id + "/final"``; only the final one counts (SPEC.md §6).
    """
    return decision.final and decision.in_reply_to == request_id
