"""The openai-agents integration: install with ``pip install 'reconciler[agents]'``.

* `ReconciledSession`: wraps any SDK `Session`; registers intents, acknowledges appends and
  refuses them after a restore until the engine grants continuation.
* `resume_from_checkpoint`, `restore_run_state`: ask the engine about a restored checkpoint.
* `FencedSQLiteSession`: the SDK's `SQLiteSession` that refuses appends with a stale fence.

Only this subpackage imports ``agents``; the plain client (`consumers`) works without it.
"""

from consumers.agents.fenced_sqlite import FencedSQLiteSession
from consumers.agents.resume import restore_run_state, resume_from_checkpoint
from consumers.agents.session import ReconciledSession

__all__ = [
    "FencedSQLiteSession",
    "ReconciledSession",
    "restore_run_state",
    "resume_from_checkpoint",
]
