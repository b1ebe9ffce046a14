"""Checks applied to a decoded record: size limits before the model, ranges after it.

`engine.wire.values` checks types, enum symbols and digest formats; what the value types do
not express (size limits that are configuration, non-empty batches, ranges) lives here, so the
codec stays the single gate between bytes and the fold.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from msgspec import Struct

from engine.core.events import (
    Binding,
    CausalContext,
    IntentEvent,
    IntentKind,
    PendingRecord,
    ResumeEvent,
)
from engine.wire.limits import WireLimits

# Fields that may never be empty strings: ids and the operator's accountability fields.
_NON_EMPTY = ("event_id", "session_id", "intent_id", "checkpoint_id", "actor", "reason")
# Integer fields that are counts, offsets or times: never negative.
_NON_NEGATIVE = (
    "event_time_ms",
    "fence_token",
    "persisted_count",
    "sequence",
    "committed_count",
    "source_partition",
    "source_offset",
)
MAX_EVENT_TIME_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z. Event times past it are refused at decode: the fold adds leases and
timeouts to event times, and a value near 2^63 overflows the state's long fields at encode."""
MAX_SEQUENCE = 2**53 - 1
"""Counters, sequences and fence tokens: far above any real value, and the fold's `+ 1` stays
exact in every language that reads the decisions as JSON numbers."""
MAX_CAUSES = 64
"""Events one input may name in its causal context (`CausalContext.after`): a producer names
its own previous event and a resume two more, so this is far above any honest value."""
_BOUNDED = {
    "event_time_ms": MAX_EVENT_TIME_MS,
    "fence_token": MAX_SEQUENCE,
    "persisted_count": MAX_SEQUENCE,
    "sequence": MAX_SEQUENCE,
    "committed_count": MAX_SEQUENCE,
    "checkpoint_sequence": MAX_SEQUENCE,
}


def size_violation(record: Any, limits: WireLimits) -> str | None:
    """The first size limit the decoded (not yet validated) record breaks, or None."""
    list_limits = {
        "items": limits.max_items_per_batch,
        "before": limits.max_digests_per_tail,
        "observed_tail": limits.max_digests_per_tail,
        "trail": limits.max_trail_entries,
        "after": MAX_CAUSES,
    }
    # Almost every record fits: a quick exact yes/no first, and only on a "no" the ordered walk
    # that names the same first violation the codec has always reported.
    if _fits("record", record, list_limits, limits.max_string_length):
        return None
    return _first_violation(record, list_limits, limits.max_string_length)


# What fastavro hands back besides str, dict and list; anything else takes the ordered walk.
_SCALARS = frozenset({int, bool, float, bytes, type(None)})


def _fits(name: str, value: Any, list_limits: dict[str, int], max_string: int) -> bool:
    """True when no string, and no list bounded by its field name, is over its limit."""
    kind = type(value)
    if kind is str:
        return len(value) <= max_string
    if kind is dict:
        for key, child in value.items():
            kind = type(child)
            if kind is str:
                if len(child) > max_string:
                    return False
            elif kind not in _SCALARS and not _fits(key, child, list_limits, max_string):
                return False
        return True
    if kind is list:
        bound = list_limits.get(name)
        if bound is not None and len(value) > bound:
            return False
        for child in value:
            if type(child) is str:
                if len(child) > max_string:
                    return False
            elif not _fits(name, child, list_limits, max_string):
                return False
        return True
    return kind in _SCALARS


def _first_violation(record: Any, list_limits: dict[str, int], max_string: int) -> str | None:
    # Iterative walk (records nest a few levels, lists are long): (field name, value) pairs.
    stack: list[tuple[str, Any]] = [("record", record)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, str):
            if len(value) > max_string:
                return f"a string in {name} is {len(value)} characters, limit {max_string}"
        elif isinstance(value, dict):
            stack.extend(value.items())
        elif isinstance(value, list):
            bound = list_limits.get(name)
            if bound is not None and len(value) > bound:
                return f"{name} has {len(value)} entries, limit {bound}"
            stack.extend((name, child) for child in value)
    return None


