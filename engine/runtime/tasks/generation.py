"""What one transaction writes to a partition task (`Generation`, replaced whole by every
reset of the task) and step 3's failure to encode one of its states."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from engine.core.state import Health, SessionState
from engine.runtime.tasks.store import StoreWrite


@dataclass
class Generation:
    """What one transaction wrote to a task: the changed states, their bytes (encoded once,
    at step 3; at fold only for a session whose state once failed to encode there, and for an
    expiry's answer), their park deadlines, step 3's records and how many inputs it folded."""

    states: dict[str, SessionState] = field(default_factory=dict)
    encoded: dict[str, bytes] = field(default_factory=dict)
    deadlines: dict[str, int | None] = field(default_factory=dict)
    writes: list[StoreWrite] = field(default_factory=list)
    folded: int = 0

    def records(
        self,
        since: Mapping[str, int | None],
        watermark: int | None,
        encode: Callable[[SessionState], bytes],
    ) -> list[StoreWrite]:
        """Step 3's records (kept as `writes` for step 6): every changed state not encoded yet
        is encoded now, once per transaction. Raises `StateEncodeError` for one that fails."""
        encoded = self.encoded
        for sid, state in self.states.items():
            if sid not in encoded:
                try:
                    encoded[sid] = encode(state)
                except Exception as exc:
                    raise StateEncodeError(sid, exc) from exc
        self.writes = [
            StoreWrite(
                sid,
                encoded[sid],
                state.slot.status.value if since.get(sid) is not None and state.slot else None,
                since.get(sid),
                None if state.health is Health.CLEAR else state.health.value,
                self.deadlines[sid],
                watermark,
            )
            for sid, state in self.states.items()
        ]
        return self.writes


class StateEncodeError(Exception):
    """Step 3 could not encode the state a transaction folded into `session_id`: that
    transaction must abort; folded again, the session is encoded input by input, so the one
    input that breaks it is dead-lettered alone."""

    def __init__(self, session_id: str, cause: Exception) -> None:
        super().__init__(
            f"the state of session {session_id[:200]!r} cannot be encoded "
            f"({type(cause).__name__}: {cause}); its inputs are folded again one by one and the "
            "input that breaks it is dead-lettered"
        )
        self.session_id, self.cause = session_id, cause
