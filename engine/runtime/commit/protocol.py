"""Names of the commit protocol's steps (COMMIT_PROTOCOL.md), used in code, logs and tests."""

from __future__ import annotations

from enum import StrEnum


class Step(StrEnum):
    FENCE_PREVIOUS_OWNER = "A0"
    SETTLE_PREVIOUS_OWNER = "A1"
    RESTORE_DELTA = "A2"
    READY = "A3"
    BEGIN = "1"
    FOLD = "2"
    CHANGELOG = "3"
    OFFSETS = "4"
    COMMIT = "5"
    PERSIST_LOCALLY = "6"
