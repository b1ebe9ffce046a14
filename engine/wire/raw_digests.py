"""Item digests as 32 raw bytes on the wire, as 64 hex characters in values: both ways.

Values keep the hex form the SDK's digests have (the fold compares them with what runners
send), while a schema may store them raw (session_state v3: 33 bytes a digest instead of 65).
Such a schema says so once, at its top level: ``"digest_bytes": "sha256"`` means every Avro
``bytes`` inside it is one raw SHA-256 digest. Why not a ``fixed`` type, a logical type or a
property on each ``bytes``: Apache Avro's Python library computes a fingerprint that differs
from every other implementation's for a fixed type named twice and for any primitive written as
an object, and the single-object header carries that fingerprint. A record's own attributes are
left out of the fingerprint by all of them.

This is the reference path's conversion of plain records, driven by the schema; the generated
codec (`engine.wire.avro_gen`) does the same inline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.core.events import is_digest
from engine.wire.policy import NAMESPACE

DIGEST_BYTES = ("digest_bytes", "sha256")
"""The top-level property of a schema whose ``bytes`` values are raw SHA-256 digests."""


def has_raw_digests(schema: Mapping[str, Any]) -> bool:
    """Whether the schema (JSON or parsed form) stores its digests as raw bytes."""
    key, value = DIGEST_BYTES
    return bool(schema.get(key) == value)


def hex_to_raw(text: Any) -> bytes:
    """The 32 bytes of a hex digest; anything else is refused with `ValueError`."""
    if not isinstance(text, str) or not is_digest(text):
        raise ValueError(f"expected a digest of 64 lowercase hex characters, got {text!r:.80}")
    return bytes.fromhex(text)


def raw_to_hex(raw: Any) -> Any:
    """The hex form of raw digest bytes (a wrong length then fails the value's pattern)."""
    return raw.hex() if isinstance(raw, bytes | bytearray) else raw


def convert(schema: Mapping[str, Any], record: Any, leaf: Callable[[Any], Any]) -> Any:
    """``record`` with ``leaf`` applied to every value the schema types as ``bytes``."""
    named = _named_records(schema)

    def walk(avro: Any, value: Any) -> Any:
        if isinstance(avro, str):
            if avro == "bytes":
                return leaf(value)
            avro = named.get(avro, avro)
        if isinstance(avro, list):
            branches = [b for b in avro if b != "null"]
            return value if value is None or len(branches) != 1 else walk(branches[0], value)
        if not isinstance(avro, dict):
            return value
        kind = avro.get("type")
        if kind == "bytes":
            return leaf(value)
        if kind == "array" and isinstance(value, list):
            return [walk(avro["items"], item) for item in value]
        if kind == "record" and isinstance(value, dict):
            converted = dict(value)
            for field in avro["fields"]:
                if field["name"] in converted:
                    converted[field["name"]] = walk(field["type"], converted[field["name"]])
            return converted
        return value

    return walk(dict(schema), record)


def _named_records(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Every record a schema defines, by full and short name (a later use names it only)."""
    named: dict[str, Any] = {}

    def visit(avro: Any) -> None:
        if isinstance(avro, list):
            for branch in avro:
                visit(branch)
        elif isinstance(avro, dict):
            if avro.get("type") == "record":
                name = str(avro["name"])
                full = name if "." in name else f"{avro.get('namespace', NAMESPACE)}.{name}"
                named[full] = named[name.rsplit(".")[-1]] = avro
            for field in avro.get("fields", []):
                visit(field["type"])
            visit(avro.get("items"))

    visit(dict(schema))
    return named
