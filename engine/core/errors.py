"""The one exception root of ``engine.core``: programming errors only.

The fold never raises for bad or surprising input; it answers with a decision (``REJECTED``,
``WITHHELD``). These exceptions mean the caller broke a contract of the core API itself.
"""

from __future__ import annotations


class CoreError(Exception):
    """Root of every exception ``engine.core`` raises. Each carries the ids involved."""

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class SessionMismatchError(CoreError):
    """An event was folded into the state of another session (a routing bug in the caller)."""

    def __init__(self, *, state_session_id: str, event_session_id: str) -> None:
        super().__init__(
            f"event for session {event_session_id!r} folded into state of {state_session_id!r}; "
            "the runtime must route by the record key (session id). Fix the caller.",
            session_id=state_session_id,
        )
        self.event_session_id = event_session_id


class StateRecordError(CoreError):
    """A stored state record does not have the documented shape (corrupt changelog entry)."""
