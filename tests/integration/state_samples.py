"""Session states of every shape the fold makes, with the inputs that made them: what the
upgrade test (tests/integration/test_engine_upgrade.py) carries across releases.

The runner model of the lifecycle tests (tests/unit/core/lifecycle_model.py: crashes, lost and
unknown acks, partial appends, foreign writers, held batches, one or two restored copies) runs
seeded programs, with and without causal context, with and without store acks, on bindings
that differ from the default in every field. Each log is folded in time order, with each topic
read ahead of the other two, and in a random merge, and the state after every input is a
sample: open writes, parked intents, acks and resumes, inputs waiting for their causes,
producer marks, grants and leases. A session left AMBIGUOUS or VIOLATED then gets an operator
repair (each kind in turn). `unexercised` names every field, nested ones included, that no
sample sets to anything but its default, so a field added to the state fails the upgrade test
until the samples carry it.
"""

from __future__ import annotations

import enum
import functools
import random
import types
import typing
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
from msgspec.structs import replace

from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Binding,
    Cause,
    Event,
    IntentEvent,
    IntentKind,
    RepairEvent,
    RepairResolution,
    ResumeEvent,
)
from engine.core.state import UNRESOLVED, Health, SessionState, SlotStatus
from tests.unit.core.lifecycle_model import (
    BINDING,
    Fault,
    Foreign,
    ForeignWrite,
    Hold,
    Input,
    Op,
    Restore,
    Settle,
    Topic,
    World,
    Write,
    fold_placed,
    repair_event,
)

Run = list[tuple[Event, int]]
"""One session's inputs in the order they are folded, each with its offset in its topic."""

BINDINGS = [
    BINDING,
    Binding(
        backend_id="model-store",
        namespace="lifecycle",
        digest_scheme="sdk-sha256-v1+ids",
        ignore_ids=True,
        checkpoint_schema_version="1.22",
        store_enforces_fence=True,
        chunk_size=20,
        items_digest_stable=False,
    ),
]
REPAIRS = list(RepairResolution)
EVERY_VALUE: dict[str, type[enum.Enum]] = {"health": Health, "slot.status": SlotStatus}
"""Fields whose every value some sample must hold (a value other than the default says little)."""
SET = "(set)"


def _program(rng: random.Random) -> list[Op]:
    ops: list[Op] = []
    for _ in range(rng.randint(2, 8)):
        pick = rng.randrange(6)
        if pick < 2:
            ops.append(Write(rng.choice(list(Fault))))
        elif pick == 2:
            ops.append(ForeignWrite(rng.choice(list(Foreign))))
        elif pick == 3:
            ops.append(Restore(rng.choice([1, 2]), rng.choice(list(Fault))))
        elif pick == 4:
            ops.append(Hold())
        else:
            ops.append(Settle(rng.random() < 0.3))
    return ops


def _merges(log: list[Input], rng: random.Random) -> Iterator[list[Input]]:
    """Time order, each topic read wholly ahead of the other two, and one random merge."""
    yield list(log)
    for topic in Topic:
        yield [*(i for i in log if i.topic is topic), *(i for i in log if i.topic is not topic)]
    queues = {t: [i for i in log if i.topic is t] for t in Topic}
    merged: list[Input] = []
    while any(queues.values()):
        merged.append(queues[rng.choice([t for t in Topic if queues[t]])].pop(0))
    yield merged


def _placed(event: Event, session_id: str, binding: Binding) -> Event:
    if isinstance(event, ResumeEvent):
        named = None if event.checkpoint_session_id is None else session_id
        return replace(event, session_id=session_id, binding=binding, checkpoint_session_id=named)
    if isinstance(event, IntentEvent):
        return replace(event, session_id=session_id, binding=binding)
    return replace(event, session_id=session_id)


def _varied(log: list[Input]) -> list[Input]:
    """The same log with what the model leaves at its default: a store ack's committed count,
    a settle or discard after the held batch's tools ran, a checkpoint that saw its append
    acknowledged, and a resume that names only its checkpoint runner's first event (so where
    the intent it names is not folded yet, it parks for it instead of waiting for its cause)."""
    sizes: dict[str, int] = {}
    acknowledged: set[str] = set()
    varied: list[Input] = []
    for item in log:
        event = item.event
        if isinstance(event, IntentEvent):
            sizes[event.intent_id] = len(event.items)
            if event.kind in (IntentKind.RELEASE, IntentKind.DISCARD):
                event = replace(event, tools_ran=True)
        elif isinstance(event, AckEvent) and event.outcome is AckOutcome.COMMITTED:
            acknowledged.add(event.intent_id)
            if event.source is AckSource.STORE:
                event = replace(event, committed_count=sizes.get(event.intent_id))
        elif isinstance(event, ResumeEvent):
            pending = event.pending
            if pending is not None and pending.intent_id in acknowledged:
                event = replace(event, pending=replace(pending, append_acknowledged=True))
            if event.causal is not None and event.causal.after:
                first = Cause(producer=event.causal.after[0].producer, seq=0)
                event = replace(event, causal=replace(event.causal, after=[first]))
        varied.append(Input(item.topic, event, item.copy))
    return varied


def _repair(state: SessionState, n: int) -> RepairEvent | None:
    """An operator's repair of a session the fold cannot settle alone (each kind in turn)."""
    open_write = state.slot is not None and state.slot.status in UNRESOLVED
    if state.health is Health.CLEAR and not (open_write and n % 3 == 0):
        return None
    return repair_event(
        f"{state.session_id}/repair",
        state.session_id,
        10_000_000,
        REPAIRS[n % len(REPAIRS)],
        None if state.slot is None else state.slot.intent_id,
    )


