"""Accepting the openai-agents SDK's own checkpoint record (``pending_session_write``).

`read_pending_session_write` applies the SDK 0.24.0 loader's rules to a RunState JSON object
(schema labels 1.17 to 1.21): a record it returns is one ``RunState.from_json`` accepts, and
a record it refuses is one the SDK refuses ("Run state pending Session write is invalid").
Key sets are exact and gated by label: 1.17 has the four base keys, 1.18 adds the compaction
keys, 1.19 adds the held keys. Type checks copy the SDK's own (``type(x) is int`` where it uses
that, ``isinstance`` elsewhere), so ``True`` is not a count and ``"true"`` is not a flag.

`pending_record` then turns an accepted record into the engine's payload-free `PendingRecord`.
That step can refuse what the SDK accepts: ``before`` entries that are not SHA-256 hex digests
(the SDK stores any strings) cannot be compared by the engine, which fails closed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from consumers.errors import SdkCheckpointError
from engine.core.digest import item_facts
from engine.core.events import PendingRecord, is_digest

PENDING_WRITE_KEY = "pending_session_write"
SDK_SCHEMA_VERSIONS = ("1.17", "1.18", "1.19", "1.20", "1.21")
"""RunState labels that can carry a pending write, as of openai-agents 0.24.0."""
OLDER_SDK_SCHEMA_VERSIONS = tuple(f"1.{minor}" for minor in range(17))
"""Labels the SDK still loads but that predate the pending write (1.0 to 1.16)."""

BASE_KEYS = frozenset({"session_id", "items", "before", "persisted_count"})
COMPACTION_KEYS = frozenset(
    {
        "response_id",
        "store",
        "has_local_tool_outputs",
        "append_acknowledged",
        "compaction_model_exchange",
    }
)
HELD_KEYS = frozenset({"held", "reasoning_item_id_policy", "current_response"})
REASONING_POLICIES = (None, "preserve", "omit")
RESUMABLE_STEPS = ("next_step_run_again", "next_step_interruption")


@dataclass(frozen=True, slots=True)
class SdkPendingWrite:
    """A ``pending_session_write`` record the SDK would load, with its label's defaults."""

    schema_version: str
    session_id: str
    items: tuple[Mapping[str, Any], ...]
    before: tuple[str, ...] | None
    persisted_count: int
    held: bool
    append_acknowledged: bool
    has_local_tool_outputs: bool
    response_id: str | None
    store: bool | None
    reasoning_item_id_policy: str | None
    current_response: tuple[int, int] | None  # (turn, start)
    compaction_item_digests: tuple[str, ...] | None


def _invalid(why: str) -> SdkCheckpointError:
    return SdkCheckpointError(f"{why} (the SDK 0.24.0 refuses this checkpoint too)")


def read_pending_session_write(run_state: Mapping[str, Any]) -> SdkPendingWrite | None:
    """The checkpoint's pending write, None when it has none, or `SdkCheckpointError` when
    the SDK 0.24.0 loader would refuse it."""
    label = run_state.get("$schemaVersion")
    if not isinstance(label, str) or label not in SDK_SCHEMA_VERSIONS + OLDER_SDK_SCHEMA_VERSIONS:
        raise _invalid(f"schema version {label!r} is not one the SDK 0.24.0 loads")
    record = run_state.get(PENDING_WRITE_KEY)
    if record is None:
        return None
    minor = int(label.split(".", 1)[1])
    if minor < 17:
        raise _invalid(f"schema {label} predates pending writes (1.17)")
    step = run_state.get("current_step")
    if not (step and isinstance(step, dict) and step.get("type") in RESUMABLE_STEPS):
        raise _invalid("a pending write needs a run-again or interruption current_step")
    if not isinstance(record, dict):
        raise _invalid("the record is not an object")
    allowed = (COMPACTION_KEYS if minor >= 18 else frozenset()) | (
        HELD_KEYS if minor >= 19 else frozenset()
    )
    if set(record) - allowed != BASE_KEYS:
        missing = sorted(BASE_KEYS - set(record))
        extra = sorted(set(record) - allowed - BASE_KEYS)
        raise _invalid(f"keys not allowed under {label}: missing {missing}, unexpected {extra}")
    _check_held(record, run_state.get("current_turn"))
    _check_base(record)
    _check_compaction(record)
    return _build(label, record)


