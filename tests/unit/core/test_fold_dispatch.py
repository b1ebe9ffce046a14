"""The fold folds exactly the four input event types; anything else is a caller's bug.

It once folded whatever was not an intent, ack or resume as a repair, so a stray type reaching
it (a subclass, a decoder's own class) could clear a session's health with no operator's word.
"""

from __future__ import annotations

import pytest

from engine.core.events import RepairEvent, RepairResolution
from engine.core.fold import fold
from engine.core.state import Health, SessionState
from tests.unit.core.builders import SID


class LookalikeRepair(RepairEvent, frozen=True, kw_only=True):
    """Has every field of a repair, but is not one of the types the wire contract decodes."""


def test_a_type_that_is_not_exactly_an_input_event_is_refused_with_its_name() -> None:
    ambiguous = SessionState(session_id=SID, health=Health.AMBIGUOUS)
    lookalike = LookalikeRepair(
        event_id="x-1",
        session_id=SID,
        event_time_ms=1_000,
        resolution=RepairResolution.ACCEPT_COMMITTED,
        actor="ops@example",
        reason="checked the store",
        intent_id=None,
    )
    with pytest.raises(TypeError, match="not LookalikeRepair: fix the caller"):
        fold(ambiguous, lookalike, 0)
