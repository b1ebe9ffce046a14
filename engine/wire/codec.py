"""The strict codec: model -> framed Avro bytes, and bytes -> validated model.

Decoding is a fixed pipeline, and each step has its own reason code:
size cap (OVERSIZE) -> framing (BAD_MAGIC, TRUNCATED, UNKNOWN_SCHEMA) -> record type
(WRONG_RECORD_TYPE) -> Avro body with writer->reader resolution (TRUNCATED, MALFORMED_BODY,
TRAILING_BYTES) -> size limits (LIMIT_EXCEEDED) -> model validation (UNKNOWN_ENUM_SYMBOL,
INVALID_FIELDS) -> ranges and shapes (INVALID_FIELDS). Any failure is a `DecodeError`.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, overload

import msgspec
from fastavro import schemaless_reader, schemaless_writer

from engine.core.events import AckEvent, Decision, IntentEvent, RepairEvent, ResumeEvent
from engine.core.state import SessionState
from engine.wire.avro_gen import Reader, UnsupportedSchemaError, Writer, reader_for, writer_for
from engine.wire.dead_letter import DeadLetter
from engine.wire.errors import DecodeError, DecodeReason, EncodeError, SourcePosition
from engine.wire.framing import Framing, SingleObjectFraming
from engine.wire.limits import DEFAULT_LIMITS, WireLimits
from engine.wire.policy import NAMESPACE, RecordType
from engine.wire.raw_digests import convert, has_raw_digests, hex_to_raw, raw_to_hex
from engine.wire.schema_store import SHIPPED_SCHEMAS, SchemaStore, ShippedSchema
from engine.wire.validation import semantic_violation, size_violation
from engine.wire.values import from_record, to_record

WireModel = (
    IntentEvent | AckEvent | ResumeEvent | RepairEvent | Decision | DeadLetter | SessionState
)
"""Every model that has a record on some topic."""

MODEL_OF: Mapping[RecordType, type[WireModel]] = MappingProxyType(
    {
        RecordType.INTENT: IntentEvent,
        RecordType.ACK: AckEvent,
        RecordType.RESUME: ResumeEvent,
        RecordType.REPAIR: RepairEvent,
        RecordType.DECISION: Decision,
        RecordType.DEAD_LETTER: DeadLetter,
        RecordType.SESSION_STATE: SessionState,
    }
)
RECORD_TYPE_OF: Mapping[type[WireModel], RecordType] = MappingProxyType(
    {model: record_type for record_type, model in MODEL_OF.items()}
)

# The symbol every shipped enum declares as its Avro `default`: what an older reader gets for
# a symbol only a newer writer knows. No model accepts it, so it surfaces as a clear refusal.
UNRECOGNIZED_SYMBOL = "UNRECOGNIZED"
_MAX_MESSAGE = 300


class Codec:
    """Encodes models and decodes bytes for every record type, with one framing.

    Thread-safe for concurrent use (it keeps no per-call state). ``framing`` defaults to
    single-object encoding over the shipped schemas. ``generated=False`` keeps to the
    reference path (fastavro and msgspec validation) that the generated one is tested against.
    """

    def __init__(
        self,
        *,
        framing: Framing | None = None,
        limits: WireLimits = DEFAULT_LIMITS,
        store: SchemaStore = SHIPPED_SCHEMAS,
        generated: bool = True,
    ) -> None:
        self.store = store
        self.generated = generated
        self.framing: Framing = framing if framing is not None else SingleObjectFraming(store)
        self.limits = limits
        self._record_unions: dict[tuple[RecordType, int], tuple[tuple[str, str], ...]] = {}
        # Generated per current schema on first use; None: the generator cannot handle it.
        self._writers: dict[RecordType, Writer | None] = {}
        self._readers: dict[RecordType, Reader | None] = {}
        self._fast_writers: dict[type, tuple[bytes, Writer]] = {}
        self._raw_digests: dict[tuple[RecordType, int], bool] = {}
        # Per record type: the header of the current schema as last seen on the wire, and its
        # generated reader. A record that starts with it needs no framing lookup (`_decode`).
        self._fast_readers: dict[RecordType, tuple[bytes, Reader]] = {}

    def encode(self, model: WireModel, *, version: int | None = None) -> bytes:
        """The framed Avro bytes of ``model``, written with the current schema.

        ``version`` writes an older supported version instead (the fixture generator uses it
        to act as that version's writer). Raises `EncodeError` if the model does not fit.
        """
        if version is None:
            fast = self._fast_writers.get(type(model))
            if fast is not None:
                try:
                    return fast[0] + fast[1](model)
                except Exception:  # the reference path below names the problem
                    pass
        record_type = RECORD_TYPE_OF.get(type(model))
        if record_type is None:
            raise EncodeError(f"{type(model).__name__} has no wire record")
        if version is None:
            schema = self.store.current(record_type)
            write = self._writer(record_type, schema)
            if write is not None:
                # The header of a schema never changes once known (a registry id included).
                self._fast_writers[type(model)] = (self.framing.header_for(schema), write)
            return self.encode_record(schema, to_record(model))
        schema = self.store.get(record_type, version)
        # An older writer knows only its own fields: the newer ones are dropped, as it would.
        return self.encode_record(schema, fields_of(schema, to_record(model)))

    def encode_record(self, schema: ShippedSchema, record: Mapping[str, Any]) -> bytes:
        """Frame and write a plain record dict with ``schema`` (no model involved)."""
        body = io.BytesIO()
        try:
            record = dict(self._to_wire(schema, record))
        except ValueError as exc:
            raise EncodeError(f"cannot write {schema.file_name}: {exc}") from exc
        for field, branch in self._unions_of(schema):
            value = record.get(field)
            if isinstance(value, dict):
                # fastavro's tuple notation names the branch: the same bytes, without fastavro
                # validating the whole nested record to pick it (a third of a state's encode).
                record[field] = (branch, value)
        try:
            schemaless_writer(body, schema.parsed, record, strict=True)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise EncodeError(f"cannot write {schema.file_name}: {exc}") from exc
        return self.framing.header_for(schema) + body.getvalue()

    def _holds_raw_digests(self, schema: ShippedSchema) -> bool:
        key = (schema.record_type, schema.version)
        found = self._raw_digests.get(key)
        if found is None:
            found = self._raw_digests[key] = has_raw_digests(schema.source)
        return found

    def _to_wire(self, schema: ShippedSchema, record: Mapping[str, Any]) -> Mapping[str, Any]:
        """Hex digests as the raw bytes a schema with the fixed Sha256 type stores."""
        if not self._holds_raw_digests(schema):
            return record
        converted: Mapping[str, Any] = convert(schema.source, record, hex_to_raw)
        return converted

    def _from_wire(self, schema: ShippedSchema, record: Any) -> Any:
        """The record as values expect it: raw digests back to hex."""
        if not self._holds_raw_digests(schema):
            return record
        return convert(schema.source, record, raw_to_hex)

    def _unions_of(self, schema: ShippedSchema) -> tuple[tuple[str, str], ...]:
        """The top-level fields of ``schema`` typed ``["null", record]``, with the record's
        full name (computed once per schema)."""
        key = (schema.record_type, schema.version)
        unions = self._record_unions.get(key)
        if unions is None:
            unions = tuple(
                (field["name"], branches[1]["name"])
                for field in schema.parsed["fields"]
                for branches in [field["type"]]
                if isinstance(branches, list)
                and len(branches) == 2
                and branches[0] == "null"
                and isinstance(branches[1], dict)
                and branches[1].get("type") == "record"
            )
            self._record_unions[key] = unions
        return unions

    @overload
    def decode(
        self,
        record_type: Literal[RecordType.INTENT],
        data: bytes,
        *,
        source: SourcePosition | None = None,
    ) -> IntentEvent: ...

    @overload
    def decode(
        self,
        record_type: Literal[RecordType.ACK],
        data: bytes,
        *,
        source: SourcePosition | None = None,
    ) -> AckEvent: ...

    @overload
    def decode(
        self,
        record_type: Literal[RecordType.RESUME],
        data: bytes,
        *,
        source: SourcePosition | None = None,
    ) -> ResumeEvent: ...

    @overload
    def decode(
        self,
        record_type: Literal[RecordType.REPAIR],
        data: bytes,
        *,
        source: SourcePosition | None = None,
    ) -> RepairEvent: ...

    @overload
    def decode(
        self,
        record_type: Literal[RecordType.DECISION],
        data: bytes,
        *,
        source: SourcePosition | None = None,
    ) -> Decision: ...

    @overload
    def decode(
        self,
        record_type: Literal[RecordType.DEAD_LETTER],
        data: bytes,
        *,
        source: SourcePosition | None = None,
    ) -> DeadLetter: ...

    @overload
    def decode(
        self,
        record_type: Literal[RecordType.SESSION_STATE],
        data: bytes,
        *,
        source: SourcePosition | None = None,
    ) -> SessionState: ...

    @overload
    def decode(
        self, record_type: RecordType, data: bytes, *, source: SourcePosition | None = None
    ) -> WireModel: ...

    def decode(
        self,
        record_type: RecordType,
        data: bytes,
        *,
        source: SourcePosition | None = None,
    ) -> WireModel:
        """The validated model carried by ``data``, or `DecodeError` naming the reason.

        ``record_type`` is what the topic carries; a record of another type is refused.
        """
        # The record that passes (almost all) returns here, read straight by the generated
        # reader when it starts with the header seen on the wire before (so `_split` would
        # accept it), with no interpreted call on the way: this runs once per input. Anything
        # else takes `_decode`, which names the problem.
        model: WireModel | None = None
        fast = self._fast_readers.get(record_type)
        if (
            fast is not None
            and type(data) is bytes
            and data.startswith(fast[0])
            and len(data) <= self.limits.max_record_bytes
        ):
            model = fast[1](data, len(fast[0]))
            if model is not None and semantic_violation(model) is None:
                return model
        try:
            return self._decode(record_type, data, model)
        except DecodeError as error:
            raise DecodeError(
                error.reason, error.message, source=source, record_type=record_type.value
            ) from error

    def decode_record(self, record_type: RecordType, data: bytes) -> dict[str, Any]:
        """The Avro record dict (resolved to the current schema), before model validation."""
        writer, body = self._split(record_type, data)
        reader = self.store.reader_of(writer)
        record: dict[str, Any] = self._from_wire(reader, self._read_body(writer, reader, body))
        return record

    def _writer(self, record_type: RecordType, schema: ShippedSchema) -> Writer | None:
        if not self.generated:
            return None
        if record_type not in self._writers:
            try:
                self._writers[record_type] = writer_for(schema.parsed, MODEL_OF[record_type])
            except UnsupportedSchemaError:
                self._writers[record_type] = None
        return self._writers[record_type]

    def _reader(self, record_type: RecordType, schema: ShippedSchema) -> Reader | None:
        if not self.generated:
            return None
        if record_type not in self._readers:
            try:
                model_type = MODEL_OF[record_type]
                self._readers[record_type] = reader_for(schema.parsed, model_type, self.limits)
            except UnsupportedSchemaError:
                self._readers[record_type] = None
        return self._readers[record_type]

    def _decode(self, record_type: RecordType, data: bytes, model: WireModel | None) -> WireModel:
        """``model``: what the generated reader gave for these bytes in `decode` (None: it
        declined them, or it was not tried)."""
        if model is None:
            model = self._decode_split(record_type, data)
        problem = semantic_violation(model)
        if problem is not None:
            raise DecodeError(DecodeReason.INVALID_FIELDS, problem)
        return model

    def _decode_split(self, record_type: RecordType, data: bytes) -> WireModel:
        writer, body = self._split(record_type, data)
        current = self.store.current(record_type)
        read = self._reader(record_type, current) if writer is current else None
        model: WireModel | None = None if read is None else read(bytes(body))
        if read is not None and model is not None and type(data) is bytes:
            self._fast_readers[record_type] = (data[: len(data) - len(body)], read)
        if model is None:
            model = self._decode_reference(record_type, writer, body)
        return model

    def _decode_reference(
        self,
        record_type: RecordType,
        writer: ShippedSchema,
        body: memoryview,
    ) -> WireModel:
        """fastavro, then size limits, then msgspec validation: the path that names problems."""
        reader = self.store.reader_of(writer)
        record = self._from_wire(reader, self._read_body(writer, reader, body))
        too_big = size_violation(record, self.limits)
        if too_big is not None:
            raise DecodeError(DecodeReason.LIMIT_EXCEEDED, too_big)
        model_type = MODEL_OF[record_type]
        try:
            return from_record(model_type, record)
        except msgspec.ValidationError as exc:
            raise _validation_error(exc, model_type, record) from exc

    def _split(self, record_type: RecordType, data: bytes) -> tuple[ShippedSchema, memoryview]:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise DecodeError(DecodeReason.MALFORMED_BODY, f"expected bytes, got {type(data)}")
        data = bytes(data)
        if not data:
            raise DecodeError(DecodeReason.EMPTY, "the record value is empty (a tombstone?)")
        if len(data) > self.limits.max_record_bytes:
            raise DecodeError(
                DecodeReason.OVERSIZE,
                f"{len(data)} bytes exceeds the limit of {self.limits.max_record_bytes}",
            )
        writer, body = self.framing.split(data)
        if writer.record_type is not record_type:
            raise DecodeError(
                DecodeReason.WRONG_RECORD_TYPE,
                f"expected a {record_type} record, got {writer.file_name}",
            )
        return writer, body

    @staticmethod
    def _read_body(writer: ShippedSchema, reader: ShippedSchema, body: memoryview) -> Any:
        # The body is at most max_record_bytes, and every array item in the shipped schemas
        # takes at least one byte, so a forged length cannot make the reader allocate more than
        # a small multiple of the record size: fastavro fails on the short read instead.
        stream = io.BytesIO(body)
        try:
            record = schemaless_reader(
                stream, writer.parsed, None if writer is reader else reader.parsed
            )
        except EOFError as exc:
            raise DecodeError(DecodeReason.TRUNCATED, f"body ends early ({_plain(exc)})") from exc
        except Exception as exc:  # fastavro raises many types for bad bytes; all mean the same
            raise DecodeError(
                DecodeReason.MALFORMED_BODY,
                f"not a valid {writer.file_name} body: {type(exc).__name__}({_plain(exc)!r})"[:300],
            ) from exc
        left = len(body) - stream.tell()
        if left:
            raise DecodeError(
                DecodeReason.TRAILING_BYTES, f"{left} bytes after the end of the record"
            )
        return record


def _validation_error(
    exc: msgspec.ValidationError, model_type: type[WireModel], record: Any
) -> DecodeError:
    # A symbol only a newer writer knows reaches us as the schemas' default, UNRECOGNIZED; it
    # gets its own reason wherever it sits, even when another field is wrong too.
    where = _unrecognized_symbol(msgspec.inspect.type_info(model_type), record, "")
    if where is not None:
        return DecodeError(
            DecodeReason.UNKNOWN_ENUM_SYMBOL,
            f"{where} holds a symbol this engine does not know (written by a newer schema?)",
        )
    return DecodeError(DecodeReason.INVALID_FIELDS, str(exc)[:_MAX_MESSAGE])


def _unrecognized_symbol(info: msgspec.inspect.Type, value: Any, where: str) -> str | None:
    """The path of the first enum-typed position of ``value`` holding UNRECOGNIZED, or None."""
    if isinstance(info, msgspec.inspect.EnumType):
        return where.lstrip(".") if value == UNRECOGNIZED_SYMBOL else None
    if isinstance(info, msgspec.inspect.StructType) and isinstance(value, dict):
        for field in info.fields:
            if field.name in value:
                found = _unrecognized_symbol(field.type, value[field.name], f"{where}.{field.name}")
                if found is not None:
                    return found
    elif isinstance(info, msgspec.inspect.ListType) and isinstance(value, list):
        for index, item in enumerate(value):
            found = _unrecognized_symbol(info.item_type, item, f"{where}.{index}")
            if found is not None:
                return found
    elif isinstance(info, msgspec.inspect.UnionType):
        for branch in info.types:
            found = _unrecognized_symbol(branch, value, where)
            if found is not None:
                return found
    return None


def fields_of(schema: ShippedSchema, record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` restricted, recursively, to the fields ``schema`` declares."""
    named: dict[str, Any] = {}

    def collect(avro: Any) -> None:
        if isinstance(avro, list):
            for branch in avro:
                collect(branch)
        elif isinstance(avro, dict):
            if "name" in avro and avro.get("type") in ("record", "enum"):
                named[avro["name"]] = avro
                named[f"{avro.get('namespace', NAMESPACE)}.{avro['name']}"] = avro
            for field in avro.get("fields", []):
                collect(field["type"])
            collect(avro.get("items"))

    def prune(avro: Any, value: Any) -> Any:
        if isinstance(avro, str):
            avro = named.get(avro, avro)
        if isinstance(avro, list):
            branches = [named.get(b, b) if isinstance(b, str) else b for b in avro]
            records = [b for b in branches if isinstance(b, dict) and b.get("type") == "record"]
            return prune(records[0], value) if records and isinstance(value, dict) else value
        if not isinstance(avro, dict):
            return value
        if avro.get("type") == "array" and isinstance(value, list):
            return [prune(avro["items"], item) for item in value]
        if avro.get("type") == "record" and isinstance(value, dict):
            return {f["name"]: prune(f["type"], value[f["name"]]) for f in avro["fields"]}
        return value

    collect(schema.source)
    return dict(prune(dict(schema.source), dict(record)))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _plain(error: Exception) -> str:
    """The reader's message without object addresses (fastavro names its stream with one), so
    the same bad bytes always give the same dead letter."""
    return _ADDRESS.sub("", str(error))
