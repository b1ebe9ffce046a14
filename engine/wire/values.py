"""The boundary between plain records and the engine's values, both ways.

Core values (`engine.core.events`, `engine.core.state`) and the dead letter are `msgspec`
structs that check nothing when built. This is the one place a record from outside (an Avro
record dict, a JSON document) becomes a value, and it validates types, enum symbols, digest
formats and unknown fields on the way in. The reverse direction (`to_record`) only flattens.
"""

from __future__ import annotations

import base64
import json
from typing import Any, TypeVar

import msgspec

V = TypeVar("V", bound=msgspec.Struct)


def from_record(value_type: type[V], record: Any) -> V:
    """The validated value of a plain record (str/int/bool/bytes/None/list/dict); strict: no
    coercion between types, an unknown field or a missing required one is refused.

    Raises `msgspec.ValidationError` naming the first problem and where it is."""
    return msgspec.convert(record, value_type)


def to_record(value: msgspec.Struct) -> dict[str, Any]:
    """Plain dict of ``value``: enums as their symbols, nested values as dicts, bytes kept."""
    record: dict[str, Any] = msgspec.to_builtins(value, builtin_types=(bytes,))
    return record


def to_json_record(value: msgspec.Struct) -> dict[str, Any]:
    """Like `to_record`, but JSON-ready: bytes become URL-safe base64 strings (the format of
    the frozen fixture corpus)."""
    record: dict[str, Any] = _json_ready(to_record(value))
    return record


def from_json(value_type: type[V], text: str | bytes) -> V:
    """The validated value of a JSON document written by `to_json`."""
    return from_record(value_type, _standard_base64(value_type, json.loads(text)))


def to_json(value: msgspec.Struct, *, indent: int | None = None) -> str:
    """JSON text of ``value``; ``indent`` pretty-prints it, for files people read."""
    return json.dumps(to_json_record(value), indent=indent, ensure_ascii=False)


def _json_ready(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.urlsafe_b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {key: _json_ready(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_json_ready(child) for child in value]
    return value


def _standard_base64(value_type: type[msgspec.Struct], document: Any) -> Any:
    # msgspec reads bytes from standard base64 only; bytes fields are top-level (dead letter).
    if not isinstance(document, dict):
        return document
    info = msgspec.inspect.type_info(value_type)
    assert isinstance(info, msgspec.inspect.StructType)
    for field in info.fields:
        text = document.get(field.name)
        if isinstance(text, str) and _holds_bytes(field.type):
            document[field.name] = text.replace("-", "+").replace("_", "/")
    return document


def _holds_bytes(info: msgspec.inspect.Type) -> bool:
    if isinstance(info, msgspec.inspect.UnionType):
        return any(_holds_bytes(branch) for branch in info.types)
    return isinstance(info, msgspec.inspect.BytesType)
