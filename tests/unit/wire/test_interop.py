"""Interoperability with the Apache ``avro`` package, an independent Avro implementation.

Our single-object bytes decode with its DatumReader (header checked against its own
fingerprint), and bodies written by its DatumWriter decode with our codec. Raw digests (the
fixed Sha256 type of session_state v3) are bytes to it: the tests convert them to hex and back.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import pytest

from engine.wire import MODEL_OF, POLICY, SHIPPED_SCHEMAS, Codec, RecordType
from engine.wire.codec import fields_of
from engine.wire.raw_digests import convert, has_raw_digests, hex_to_raw, raw_to_hex
from engine.wire.values import from_json, from_record, to_record

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "wire"
CASES = [
    (record_type, version, variant)
    for record_type, policy in POLICY.items()
    for version in policy.supported
    for variant in ("minimal", "full")
]


def _apache_schema(record_type: RecordType, version: int) -> Any:
    source = SHIPPED_SCHEMAS.get(record_type, version).source
    return avro.schema.parse(json.dumps(dict(source)))


def _model(record_type: RecordType, version: int, variant: str) -> Any:
    text = (CORPUS / record_type.value / f"v{version}" / f"{variant}.json").read_text()
    return from_json(MODEL_OF[record_type], text)


@pytest.mark.parametrize(("record_type", "version", "variant"), CASES)
def test_our_bytes_decode_with_apache_avro(
    record_type: RecordType, version: int, variant: str
) -> None:
    schema = _apache_schema(record_type, version)
    data = (CORPUS / record_type.value / f"v{version}" / f"{variant}.avro").read_bytes()
    assert data[:10] == b"\xc3\x01" + schema.fingerprint("CRC-64-AVRO")
    decoder = avro.io.BinaryDecoder(io.BytesIO(data[10:]))
    record = avro.io.DatumReader(schema).read(decoder)
    expected = _model(record_type, version, variant)
    source = SHIPPED_SCHEMAS.get(record_type, version).source
    if has_raw_digests(source):
        record = convert(source, record, raw_to_hex)
    assert from_record(MODEL_OF[record_type], record) == expected


@pytest.mark.parametrize(("record_type", "version", "variant"), CASES)
def test_apache_avro_bytes_decode_with_our_codec(
    record_type: RecordType, version: int, variant: str
) -> None:
    schema = _apache_schema(record_type, version)
    model = _model(record_type, version, variant)
    body = io.BytesIO()
    # A writer of that version knows only its own fields.
    shipped = SHIPPED_SCHEMAS.get(record_type, version)
    record = fields_of(shipped, to_record(model))
    if has_raw_digests(shipped.source):
        record = convert(shipped.source, record, hex_to_raw)
    avro.io.DatumWriter(schema).write(record, avro.io.BinaryEncoder(body))
    data = b"\xc3\x01" + schema.fingerprint("CRC-64-AVRO") + body.getvalue()
    assert Codec().decode(record_type, data) == model
