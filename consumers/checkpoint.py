"""The checkpoint envelope a runner stores instead of a bare RunState JSON.

The SDK's RunState has no room for what the reconciler needs to judge a resume, so the envelope
carries it next to the untouched RunState JSON:

* ``checkpoint_id``: copies of one checkpoint share it, so the engine can grant it only once;
* ``sequence``: the last write sequence this runner published for the session (-1: none); a
  checkpoint behind the session's progress is withheld as stale;
* ``pending_intent_id``: the intent under which the write recorded in the RunState's
  ``pending_session_write`` was registered (None when the RunState has none);
* ``after``: the runner's last event about the session that Kafka acknowledged when the
  checkpoint was saved; a resume from it names it, so the engine folds the resume after it
  (causal context, resume v3). Empty in checkpoints saved before it existed.

Version policy: ``format`` names the envelope layout; readers refuse layouts they do not know.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

CheckpointFormat = Literal["reconciler-checkpoint/1"]
CHECKPOINT_FORMAT: Final[CheckpointFormat] = "reconciler-checkpoint/1"


class CheckpointCause(BaseModel):
    """One event the checkpoint's runner had published: its producer id and causal seq."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    producer: str = Field(min_length=1)
    seq: int = Field(ge=0)


class Checkpoint(BaseModel):
    """What a runner saves instead of the bare RunState JSON: the run state plus the ids the
    reconciler needs on restore (checkpoint id, write sequence, the pending write's intent id)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: CheckpointFormat = CHECKPOINT_FORMAT
    checkpoint_id: str = Field(min_length=1)
    session_id: str
    sequence: int = Field(ge=-1)
    pending_intent_id: str | None = None
    after: list[CheckpointCause] = Field(default_factory=list)
    run_state: dict[str, Any]

    def to_json(self) -> str:
        """The checkpoint as JSON text, for the runner's checkpoint store."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Checkpoint:
        """Parse a checkpoint saved with `to_json` (pydantic's ValidationError if it is not one)."""
        return cls.model_validate_json(text)
