"""The generated Avro path gives what the reference path (fastavro + msgspec) gives, always.

Same bytes out for every value; for any bytes in, the same value or the same refusal (reason
and message). A generated reader only ever declines, so a refusal is the reference's by
construction; what these tests catch is a generated path that accepts, or decodes differently,
what the reference would not.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import fastavro
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.wire import MODEL_OF, POLICY, SHIPPED_SCHEMAS, Codec, DecodeError, RecordType
from engine.wire.avro_gen import UnsupportedSchemaError, reader_for, writer_for
from engine.wire.limits import DEFAULT_LIMITS, WireLimits
from tests.unit.wire.test_values import values_of

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "wire"
CORPUS_FILES = sorted(CORPUS.glob("*/v*/*.avro"))
TINY = WireLimits(
    max_items_per_batch=1, max_digests_per_tail=2, max_string_length=4, max_trail_entries=1
)
EXAMPLES = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _outcome(codec: Codec, record_type: RecordType, data: bytes) -> Any:
    try:
        return codec.decode(record_type, data)
    except DecodeError as refusal:
        # fastavro's messages may name an object's address; nothing else may differ.
        return (refusal.reason, re.sub(r" at 0x[0-9a-f]+", "", refusal.message))


def _same_outcome(limits: WireLimits, record_type: RecordType, data: bytes) -> None:
    generated = _outcome(Codec(limits=limits), record_type, data)
    reference = _outcome(Codec(limits=limits, generated=False), record_type, data)
    assert generated == reference
    assert type(generated) is type(reference)


@pytest.mark.parametrize("record_type", list(RecordType))
def test_every_current_schema_has_a_generated_reader_and_writer(record_type: RecordType) -> None:
    schema = SHIPPED_SCHEMAS.current(record_type).parsed
    writer_for(schema, MODEL_OF[record_type])
    reader_for(schema, MODEL_OF[record_type], DEFAULT_LIMITS)


@pytest.mark.parametrize("record_type", list(RecordType))
@EXAMPLES
@given(data=st.data())
def test_generated_bytes_and_values_match_the_reference(
    record_type: RecordType, data: st.DataObject
) -> None:
    value = data.draw(values_of(record_type))
    encoded = Codec().encode(value)
    assert encoded == Codec(generated=False).encode(value)
    _same_outcome(DEFAULT_LIMITS, record_type, encoded)
    _same_outcome(TINY, record_type, encoded)


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: "/".join(p.parts[-3:]))
def test_corpus_decodes_the_same_both_ways(path: Path) -> None:
    record_type = RecordType(path.parts[-3])
    _same_outcome(DEFAULT_LIMITS, record_type, path.read_bytes())
    _same_outcome(TINY, record_type, path.read_bytes())


CURRENT = [
    (record_type, (CORPUS / record_type.value / f"v{policy.current}" / f"{variant}.avro"))
    for record_type, policy in POLICY.items()
    for variant in ("minimal", "full")
]


@pytest.mark.parametrize(("record_type", "path"), CURRENT, ids=lambda x: str(x)[-40:])
@EXAMPLES
@given(
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10_000),
    tail=st.binary(max_size=3),
)
def test_damaged_bytes_give_the_same_outcome_both_ways(
    record_type: RecordType, path: Path, edits: list[tuple[int, int]], cut: int, tail: bytes
) -> None:
    data = bytearray(path.read_bytes())
    for position, byte in edits:
        data[10 + position % max(1, len(data) - 10)] = byte  # keep the header: reach the body
    data = data[: max(10, len(data) - cut % 4)] + tail
    _same_outcome(DEFAULT_LIMITS, record_type, bytes(data))


class Node(msgspec.Struct):
    next: Node | None = None


def test_a_recursive_schema_is_left_to_the_reference_path() -> None:
    schema: Any = fastavro.parse_schema(
        {
            "type": "record",
            "name": "io.test.Node",
            "fields": [{"name": "next", "type": ["null", "io.test.Node"]}],
        }
    )
    with pytest.raises(UnsupportedSchemaError):
        writer_for(schema, Node)
    with pytest.raises(UnsupportedSchemaError):
        reader_for(schema, Node, DEFAULT_LIMITS)