def runs(worlds: int = 72, seed: int = 4) -> list[Run]:
    """Per world and merge, one session's inputs (a repair last where one is due)."""
    rng = random.Random(seed)
    found: list[Run] = []
    for w in range(worlds):
        world = World(store_acks=w % 2 == 0, causal=w % 4 < 2)
        world.run(_program(rng))
        log = _varied(world.log) if w % 3 == 2 else world.log
        for m, order in enumerate(_merges(log, rng)):
            session_id = f"sample-{seed}-{w}-{m}"
            binding = BINDINGS[(w // 4) % len(BINDINGS)]
            offsets = dict.fromkeys(Topic, 0)
            run: Run = []
            for item in order:
                run.append((_placed(item.event, session_id, binding), offsets[item.topic]))
                offsets[item.topic] += 1
            state = fold_run(run)[-1] if run else None
            repair = None if state is None else _repair(state, len(found))
            if repair is not None:
                run.append((repair, offsets[Topic.INTENTS]))
            found.append(run)
    return found


def fold_run(run: Run) -> list[SessionState]:
    """The state after each input of ``run``."""
    return fold_placed(None, run)[0]


def sample_states(sampled: Iterable[Run]) -> list[SessionState]:
    """Every distinct state the runs pass through."""
    seen: dict[bytes, SessionState] = {}
    for run in sampled:
        for state in fold_run(run):
            seen.setdefault(msgspec.msgpack.encode(state), state)
    return list(seen.values())


@functools.cache
def _defaults(struct: type[msgspec.Struct]) -> dict[str, Any]:
    """Field name -> its default; a required field maps to `msgspec.NODEFAULT`."""
    found: dict[str, Any] = {}
    for info in msgspec.structs.fields(struct):
        if info.default_factory is not msgspec.NODEFAULT:
            found[info.name] = info.default_factory()
        else:
            found[info.name] = info.default
    return found


def _struct_types(hint: Any) -> list[type[msgspec.Struct]]:
    """The Struct types a field's annotation can hold (through lists and unions)."""
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return [hint]
    origin = typing.get_origin(hint)
    if origin in (list, typing.Union, types.UnionType):
        return [s for arg in typing.get_args(hint) for s in _struct_types(arg)]
    return []


def field_paths(struct: type[msgspec.Struct], prefix: str = "") -> list[str]:
    """Every field path under ``struct``: `slot.items[].call_id`, `causal_waiting[].ack.causal`."""
    hints = typing.get_type_hints(struct)
    paths: list[str] = []
    for name in _defaults(struct):
        path = f"{prefix}{name}"
        paths.append(path)
        many = typing.get_origin(hints[name]) is list
        for inner in _struct_types(hints[name]):
            paths += field_paths(inner, f"{path}{'[]' if many else ''}.")
    return paths


def _walk(value: msgspec.Struct, prefix: str, seen: dict[str, set[str]]) -> None:
    for name, default in _defaults(type(value)).items():
        path = f"{prefix}{name}"
        field_value = getattr(value, name)
        values = seen.setdefault(path, set())
        if default is msgspec.NODEFAULT or field_value != default:
            values.add(SET)
        if isinstance(field_value, enum.Enum):
            values.add(field_value.value)
        items = field_value if isinstance(field_value, list) else [field_value]
        for item in items:
            if isinstance(item, msgspec.Struct):
                many = "[]" if isinstance(field_value, list) else ""
                _walk(item, f"{path}{many}.", seen)


def unexercised(states: Iterable[SessionState], skip: Iterable[str] = ()) -> list[str]:
    """The field paths of `SessionState` that no state sets to anything but the default, and
    the values of `EVERY_VALUE` fields that no state holds (``skip``: paths not asked for)."""
    seen: dict[str, set[str]] = {}
    for state in states:
        _walk(state, "", seen)
    skipped = set(skip)
    missing = [
        p for p in field_paths(SessionState) if SET not in seen.get(p, ()) and p not in skipped
    ]
    for path, kind in EVERY_VALUE.items():
        absent = {v.value for v in kind} - seen.get(path, set())
        missing += [f"{path}={value}" for value in sorted(absent)]
    return missing


def causal_fields() -> list[str]:
    """The field paths session_state v4 added (causal order): no earlier version holds them."""
    return [
        p
        for p in field_paths(SessionState)
        if p.startswith(("producers", "causal_waiting")) or ".causal" in p
    ]


_ABSENT = object()


def differing_fields(got: SessionState, want: SessionState) -> list[str]:
    """The field paths (nested, list positions included) where ``got`` and ``want`` differ."""
    return _diff(msgspec.to_builtins(got), msgspec.to_builtins(want), "")


def _diff(got: Any, want: Any, path: str) -> list[str]:
    if isinstance(got, dict) and isinstance(want, dict):
        return [
            found
            for key in sorted(set(got) | set(want))
            for found in _diff(
                got.get(key, _ABSENT), want.get(key, _ABSENT), f"{path}.{key}" if path else key
            )
        ]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [
            found
            for n, (a, b) in enumerate(zip(got, want, strict=True))
            for found in _diff(a, b, f"{path}[{n}]")
        ]
    return [] if got == want else [path]
