"""The root of every error the engine runtime raises on purpose.

Each error names what went wrong and what the operator should do about it, so a message in a log
is enough to act on. The pure core (`engine.core`) and the wire codec (`engine.wire`) have roots
of their own; decisions about sessions are data, never exceptions.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class: `str(error)` is the cause followed by the fix."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(f"{cause} Fix: {fix}")
        self.cause = cause
        self.fix = fix


class ConfigError(EngineError):
    """The settings (file, environment or flags) are invalid."""


class TopicLayoutError(EngineError):
    """An existing topic contradicts the layout the engine needs (partitions, cleanup)."""


class KafkaUnavailableError(EngineError):
    """The brokers did not answer in time."""
