"""The compiled path (`make setup`, engine/compiled.py) does what its sources do, exactly.

The same fold from the uncompiled sources (`load_pure`) and from what this process runs (the
mypyc extensions after `make setup`; the sources too under ``make setup PURE=1``) gets the
same logs: same decisions, same state bytes. The Avro readers and writers the build compiled
give what the text generated at run time gives, on values, the frozen corpus and damaged bytes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import compiled
from engine.core.events import Event
from engine.core.state import SessionState
from engine.wire import MODEL_OF, SHIPPED_SCHEMAS, Codec, RecordType
from engine.wire.avro_gen import reader_for, writer_for
from engine.wire.limits import DEFAULT_LIMITS
from tests.unit.core.lifecycle_model import World
from tests.unit.core.test_lifecycle import programs
from tests.unit.core.test_properties import worlds
from tests.unit.wire.test_values import values_of

PURE = compiled.load_pure("engine.core.fold")["engine.core.fold"]
CODEC = Codec()
# The corpus files of the current versions: older ones go the reference way, compiled or not.
CORPUS = [
    path
    for path in sorted(
        (Path(__file__).resolve().parents[1] / "fixtures" / "wire").glob("*/v*/*.avro")
    )
    if path.parts[-2] == f"v{SHIPPED_SCHEMAS.current(RecordType(path.parts[-3])).version}"
]
EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def test_a_build_that_exists_is_what_runs() -> None:
    # After `make setup` every compiled module must load as its extension (a stale or half
    # build would fall back to the sources and hide a slowdown); PURE=1 builds nothing.
    built = compiled.MANIFEST.exists() and not os.environ.get(compiled.PURE_ENV)
    rebuild = "sources changed since the compiled build: run `make setup` to rebuild"
    assert compiled.stale_modules() == [], rebuild
    assert compiled.mode() == ("compiled" if built else "pure")


def test_the_one_line_an_operator_reads_names_what_runs() -> None:
    assert compiled.describe().startswith(f"{compiled.mode()}: ")


def test_the_reference_is_the_sources() -> None:
    assert Path(PURE.__file__ or "").suffix == ".py"
    pure_modules = [m for m in vars(PURE).values() if isinstance(m, ModuleType)]
    assert all(Path(m.__file__ or "").suffix != ".so" for m in pure_modules)


def _run(fold: Callable[..., Any], log: Sequence[tuple[Event, int]]) -> list[Any]:
    """Every decision and every state's bytes, in order."""
    states: dict[str, SessionState] = {}
    out: list[Any] = []
    for event, position in log:
        result = fold(states.get(event.session_id), event, position)
        states[event.session_id] = result.state
        out += [*result.decisions, CODEC.encode(result.state)]
    return out


def _same_both_ways(log: Sequence[tuple[Event, int]]) -> None:
    from engine.core.fold import fold

    assert _run(fold, log) == _run(PURE.fold, log)


@EXAMPLES
@given(worlds())
def test_same_decisions_and_state_bytes_on_generated_interleavings(log: list[Event]) -> None:
    _same_both_ways([(event, position) for position, event in enumerate(log)])


@EXAMPLES
@given(programs)
def test_same_decisions_and_state_bytes_on_lifecycles(program: Any) -> None:
    ops, store_acks = program
    world = World(store_acks=store_acks)
    world.run(ops)
    offsets: Counter[Any] = Counter()
    log = []
    for entry in world.log:  # the positions publish() gave: the offset in the input's topic
        log.append((entry.event, offsets[entry.topic]))
        offsets[entry.topic] += 1
    _same_both_ways(log)


def _built_and_generated(record_type: RecordType) -> tuple[Any, Any, Any, Any]:
    schema, model = SHIPPED_SCHEMAS.current(record_type).parsed, MODEL_OF[record_type]
    return (
        writer_for(schema, model),
        writer_for(schema, model, built=False),
        reader_for(schema, model, DEFAULT_LIMITS),
        reader_for(schema, model, DEFAULT_LIMITS, built=False),
    )


@pytest.mark.parametrize("record_type", list(RecordType))
def test_every_current_schema_runs_its_built_reader_and_writer(record_type: RecordType) -> None:
    write, _, read, generated_read = _built_and_generated(record_type)
    if compiled.mode() == "compiled":  # a new schema version is picked up by the build
        assert type(write).__name__ == type(read).__name__ == "builtin_function_or_method"
        assert type(generated_read).__name__ == "function"  # the reference: bytecode


@pytest.mark.parametrize("record_type", list(RecordType))
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_built_codec_writes_and_reads_what_the_generated_text_does(
    record_type: RecordType, data: st.DataObject
) -> None:
    write, generated_write, read, generated_read = _built_and_generated(record_type)
    value = data.draw(values_of(record_type))
    body = _outcome(write, value)
    assert body == _outcome(generated_write, value)
    if isinstance(body, bytes):
        assert read(body) == generated_read(body)


def _outcome(function: Callable[[Any], Any], value: Any) -> Any:
    """What ``function`` returns, or the type of what it raises (a value that does not fit:
    the codec then lets the reference path name the problem)."""
    try:
        return function(value)
    except Exception as error:
        return type(error)


def _damaged(data: bytes) -> list[bytes]:
    """Every truncation, and every byte set to 0x00, 0x7f, 0x80 and 0xff in turn."""
    out = [data[:n] for n in range(len(data))]
    for i in range(len(data)):
        out += [data[:i] + bytes([b]) + data[i + 1 :] for b in (0x00, 0x7F, 0x80, 0xFF)]
    return out


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: "/".join(p.parts[-3:]))
def test_built_readers_accept_and_decline_damaged_corpus_bytes_alike(path: Path) -> None:
    record_type = RecordType(path.parts[-3])
    _, _, read, generated_read = _built_and_generated(record_type)
    writer, body = CODEC.framing.split(path.read_bytes())
    assert writer is SHIPPED_SCHEMAS.current(record_type)
    assert read(bytes(body)) == generated_read(bytes(body)) is not None
    for damaged in _damaged(bytes(body)):
        assert read(damaged) == generated_read(damaged)
