"""Who may write now: the holder, its fence token and its lease (event time)."""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.events import (
    AckEvent,
    IntentEvent,
    Reason,
)
from engine.core.members import (
    REASON_NOT_HOLDER,
    REASON_STALE_FENCE,
    REASON_UNKNOWN_FENCE,
)
from engine.core.state import (
    LEASE_MS,
    SessionState,
)


def check_writer(
    state: SessionState, runner_id: str, fence_token: int | None, at_ms: int
) -> Reason | None:
    """None when this runner may write under this token now; else why not."""
    if state.fence_token > 0:
        if fence_token is None or fence_token < state.fence_token:
            return REASON_STALE_FENCE
        if fence_token > state.fence_token:
            return REASON_UNKNOWN_FENCE
        return None if runner_id == state.holder else REASON_NOT_HOLDER
    if fence_token is not None:
        return REASON_UNKNOWN_FENCE
    if state.holder not in (None, runner_id) and lease_active(state, at_ms):
        return REASON_NOT_HOLDER
    return None


def awaits_grant(state: SessionState, event: IntentEvent | AckEvent) -> bool:
    """The write carries a fence newer than any grant the engine folded: the resume that
    granted it is still on its way on the resumes topic (or never existed)."""
    return event.fence_token is not None and event.fence_token > state.fence_token


def lease_active(state: SessionState, at_ms: int) -> bool:
    """`SessionState.lease_active` for the compiled modules: the method runs interpreted (the
    struct modules are not compiled), this does not."""
    lease = state.lease_expires_ms
    return state.holder is not None and lease is not None and at_ms < lease


def renew(state: SessionState, runner_id: str, at_ms: int) -> SessionState:
    lease = max(state.lease_expires_ms or 0, at_ms + LEASE_MS)
    return replace(state, holder=runner_id, lease_expires_ms=lease)
