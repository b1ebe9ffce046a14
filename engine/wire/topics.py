"""Topic names of the wire contract: every topic behind one configurable prefix.

Shared by the engine (`engine.settings`) and the runner library (`consumers`), so both always
agree on where records go. Records on every input topic are keyed by session id.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.events import AckEvent, Event, ResumeEvent

DEFAULT_PREFIX = "reconciler."


@dataclass(frozen=True, slots=True)
class TopicNames:
    """Every topic name of the layout: a fixed suffix behind one configurable prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def intents(self) -> str:
        """Pending-write intents (and operator repair commands)."""
        return f"{self.prefix}intents"

    @property
    def acks(self) -> str:
        """Append outcomes from runners or the Session store."""
        return f"{self.prefix}acks"

    @property
    def resumes(self) -> str:
        """Resume requests of restored runners."""
        return f"{self.prefix}resumes"

    @property
    def decisions(self) -> str:
        """The engine's answers, one per input (written by the engine only)."""
        return f"{self.prefix}decisions"

    @property
    def changelog(self) -> str:
        """Engine-internal: compacted per-session state."""
        return f"{self.prefix}changelog"

    @property
    def dead_letters(self) -> str:
        """Every input the engine could not accept, with its position and reason."""
        return f"{self.prefix}dead-letters"

    def topic_for(self, event: Event) -> str:
        """The input topic that carries this event (repair commands ride with the intents)."""
        if isinstance(event, AckEvent):
            return self.acks
        if isinstance(event, ResumeEvent):
            return self.resumes
        return self.intents

    @property
    def inputs(self) -> tuple[str, str, str]:
        """The co-partitioned input topics, in the order a task lists them."""
        return (self.intents, self.acks, self.resumes)
