"""The one exception root of ``consumers``: `ReconcilerClientError`.

Every error names the ids involved (session, request, intent) and says what the runner or its
operator should do next, so a log line is enough to act on. A withheld continuation is an
exception only at the integration layer (`ContinuationWithheldError`); the client itself returns
it as data (`consumers.outcomes.Withheld`).
"""

from __future__ import annotations

from engine.core.events import Reason


class ReconcilerClientError(Exception):
    """Root of every exception this package raises on purpose. ``str(error)`` ends with the fix."""

    def __init__(self, cause: str, fix: str, *, session_id: str | None = None) -> None:
        super().__init__(f"{cause} Fix: {fix}")
        self.cause = cause
        self.fix = fix
        self.session_id = session_id


class PublishError(ReconcilerClientError):
    """A record was not acknowledged by the brokers (acks=all) in time: it may not be durable.

    Raised by ``register_intent`` before the Session is touched, so the append never starts.
    """

    def __init__(self, *, topic: str, session_id: str, event_id: str, detail: str) -> None:
        super().__init__(
            f"record {event_id} for session {session_id!r} was not delivered to {topic}: {detail}.",
            "do not touch the Session; retry when the brokers are reachable.",
            session_id=session_id,
        )
        self.topic = topic
        self.event_id = event_id


class ResumeTimeoutError(ReconcilerClientError):
    """No final decision for a resume request arrived in time. The verdict is unknown: the runner
    must not continue (never guess)."""

    def __init__(
        self, *, session_id: str, request_id: str, waited_s: float, partition: int
    ) -> None:
        super().__init__(
            f"no final decision for resume {request_id} of session {session_id!r} within "
            f"{waited_s:.1f} s (decisions partition {partition}).",
            "do not continue the run; check that the reconciler engine is running and keeping "
            "up (its lag and health endpoint), then resume again with the same checkpoint.",
            session_id=session_id,
        )
        self.request_id = request_id
        self.waited_s = waited_s
        self.partition = partition


class ProtocolError(ReconcilerClientError):
    """The engine answered something the client contract does not allow (a bug on one side)."""

    def __init__(self, detail: str, *, session_id: str | None = None) -> None:
        super().__init__(
            detail,
            "do not continue the run; report this with the decision id to the engine's owners.",
            session_id=session_id,
        )


class TopicUnavailableError(ReconcilerClientError):
    """The decisions topic is missing or its metadata did not arrive."""

    def __init__(self, *, topic: str, detail: str) -> None:
        super().__init__(
            f"cannot read metadata of topic {topic}: {detail}.",
            "check bootstrap servers and topic prefix; create the topics with "
            "`reconciler topics create`.",
        )
        self.topic = topic


class CheckpointError(ReconcilerClientError):
    """A checkpoint cannot be resumed through the reconciler (unreadable or incomplete)."""

    def __init__(
        self, detail: str, *, session_id: str | None = None, checkpoint_id: str = ""
    ) -> None:
        super().__init__(
            f"checkpoint {checkpoint_id or '?'}: {detail}.",
            "do not continue from this checkpoint; resume from the session's newest checkpoint "
            "saved with ReconciledSession.checkpoint(), or ask an operator to repair the session.",
            session_id=session_id,
        )
        self.checkpoint_id = checkpoint_id


class ContinuationWithheldError(ReconcilerClientError):
    """The engine withheld continuation authority: the run must stop here."""

    def __init__(
        self,
        *,
        session_id: str,
        request_id: str,
        reason: Reason,
        holder: str | None,
        operator_action: str | None,
    ) -> None:
        super().__init__(
            f"continuation of session {session_id!r} withheld ({reason.value}; holder "
            f"{holder or 'none'}; request {request_id}).",
            operator_action or "do not continue this run; ask an operator.",
            session_id=session_id,
        )
        self.request_id = request_id
        self.reason = reason
        self.holder = holder
        self.operator_action = operator_action


class AppendNotWrittenError(ReconcilerClientError):
    """The store rolled the append back before committing: nothing of the batch was written.

    This is definite evidence (the wrapper acknowledges NOT_WRITTEN), unlike an arbitrary
    exception from ``add_items``, whose outcome is unknown.
    """

    def __init__(self, cause: str, fix: str, *, session_id: str) -> None:
        super().__init__(cause, fix, session_id=session_id)


class StoreRolledBackError(AppendNotWrittenError):
    """The append failed inside the store's transaction and was rolled back."""

    def __init__(self, *, session_id: str, detail: str) -> None:
        super().__init__(
            f"append to session {session_id!r} failed before commit and was rolled back: {detail}.",
            "nothing was written; checkpoint the run and resume it through the reconciler.",
            session_id=session_id,
        )


class StaleFenceError(AppendNotWrittenError):
    """The fenced store refused an append: it carries an older fence token than the store's.

    Another runner was granted authority after this one; this copy must stop.
    """

    def __init__(self, *, session_id: str, carried: int, current: int) -> None:
        super().__init__(
            f"append to session {session_id!r} refused by the store: fence token {carried} is "
            f"older than the store's {current}; another runner holds authority.",
            "stop this runner; nothing was written. Do not retry the append.",
            session_id=session_id,
        )
        self.carried = carried
        self.current = current


class NotResumedError(ReconcilerClientError):
    """A restored runner tried to append before the engine granted it authority."""

    def __init__(self, *, session_id: str) -> None:
        super().__init__(
            f"session {session_id!r} was restored but not resumed through the reconciler.",
            "call resume_from_checkpoint (or restore_run_state) and continue only on a grant.",
            session_id=session_id,
        )


class SdkCheckpointError(ReconcilerClientError):
    """The openai-agents checkpoint's ``pending_session_write`` record is one the SDK 0.24.0
    loader refuses, or one the engine cannot compare (``before`` entries that are not digests)."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"invalid pending_session_write record: {detail}.",
            "do not continue from this checkpoint; resume from one saved by "
            "ReconciledSession.checkpoint(), or ask an operator to repair the session.",
        )
        self.detail = detail
