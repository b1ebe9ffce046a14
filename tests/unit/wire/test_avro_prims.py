"""The Avro primitives' fast paths against their plain forms, twice: as this process runs them
(the mypyc extension after `make setup`; the source under PURE=1) and from their source
(`load_pure`), so CI, which runs the compiled build, tests both."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import compiled
from engine.wire import avro_prims

# Where the packed path ends and the plain one takes over, and the ends of a long.
EDGES = [0, 63, 64, -64, -65, 127, 128, 1 << 59, (1 << 60) - 1, 1 << 60, -(1 << 60), -(1 << 60) - 1]
EDGES += [(1 << 63) - 1, -(1 << 63), 1_767_225_600_000, -1_767_225_600_000]

PURE = compiled.load_pure("engine.wire.avro_prims")["engine.wire.avro_prims"]


@pytest.fixture(scope="module", params=["as-run", "pure"])
def prims(request: pytest.FixtureRequest) -> ModuleType:
    # Module-scoped: hypothesis refuses function-scoped fixtures under @given.
    return avro_prims if request.param == "as-run" else PURE


def test_the_pure_copy_is_the_source_and_the_run_one_is_the_build() -> None:
    assert Path(PURE.__file__ or "").suffix == ".py"
    assert PURE is not avro_prims
    suffix = Path(avro_prims.__file__ or "").suffix
    assert suffix == (".so" if compiled.mode() == "compiled" else ".py")


@pytest.mark.parametrize("n", EDGES)
def test_write_long_is_zigzag_at_the_edges(prims: ModuleType, n: int) -> None:
    assert prims.write_long(n) == prims.zigzag(n)


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_write_long_is_zigzag(prims: ModuleType, n: int) -> None:
    assert prims.write_long(n) == prims.zigzag(n)


@pytest.mark.parametrize("n", [1 << 63, -(1 << 63) - 1])
def test_write_long_refuses_what_a_long_cannot_hold(prims: ModuleType, n: int) -> None:
    with pytest.raises(OverflowError):
        prims.write_long(n)


def _digest(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def test_hex_to_raw_gives_the_same_bytes_converted_or_remembered(prims: ModuleType) -> None:
    text = _digest(1)
    assert prims.hex_to_raw(text) == prims.hex_to_raw(text) == bytes.fromhex(text)


@pytest.mark.parametrize("bad", ["AB" * 32, "ab " * 21 + "a", "ab" * 31, "ab" * 33, "zz" * 32])
def test_hex_to_raw_refuses_what_is_not_a_lowercase_digest(prims: ModuleType, bad: str) -> None:
    prims.hex_to_raw("ab" * 32)  # the lowercase twin of the first, remembered
    with pytest.raises(ValueError, match="hex"):
        prims.hex_to_raw(bad)


def test_hex_to_raw_memory_stays_bounded(prims: ModuleType) -> None:
    for i in range(prims._RAW_ENTRIES + 10):
        assert prims.hex_to_raw(_digest(i)) == bytes.fromhex(_digest(i))
    assert len(prims._RAW) <= prims._RAW_ENTRIES
