"""session_state v3: digests as raw bytes, and the break in the version policy it needs.

The engine writes the current version (v4: v3 plus the causal order, read from v3 by
resolution) and reads v1, v2 and v3 to the same value; v3 is smaller than v2 by exactly the hex
half of every digest; a raw digest of the wrong length is refused like any bad field.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from engine.core.fold import fold
from engine.core.state import SessionState
from engine.runtime.tasks.state_codec import StateFormatError, decode_state, encode_state
from engine.wire import POLICY, SHIPPED_SCHEMAS, Codec, DecodeError, DecodeReason, RecordType
from engine.wire.raw_digests import convert, has_raw_digests, hex_to_raw
from engine.wire.validation import semantic_violation
from engine.wire.values import to_record
from tests.unit.wire.test_values import values_of
from tools.bench_fold import session_events
from tools.bench_state import field_sizes, idle_state

STATE = RecordType.SESSION_STATE
POLICY_OF_STATE = POLICY[STATE]
CODEC = Codec()
REFERENCE = Codec(generated=False)
EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _digests(state: SessionState) -> int:
    """How many digests a state holds, wherever they sit."""
    count = 0

    def visit(value: Any, digest_list: bool) -> None:
        nonlocal count
        if isinstance(value, dict):
            for key, child in value.items():
                if key == "digest":
                    count += 1
                else:
                    visit(child, key in ("before", "observed_tail"))
        elif isinstance(value, list):
            if digest_list:
                count += len(value)
            else:
                for child in value:
                    visit(child, False)

    visit(to_record(state), False)
    return count


def test_the_engine_writes_v4_and_reads_every_version_through_its_own_line() -> None:
    assert POLICY_OF_STATE.current == 4
    assert has_raw_digests(SHIPPED_SCHEMAS.current(STATE).source)
    assert [POLICY_OF_STATE.reader_version(v) for v in (1, 2, 3, 4)] == [2, 2, 4, 4]


def test_avro_resolution_would_misread_v2_as_v3_which_is_why_v3_is_a_break() -> None:
    # Avro promotes a string to bytes: resolution gives the 64 bytes of the hex text, not the
    # 32 raw bytes of the digest, so a v2 state must be read with v2's schema instead.
    v2, v3 = SHIPPED_SCHEMAS.get(STATE, 2), SHIPPED_SCHEMAS.get(STATE, 3)
    slot = _idle_state().slot
    assert slot is not None
    assert slot.before is not None
    body = io.BytesIO(CODEC.encode(SessionState(session_id="s", slot=slot), version=2)[10:])
    resolved: Any = fastavro.schemaless_reader(body, v2.parsed, v3.parsed)
    assert resolved["slot"]["before"][0] == slot.before[0].encode() != bytes.fromhex(slot.before[0])
    assert CODEC.decode(
        STATE, CODEC.encode(SessionState(session_id="s", slot=slot), version=2)
    ) == (SessionState(session_id="s", slot=slot))


@EXAMPLES
@given(state=values_of(STATE))
def test_v3_bytes_and_value_round_trip_exactly_and_v2_reads_to_the_same_value(
    state: SessionState,
) -> None:
    assume(semantic_violation(state) is None)  # range and shape rules: tests/unit/wire/test_values
    codec = CODEC
    current = codec.encode(state)
    assert current[2:10] == SHIPPED_SCHEMAS.current(STATE).fingerprint
    assert codec.decode(STATE, current) == state
    assert codec.encode(codec.decode(STATE, current)) == current
    # v2 and v3 writers drop the causal order (v4) alike, and read back to the same value.
    v3 = codec.encode(state, version=3)
    assert v3[2:10] == SHIPPED_SCHEMAS.get(STATE, 3).fingerprint
    v2 = codec.encode(state, version=2)
    assert codec.decode(STATE, v2) == codec.decode(STATE, v3)
    # Every digest costs 2 + 64 bytes as hex text in v2 and 1 + 32 raw in v3, nothing else moves.
    read_back = codec.decode(STATE, v3)
    assert isinstance(read_back, SessionState)
    assert len(v2) - len(v3) == 33 * _digests(read_back)


@EXAMPLES
@given(state=values_of(STATE))
def test_generated_and_fastavro_paths_write_and_read_v3_alike(state: SessionState) -> None:
    assume(semantic_violation(state) is None)
    schema = SHIPPED_SCHEMAS.current(STATE)
    body = io.BytesIO()
    record = convert(schema.source, to_record(state), hex_to_raw)
    fastavro.schemaless_writer(body, schema.parsed, record, strict=True)
    written = CODEC.encode(state)
    assert written == REFERENCE.encode(state)
    assert written[10:] == body.getvalue()
    assert REFERENCE.decode(STATE, written) == CODEC.decode(STATE, written)


def _idle_state() -> SessionState:
    """A session of the bench mix after its REGISTER intent: the idle state of `make bench`."""
    intent = session_events(7)[0]
    return fold(None, intent, 0).state


def test_an_idle_bench_session_takes_a_third_fewer_bytes() -> None:
    state = _idle_state()
    v2, v3 = CODEC.encode(state, version=2), CODEC.encode(state, version=3)
    current = encode_state(state)
    assert _digests(state) == 4
    # v4 adds two empty arrays (the causal order) and a null `causal` per parked input.
    assert (len(v2), len(v3), len(current)) == (406, 274, 276)
    assert decode_state(v2) == decode_state(v3) == decode_state(current) == state


@pytest.mark.parametrize("generated", [True, False])
@pytest.mark.parametrize("length", [0, 31, 33])
def test_a_v3_digest_of_the_wrong_length_is_refused(generated: bool, length: int) -> None:
    schema = SHIPPED_SCHEMAS.current(STATE)
    record = convert(schema.source, to_record(_idle_state()), hex_to_raw)
    record["slot"]["before"][0] = bytes(length)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema.parsed, record, strict=True)
    data = CODEC.framing.header_for(schema) + body.getvalue()
    with pytest.raises(DecodeError) as refused:
        (CODEC if generated else REFERENCE).decode(STATE, data)
    assert refused.value.reason is DecodeReason.INVALID_FIELDS
    with pytest.raises(StateFormatError, match="rebuild the partition"):
        decode_state(data)


@EXAMPLES
@given(text=st.text(max_size=70) | st.text("0123456789abcdefABCDEF ", min_size=63, max_size=66))
def test_only_lowercase_hex_digests_are_written(text: str) -> None:
    slot = _idle_state().slot
    assert slot is not None
    odd = SessionState(session_id="s", slot=replace(slot, before=[text]))
    good = len(text) == 64 and all(c in "0123456789abcdef" for c in text)
    for codec in (CODEC, REFERENCE):
        if good:
            assert codec.decode(STATE, codec.encode(odd)) == odd
        else:
            with pytest.raises(Exception, match="hex"):
                codec.encode(odd)


def test_the_state_bench_counts_every_byte_field_by_field() -> None:
    """tools/bench_state.py's size walk adds up to the encoded length (it asserts so) and puts
    the saving where the digests are: 2 before digests and 2 item digests, 33 bytes each."""
    v2, v3 = field_sizes(idle_state(5), 2), field_sizes(idle_state(5), 3)
    assert (sum(v2.values()), sum(v3.values())) == (406, 274)
    assert {name: v2[name] - v3[name] for name in v3 if v2[name] != v3[name]} == {
        "slot.before": 66,
        "slot.items": 66,
    }
