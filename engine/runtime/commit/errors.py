"""How a transactional call failed, as the loop acts on it (COMMIT_PROTOCOL.md, "Errors")."""

from __future__ import annotations


class AbortableError(Exception):
    """The transaction must be aborted and the inputs rewound (txn_requires_abort)."""


class RejoinError(Exception):
    """Fatal, fenced, unclassified or out of time: drop the tasks, new clients, rejoin."""
