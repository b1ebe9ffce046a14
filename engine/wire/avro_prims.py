"""The Avro primitives the generated readers and writers call (`engine.wire.avro_gen`).

Typed for mypyc: `make setup` compiles this module together with the generated code, so the
calls between them are native.
"""

from __future__ import annotations

from typing import Final


class DeclineError(Exception):
    """Raised inside a generated reader: let the reference decoder look at these bytes."""


def zigzag(n: int) -> bytes:
    """The Avro (zigzag varint) bytes of the long ``n``; `OverflowError` beyond 64 bits."""
    if not -(1 << 63) <= n < (1 << 63):
        raise OverflowError(f"{n} does not fit an Avro long")
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


SMALL: Final[tuple[bytes, ...]] = tuple(zigzag(n) for n in range(-64, 64))
"""The one-byte encodings of -64..63, indexed by n + 64."""

ONE: Final[tuple[int, ...]] = tuple(
    byte >> 1 if byte < 0x80 and not byte & 1 else -1 for byte in range(256)
)
"""The value of a one-byte long from 0 to 63 by its byte; -1 for anything else."""

BOOL: Final[tuple[bool, bool]] = (False, True)

HEX_KEEP: Final = bytes(c if c in b"0123456789abcdef" else c ^ 0x80 for c in range(256))
"""A translation table that keeps the lowercase hex digits (what `DIGEST_PATTERN` allows) and
changes every other byte: bytes are such digits alone iff translating leaves them equal."""


_NATIVE: Final = 1 << 60
"""Below this magnitude the zigzag value and its varint stay small ints under mypyc (no
bignum arithmetic): event times, offsets and fence tokens all fall here."""


def write_long(n: int) -> bytes:
    """Like `zigzag`, from a table for the common one-byte values.

    Up to `_NATIVE` the varint's bytes are packed into one int and written with a single
    ``to_bytes``: a bytearray grown byte by byte costs four times as much compiled (each
    ``append`` is a method call, and `zigzag`'s 64-bit bounds are bignum compares).
    """
    if -64 <= n < 64:
        return SMALL[n + 64]
    if -_NATIVE <= n < _NATIVE:
        z = n << 1 if n >= 0 else ((-n) << 1) - 1
        packed = 0
        shift = 0
        while z > 0x7F:
            packed |= ((z & 0x7F) | 0x80) << shift
            z >>= 7
            shift += 8
        packed |= z << shift
        return packed.to_bytes((shift >> 3) + 1, "little")
    return zigzag(n)


def write_int(n: int) -> bytes:
    """An Avro int: a long that must fit 32 bits."""
    if not -(1 << 31) <= n < (1 << 31):
        raise OverflowError(f"{n} does not fit an Avro int")
    return write_long(n)


def read_long(b: bytes, p: int) -> tuple[int, int]:
    """The long at ``b[p:]`` and the position after it; `DeclineError` past 64 bits."""
    c = b[p]
    if c < 0x80:
        return (c >> 1) ^ -(c & 1), p + 1
    p += 1
    n = c & 0x7F
    shift = 7
    while c & 0x80:
        if shift > 63:
            raise DeclineError
        c = b[p]
        p += 1
        n |= (c & 0x7F) << shift
        shift += 7
    if n >> 64:
        raise DeclineError  # wider than a long: let the reference decoder say what it is
    return (n >> 1) ^ -(n & 1), p


_RAW: Final[dict[str, bytes]] = {}
_RAW_ENTRIES: Final = 4096
"""Digests converted lately. A session's state is written again after each of its inputs and
carries the same digests each time, so most conversions repeat one already checked; a str
caches its hash, which makes the lookup a fraction of ``fromhex`` + ``hex`` + compare. Emptied
when full (at most about 1 MB): a bound, not a policy."""


def hex_to_raw(text: str) -> bytes:
    """The 32 raw bytes of a lowercase hex SHA-256 digest (session_state v3 stores item digests
    raw, `engine.wire.raw_digests`); refuses upper case and spaces, which `bytes.fromhex` takes."""
    raw = _RAW.get(text)
    if raw is not None:
        return raw
    raw = bytes.fromhex(text)
    if len(raw) != 32 or raw.hex() != text:
        raise ValueError("expected 64 lowercase hex characters")
    if len(_RAW) >= _RAW_ENTRIES:
        _RAW.clear()
    _RAW[text] = raw
    return raw
