"""Topic names as the runner sees them: the engine's defaults behind one configurable prefix.

Defined here rather than imported from ``engine.settings`` so the client library carries none of
the engine's configuration machinery; `tests/unit/consumers/test_topics.py` checks both agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClientTopics:
    prefix: str = "reconciler."

    @property
    def intents(self) -> str:
        """Pending-write intents (and operator repair commands)."""
        return f"{self.prefix}intents"

    @property
    def acks(self) -> str:
        return f"{self.prefix}acks"

    @property
    def resumes(self) -> str:
        return f"{self.prefix}resumes"

    @property
    def decisions(self) -> str:
        return f"{self.prefix}decisions"
