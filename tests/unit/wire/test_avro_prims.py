"""The Avro primitives' fast paths against their plain forms (run compiled and pure)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.wire import avro_prims
from engine.wire.avro_prims import hex_to_raw, write_long, zigzag

# Where the packed path ends and the plain one takes over, and the ends of a long.
EDGES = [0, 63, 64, -64, -65, 127, 128, 1 << 59, (1 << 60) - 1, 1 << 60, -(1 << 60), -(1 << 60) - 1]
EDGES += [(1 << 63) - 1, -(1 << 63), 1_767_225_600_000, -1_767_225_600_000]


@pytest.mark.parametrize("n", EDGES)
def test_write_long_is_zigzag_at_the_edges(n: int) -> None:
    assert write_long(n) == zigzag(n)


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_write_long_is_zigzag(n: int) -> None:
    assert write_long(n) == zigzag(n)


@pytest.mark.parametrize("n", [1 << 63, -(1 << 63) - 1])
def test_write_long_refuses_what_a_long_cannot_hold(n: int) -> None:
    with pytest.raises(OverflowError):
        write_long(n)


def _digest(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def test_hex_to_raw_gives_the_same_bytes_converted_or_remembered() -> None:
    text = _digest(1)
    assert hex_to_raw(text) == hex_to_raw(text) == bytes.fromhex(text)


@pytest.mark.parametrize("bad", ["AB" * 32, "ab " * 21 + "a", "ab" * 31, "ab" * 33, "zz" * 32])
def test_hex_to_raw_refuses_what_is_not_a_lowercase_digest(bad: str) -> None:
    hex_to_raw("ab" * 32)  # the lowercase twin of the first, remembered
    with pytest.raises(ValueError, match="hex"):
        hex_to_raw(bad)


def test_hex_to_raw_memory_stays_bounded() -> None:
    for i in range(avro_prims._RAW_ENTRIES + 10):
        assert hex_to_raw(_digest(i)) == bytes.fromhex(_digest(i))
    assert len(avro_prims._RAW) <= avro_prims._RAW_ENTRIES
