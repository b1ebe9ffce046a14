"""The runner-side client library of the reconciler (never imports the engine runtime).

* `ReconcilerClient`: durable intents and acks, and ``resume`` answered by the engine's final
  decision (typed `ResumeOutcome`: `ContinueWithoutReplay`, `AppendOnce`, `Withheld`).
* `Checkpoint`: the envelope a runner saves (RunState JSON, checkpoint id, write sequence).
* The openai-agents integration lives in `consumers.agents` (the ``agents`` extra:
  ``pip install './reconciler[agents]'`` from a clone);
  importing `consumers` never imports ``agents``.

`ReconcilerClientError` is the root of every exception raised here.
"""

from consumers.checkpoint import Checkpoint
from consumers.client import AsyncReconcilerClient, ReconcilerApi, ReconcilerClient
from consumers.errors import (
    AppendNotWrittenError,
    CheckpointError,
    ContinuationWithheldError,
    NotResumedError,
    ProtocolError,
    PublishError,
    ReconcilerClientError,
    ResumeTimeoutError,
    SdkCheckpointError,
    StaleFenceError,
    StoreRolledBackError,
    TopicUnavailableError,
)
from consumers.outcomes import AppendOnce, ContinueWithoutReplay, ResumeOutcome, Withheld

__all__ = [
    "AppendNotWrittenError",
    "AppendOnce",
    "AsyncReconcilerClient",
    "Checkpoint",
    "CheckpointError",
    "ContinuationWithheldError",
    "ContinueWithoutReplay",
    "NotResumedError",
    "ProtocolError",
    "PublishError",
    "ReconcilerApi",
    "ReconcilerClient",
    "ReconcilerClientError",
    "ResumeOutcome",
    "ResumeTimeoutError",
    "SdkCheckpointError",
    "StaleFenceError",
    "StoreRolledBackError",
    "TopicUnavailableError",
    "Withheld",
]
