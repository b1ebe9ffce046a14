"""What the bench client reads of a decision: only the leading fields that say which input it
answers and whether that answer is final, not the whole record (the trail is most of it).

A full decode cost the bench client about 20 us per input on the cores the system under test
needs; this walks the few varints and strings before `final` and stops. The plan of that walk is
built from each shipped decision schema, so a new version with another prefix is read right or
refused at start, never misread.
"""

from __future__ import annotations

from typing import Any

from engine.core.events import Reason
from engine.wire import RecordType
from engine.wire.framing import SINGLE_OBJECT_HEADER_SIZE, SINGLE_OBJECT_MAGIC
from engine.wire.schema_store import ShippedSchema, load_shipped_schemas

# How each leading field is read: a varint (int, long, enum, union index), a length-prefixed
# string, a one-byte boolean, or nothing (a union's null branch).
VARINT, STRING, BOOLEAN, NULL = "varint", "string", "boolean", "null"
WANTED = ("in_reply_to", "reason", "final")


class UnsupportedDecisionSchemaError(Exception):
    """A shipped decision schema has a field before `final` this reader cannot skip: extend
    tools/answer_reader.py, or count with the full decode (Codec.decode_record)."""


def _kind(avro_type: Any) -> str:
    name = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
    kinds = {"int": VARINT, "long": VARINT, "enum": VARINT, "string": STRING}
    kinds.update({"boolean": BOOLEAN, "null": NULL})
    if name not in kinds:
        raise UnsupportedDecisionSchemaError(f"cannot skip a field of type {name!r}")
    return kinds[name]


Field = tuple[str, str, tuple[str, ...]]  # name, kind ("union" or a kind), union branch kinds


def _plan(schema: ShippedSchema) -> tuple[list[Field], int]:
    """The fields up to `final` and the index of PARKED in this version's Reason enum."""
    plan: list[Field] = []
    parked = -1
    for field in schema.source["fields"]:
        avro_type = field["type"]
        if isinstance(avro_type, list):
            plan.append((field["name"], "union", tuple(_kind(t) for t in avro_type)))
        else:
            plan.append((field["name"], _kind(avro_type), ()))
        if field["name"] == "reason":
            parked = list(avro_type["symbols"]).index(Reason.PARKED.value)
        if field["name"] == "final":
            if parked < 0:
                # Without the reason the walk cannot tell a PARKED answer from a final one:
                # every answer would read as not final, and a bench would wait forever.
                raise UnsupportedDecisionSchemaError(
                    f"{schema.file_name} puts `final` before `reason`: extend"
                    " tools/answer_reader.py to read on past `final`, or count with the full"
                    " decode (Codec.decode_record)"
                )
            return plan, parked
    raise UnsupportedDecisionSchemaError(f"{schema.file_name} has no field `final`")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = raw = 0
    while True:
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


class AnswerReader:
    """`final_answer(value)`: the id of the input a decision finally answers, or None when it
    is not final or only PARKED (a deferred answer; the final one follows)."""

    def __init__(self) -> None:
        store = load_shipped_schemas()
        self._plans: dict[bytes, tuple[list[Field], int]] = {
            fingerprint: _plan(schema)
            for fingerprint, schema in store.by_fingerprint.items()
            if schema.record_type == RecordType.DECISION
        }

    def final_answer(self, value: bytes) -> str | None:
        if value[:2] != SINGLE_OBJECT_MAGIC:
            raise ValueError("not a single-object encoded decision (a registry framing?)")
        plan, parked = self._plans[value[2:SINGLE_OBJECT_HEADER_SIZE]]
        pos = SINGLE_OBJECT_HEADER_SIZE
        in_reply_to, reason = "", -1
        for name, kind, branches in plan:
            if kind == "union":
                branch, pos = _varint(value, pos)
                kind = branches[branch]
            if kind == VARINT:
                number, pos = _varint(value, pos)
                if name == "reason":
                    reason = number
            elif kind == STRING:
                size, pos = _varint(value, pos)
                if name == "in_reply_to":
                    in_reply_to = value[pos : pos + size].decode()
                pos += size
            elif kind == BOOLEAN:
                if name == "final":
                    return in_reply_to if value[pos] and reason != parked else None
                pos += 1
        return None
