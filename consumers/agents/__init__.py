"""The openai-agents integration: install the reconciler with its extra,
``pip install './reconciler[agents]'`` from a clone (not by name: PyPI's `reconciler` is
another project).

* `ReconciledSession`: wraps any SDK `Session`; registers intents, acknowledges appends and
  refuses them after a restore until the engine grants continuation.
* `resume_from_checkpoint`, `restore_run_state`: ask the engine about a restored checkpoint.
* `FencedSQLiteSession`: the SDK's `SQLiteSession` that refuses appends with a stale fence.

Only this subpackage imports ``agents``; the plain client (`consumers`) works without it.
"""

try:
    import agents as _sdk  # noqa: F401 (only to say what to install when it is missing)
except ModuleNotFoundError as exc:  # pragma: no cover - exercised by the packaging test
    raise ModuleNotFoundError(
        "consumers.agents needs the openai-agents SDK. Fix: reinstall the reconciler with its"
        " extra from your clone or wheel, e.g. pip install './reconciler[agents]'",
        name=exc.name,
    ) from exc

from consumers.agents.fenced_sqlite import FencedSQLiteSession
from consumers.agents.resume import restore_run_state, resume_from_checkpoint
from consumers.agents.session import ReconciledSession

__all__ = [
    "FencedSQLiteSession",
    "ReconciledSession",
    "restore_run_state",
    "resume_from_checkpoint",
]