# Read once: a member read off its enum class is slow under 3.11 (`engine.core.members`).
_DISCARD: Final = IntentKind.DISCARD
_HELD: Final = IntentKind.HELD


def semantic_violation(model: Struct) -> str | None:
    """The first range or shape rule the validated model breaks, or None."""
    problem = _generic_problem(model)
    if problem is not None:
        return problem
    context = getattr(model, "causal", None)
    if type(context) is CausalContext:
        problem = _causal_problem(context)
        if problem is not None:
            return problem
    # `type(...) is`, not isinstance: values are never subclassed, and a negative isinstance
    # on a msgspec class goes through the metaclass's __instancecheck__ (slow, per input).
    if type(model) is IntentEvent:
        if model.kind is not _DISCARD and not model.items:
            return f"a {model.kind} intent needs a non-empty batch"
        if model.kind is _HELD and model.before is not None:
            return "a HELD intent cannot carry before digests: it never reached the Session"
    if type(model) is ResumeEvent:
        if model.checkpoint_sequence < -1:
            return "checkpoint_sequence must be -1 (none) or a write sequence"
        if model.pending is not None:
            return _pending_problem(model.pending)
    return None


def _causal_problem(context: CausalContext) -> str | None:
    if not context.producer.strip():
        return "causal.producer must not be empty"
    if not 0 <= context.seq <= MAX_SEQUENCE:
        return f"causal.seq is {context.seq}, outside 0..{MAX_SEQUENCE}"
    for cause in context.after:
        if not 0 <= cause.seq <= MAX_SEQUENCE:
            return f"causal.after.seq is {cause.seq}, outside 0..{MAX_SEQUENCE}"
        if not cause.producer.strip():
            return "causal.after.producer must not be empty"
    return None


def _pending_problem(pending: PendingRecord) -> str | None:
    if not pending.items:
        return "pending.items must not be empty (the SDK never records an empty batch)"
    if pending.held and pending.before is not None:
        return "a held pending record cannot carry before digests"
    if pending.append_acknowledged and pending.before is None:
        return "append_acknowledged requires before digests"
    return None


class _Checks(NamedTuple):
    """The generic rules that apply to one value type: only the fields it has."""

    non_empty: tuple[str, ...]
    non_negative: tuple[str, ...]
    bounded: tuple[tuple[str, int], ...]
    pending: bool
    binding: bool


_CHECKS: dict[type[Struct], _Checks] = {}


def _checks_of(kind: type[Struct]) -> _Checks:
    checks = _CHECKS.get(kind)
    if checks is None:
        names = set(kind.__struct_fields__)
        checks = _Checks(
            tuple(name for name in _NON_EMPTY if name in names),
            tuple(name for name in _NON_NEGATIVE if name in names),
            tuple((name, bound) for name, bound in _BOUNDED.items() if name in names),
            "pending" in names,
            "binding" in names,
        )
        _CHECKS[kind] = checks
    return checks


def _generic_problem(model: Struct) -> str | None:
    checks = _checks_of(type(model))
    for name in checks.non_empty:
        value = getattr(model, name)
        if isinstance(value, str) and not value.strip():
            return f"{name} must not be empty"
    for name in checks.non_negative:
        value = getattr(model, name)
        if isinstance(value, int) and value < 0:
            return f"{name} must not be negative (got {value})"
    for name, bound in checks.bounded:
        value = getattr(model, name)
        if isinstance(value, int) and value > bound:
            return f"{name} is {value}, above its range (at most {bound})"
    pending = getattr(model, "pending", None) if checks.pending else None
    if type(pending) is PendingRecord and pending.persisted_count > MAX_SEQUENCE:
        return f"pending.persisted_count is {pending.persisted_count}, above {MAX_SEQUENCE}"
    binding = getattr(model, "binding", None) if checks.binding else None
    if type(binding) is Binding:
        if binding.chunk_size is not None and binding.chunk_size <= 0:
            return "binding.chunk_size must be positive or null"
        if not binding.backend_id.strip():
            return "binding.backend_id must not be empty"
    return None