def _check_held(record: Mapping[str, Any], current_turn: Any) -> None:
    if "held" in record and type(record["held"]) is not bool:
        raise _invalid("held must be a boolean")
    held = record.get("held") is True
    if held and record.get("before") is not None:
        raise _invalid("a held batch never reached the Session, so before must be null")
    if held and "current_response" not in record:
        raise _invalid("a held record needs current_response")
    if "reasoning_item_id_policy" in record and record["reasoning_item_id_policy"] not in (
        REASONING_POLICIES
    ):
        raise _invalid("reasoning_item_id_policy must be null, 'preserve' or 'omit'")
    if "current_response" in record and not _current_response_ok(record, current_turn):
        raise _invalid("current_response must be {turn, start} within the run and the batch")
    if not record.get("held") and (
        "reasoning_item_id_policy" in record or "current_response" in record
    ):
        raise _invalid("held-only keys on an ordinary pending write")


def _current_response_ok(record: Mapping[str, Any], current_turn: Any) -> bool:
    boundary = record["current_response"]
    if not isinstance(boundary, dict) or set(boundary) != {"turn", "start"}:
        return False
    turn, start = boundary["turn"], boundary["start"]
    if type(turn) is not int or type(start) is not int:
        return False
    try:
        within_run = bool(0 <= turn <= current_turn)
    except TypeError:  # the SDK compares against whatever current_turn holds, and fails
        return False
    items = record.get("items")
    return within_run and isinstance(items, list) and 0 <= start <= len(items)


def _check_base(record: Mapping[str, Any]) -> None:
    if not isinstance(record.get("session_id"), str):
        raise _invalid("session_id must be a string")
    items = record.get("items")
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise _invalid("items must be a non-empty list of objects")
    before = record.get("before")
    if before is not None and (
        not isinstance(before, list) or not all(isinstance(d, str) for d in before)
    ):
        raise _invalid("before must be null or a list of strings")
    count = record.get("persisted_count")
    if type(count) is not int or count < 0:
        raise _invalid("persisted_count must be a non-negative integer")


def _check_compaction(record: Mapping[str, Any]) -> None:
    if record.get("response_id") is not None and not isinstance(record["response_id"], str):
        raise _invalid("response_id must be null or a string")
    if record.get("store") is not None and not isinstance(record["store"], bool):
        raise _invalid("store must be null or a boolean")
    if "append_acknowledged" in record and not isinstance(record["append_acknowledged"], bool):
        raise _invalid("append_acknowledged must be a boolean")
    if record.get("append_acknowledged") is True and record["before"] is None:
        raise _invalid("an acknowledged append needs before digests")
    if "compaction_model_exchange" in record:
        exchange = record["compaction_model_exchange"]
        if (
            not isinstance(exchange, dict)
            or set(exchange) != {"item_digests", "reasoning_item_id_policy"}
            or not isinstance(exchange["item_digests"], list)
            or not all(isinstance(d, str) for d in exchange["item_digests"])
            or exchange["reasoning_item_id_policy"] not in REASONING_POLICIES
        ):
            raise _invalid("compaction_model_exchange is malformed")
    if "has_local_tool_outputs" in record and not isinstance(
        record["has_local_tool_outputs"], bool
    ):
        raise _invalid("has_local_tool_outputs must be a boolean")


def _build(label: str, record: Mapping[str, Any]) -> SdkPendingWrite:
    boundary = record.get("current_response")
    exchange = record.get("compaction_model_exchange")
    before: Sequence[str] | None = record["before"]
    return SdkPendingWrite(
        schema_version=label,
        session_id=record["session_id"],
        items=tuple(record["items"]),
        before=None if before is None else tuple(before),
        persisted_count=record["persisted_count"],
        held=record.get("held") is True,
        # Defaults the SDK applies at use time to a record that lacks the key.
        append_acknowledged=record.get("append_acknowledged") is True,
        has_local_tool_outputs=record.get("has_local_tool_outputs") is True,
        response_id=record.get("response_id"),
        store=record.get("store"),
        reasoning_item_id_policy=record.get("reasoning_item_id_policy"),
        current_response=None if boundary is None else (boundary["turn"], boundary["start"]),
        compaction_item_digests=None if exchange is None else tuple(exchange["item_digests"]),
    )


def pending_record(write: SdkPendingWrite, *, intent_id: str, ignore_ids: bool) -> PendingRecord:
    """The engine's payload-free view of an accepted record: item facts, never item content.

    ``ignore_ids`` must match the session's binding (True for OpenAI Conversations), since it
    changes every item digest. Raises `SdkCheckpointError` when ``before``
    holds strings that are not SHA-256 hex digests: the engine cannot compare those.
    """
    before = None if write.before is None else list(write.before)
    for index, digest in enumerate(before or []):
        if not is_digest(digest):
            raise SdkCheckpointError(
                "the SDK accepts this record but the engine cannot use it: "
                f"before.{index} is not a SHA-256 hex digest",
            )
    return PendingRecord(
        intent_id=intent_id,
        items=[item_facts(item, ignore_ids=ignore_ids) for item in write.items],
        before=before,
        persisted_count=write.persisted_count,
        held=write.held,
        append_acknowledged=write.append_acknowledged,
    )
