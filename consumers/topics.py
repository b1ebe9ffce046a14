"""Topic names as the runner sees them: the wire contract's, behind one configurable prefix."""

from __future__ import annotations

from engine.wire.topics import TopicNames

ClientTopics = TopicNames
"""The runner library's name for the shared topic layout (prefix default ``reconciler.``)."""
