"""The runner-side client library of the reconciler (never imports the engine runtime).

* `ReconcilerClient`: durable intents and acks, and ``resume`` answered by the engine's final
  decision (typed `ResumeOutcome`: `ContinueWithoutReplay`, `AppendOnce`, `Withheld`).
* `FencedSQLiteSession`: openai-agents' `SQLiteSession` that refuses appends with a stale fence.
* `ReconciledSession`, `restore_run_state`: the openai-agents integration.

`ReconcilerClientError` is the root of every exception raised here.
"""

from consumers.agents_resume import restore_run_state, resume_from_checkpoint
from consumers.agents_session import ReconciledSession
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
    StaleFenceError,
    StoreRolledBackError,
    TopicUnavailableError,
)
from consumers.fenced_sqlite import FencedSQLiteSession
from consumers.outcomes import AppendOnce, ContinueWithoutReplay, ResumeOutcome, Withheld

__all__ = [
    "AppendNotWrittenError",
    "AppendOnce",
    "AsyncReconcilerClient",
    "Checkpoint",
    "CheckpointError",
    "ContinuationWithheldError",
    "ContinueWithoutReplay",
    "FencedSQLiteSession",
    "NotResumedError",
    "ProtocolError",
    "PublishError",
    "ReconciledSession",
    "ReconcilerApi",
    "ReconcilerClient",
    "ReconcilerClientError",
    "ResumeOutcome",
    "ResumeTimeoutError",
    "StaleFenceError",
    "StoreRolledBackError",
    "TopicUnavailableError",
    "Withheld",
    "restore_run_state",
    "resume_from_checkpoint",
]
