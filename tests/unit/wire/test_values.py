"""Core values and wire records convert both ways without loss, for every record type.

The values are built from their own type declarations (`msgspec.inspect`), so a field added to a
value is generated here without touching this file. Two round trips: value -> plain record ->
value (the boundary in `engine.wire.values`), and value -> framed Avro bytes -> value (the
codec, with its validation), which must also give back the same bytes when encoded again.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from engine.wire import MODEL_OF, Codec, DecodeError, DecodeReason, RecordType
from engine.wire.validation import MAX_SEQUENCE, semantic_violation
from engine.wire.values import from_json, from_record, to_json, to_record

CODEC = Codec()
INVALID_FIELDS = DecodeReason.INVALID_FIELDS
EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
_TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
    min_size=1,
    max_size=8,
)


def strategy_of(info: msgspec.inspect.Type) -> st.SearchStrategy[Any]:
    """Values of the declared type, within what the wire accepts (ranges, string patterns)."""
    if isinstance(info, msgspec.inspect.StructType):
        fields = {field.name: strategy_of(field.type) for field in info.fields}
        return st.builds(info.cls, **fields)
    if isinstance(info, msgspec.inspect.UnionType):
        return st.one_of([strategy_of(branch) for branch in info.types])
    if isinstance(info, msgspec.inspect.ListType):
        return st.lists(strategy_of(info.item_type), min_size=1, max_size=3)
    if isinstance(info, msgspec.inspect.EnumType):
        return st.sampled_from(list(info.cls))
    if isinstance(info, msgspec.inspect.StrType):
        if info.pattern is not None:
            return st.from_regex(info.pattern, fullmatch=True)
        return _TEXT
    if isinstance(info, msgspec.inspect.IntType):
        return st.integers(min_value=0, max_value=MAX_SEQUENCE)
    if isinstance(info, msgspec.inspect.BoolType):
        return st.booleans()
    if isinstance(info, msgspec.inspect.BytesType):
        return st.binary(max_size=8)
    if isinstance(info, msgspec.inspect.NoneType):
        return st.none()
    raise AssertionError(f"no strategy for {info!r}: extend strategy_of")


def values_of(record_type: RecordType) -> st.SearchStrategy[Any]:
    return strategy_of(msgspec.inspect.type_info(MODEL_OF[record_type]))


@pytest.mark.parametrize("record_type", list(RecordType))
@EXAMPLES
@given(data=st.data())
def test_value_to_record_and_back_is_exact(record_type: RecordType, data: st.DataObject) -> None:
    value = data.draw(values_of(record_type))
    record = to_record(value)
    assert from_record(MODEL_OF[record_type], record) == value
    assert from_json(MODEL_OF[record_type], to_json(value)) == value


@pytest.mark.parametrize("record_type", list(RecordType))
@EXAMPLES
@given(data=st.data())
def test_value_to_bytes_and_back_is_exact(record_type: RecordType, data: st.DataObject) -> None:
    value = data.draw(values_of(record_type))
    encoded = CODEC.encode(value)
    problem = semantic_violation(value)
    if problem is not None:
        # Only the range and shape rules may refuse a generated value (an empty batch, a held
        # intent with before digests, ...): never a type, symbol or digest format problem.
        with pytest.raises(DecodeError) as refused:
            CODEC.decode(record_type, encoded)
        assert (refused.value.reason, refused.value.message) == (INVALID_FIELDS, problem)
        reject()
    decoded = CODEC.decode(record_type, encoded)
    assert decoded == value
    assert type(decoded) is type(value)
    assert CODEC.encode(decoded) == encoded
