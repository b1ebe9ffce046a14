"""Fuzzing the decoder: whatever the bytes, it returns a model or raises `DecodeError`.

"Never hangs" is enforced by pytest-timeout on each test (no wall-clock assertions), and
"never allocates without bound" by measuring the peak traced allocation of each decode.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.wire import (
    MODEL_OF,
    POLICY,
    SHIPPED_SCHEMAS,
    Codec,
    DecodeError,
    DecodeReason,
    RecordType,
    RegistryFraming,
)

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "wire"
VALID = [
    (record_type, (CORPUS / record_type.value / f"v{version}" / f"{variant}.avro").read_bytes())
    for record_type, policy in POLICY.items()
    for version in policy.supported
    for variant in ("minimal", "full")
]
HEADERS = [Codec().framing.header_for(SHIPPED_SCHEMAS.current(rt)) for rt in RecordType]
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DEAD_LETTER_REASONS = frozenset(
    next(
        f["type"]["symbols"]
        for f in SHIPPED_SCHEMAS.current(RecordType.DEAD_LETTER).source["fields"]
        if f["name"] == "reason"
    )
)
# Single-object framing never asks a registry, and SDK checkpoints are not wire records.
NEVER_FROM_BYTES = frozenset({DecodeReason.REGISTRY_UNAVAILABLE, DecodeReason.INVALID_CHECKPOINT})
PEAK_BYTES = 4 * 1024 * 1024  # inputs are a few KB; anything near this is unbounded growth

pytestmark = pytest.mark.timeout(120)


def _decode_or_refuse(codec: Codec, record_type: RecordType, data: bytes) -> None:
    """Any other exception propagates and fails the test."""
    try:
        model = codec.decode(record_type, data)
    except DecodeError as error:
        refusal = error
    else:
        assert isinstance(model, MODEL_OF[record_type])
        return
    # Every refusal must be recordable as a dead letter, with a message an operator can read.
    assert refusal.reason.value in DEAD_LETTER_REASONS
    assert refusal.reason not in NEVER_FROM_BYTES
    assert refusal.message.strip()


@FUZZ
@given(st.sampled_from(list(RecordType)), st.binary(max_size=512))
def test_random_bytes(record_type: RecordType, data: bytes) -> None:
    _decode_or_refuse(Codec(), record_type, data)


@FUZZ
@given(st.sampled_from(list(RecordType)), st.sampled_from(HEADERS), st.binary(max_size=512))
def test_valid_header_random_body(record_type: RecordType, header: bytes, body: bytes) -> None:
    _decode_or_refuse(Codec(), record_type, header + body)


@st.composite
def mutated_records(draw: st.DrawFn) -> tuple[RecordType, bytes]:
    record_type, original = draw(st.sampled_from(VALID))
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 6))):
        operation = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if operation == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif operation == "set" and data:
            data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]))
        elif operation == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=9))
        elif operation == "delete" and data:
            del data[at : at + draw(st.integers(1, 4))]
        elif operation == "truncate":
            del data[at:]
    return record_type, bytes(data)


@FUZZ
@given(mutated_records())
def test_mutated_valid_records(case: tuple[RecordType, bytes]) -> None:
    _decode_or_refuse(Codec(), *case)


REGISTRY_CODEC = Codec(framing=RegistryFraming.from_url(SHIPPED_SCHEMAS, "mock://fuzz"))
REGISTERED_IDS = sorted(
    int.from_bytes(REGISTRY_CODEC.framing.header_for(SHIPPED_SCHEMAS.current(rt))[1:], "big")
    for rt in RecordType
)


@FUZZ
@given(mutated_records(), st.sampled_from([*REGISTERED_IDS, 0, 2**31]))
def test_mutated_records_through_registry_framing(
    case: tuple[RecordType, bytes], schema_id: int
) -> None:
    """The single-object header swapped for a registry header with a registered id."""
    record_type, data = case
    registry_data = b"\x00" + schema_id.to_bytes(4, "big") + data[10:]
    _decode_or_refuse(REGISTRY_CODEC, record_type, registry_data)


def _warm_codec() -> Codec:
    """A codec whose generated readers are built (once per process, several MB for the
    session state's): the bound is on decoding, not on building a reader."""
    codec = Codec()
    for record_type, data in VALID:
        codec.decode(record_type, data)
    return codec


WARM_CODEC = _warm_codec()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_records())
def test_decoding_allocation_is_bounded(case: tuple[RecordType, bytes]) -> None:
    codec = WARM_CODEC
    tracemalloc.start()
    try:
        _decode_or_refuse(codec, *case)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES


@pytest.mark.parametrize("record_type", list(RecordType))
def test_forged_maximum_lengths_are_bounded(record_type: RecordType) -> None:
    """Every varint position set to the largest long: each read must fail on the short body."""
    huge = b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01"
    header = Codec().framing.header_for(SHIPPED_SCHEMAS.current(record_type))
    codec = WARM_CODEC
    for prefix_length in range(0, 40, 3):
        data = header + b"\x02" * prefix_length + huge
        tracemalloc.start()
        try:
            _decode_or_refuse(codec, record_type, data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < PEAK_BYTES
