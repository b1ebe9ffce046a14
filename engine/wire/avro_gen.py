"""Avro readers and writers generated per schema, for the hot path: value <-> body bytes.

fastavro interprets a schema on every call; for records of a few hundred bytes that costs more
than the bytes themselves. Here each current schema becomes straight-line Python (nested records
written out inline) that writes a value's fields, or reads them and builds the value directly,
checking on the way what decoding must check: enum symbols, digest formats, string and list
limits, truncation and trailing bytes.

The fastavro path in `engine.wire.codec` stays the reference. A generated reader never reports
an error itself: on anything unusual (a bad byte, a limit, a symbol it does not know) it
declines with None, and the codec decodes the same bytes the reference way, which names the
problem exactly as before. The tests hold both paths to the same bytes and the same values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from engine.wire.limits import WireLimits

Writer = Callable[[Any], bytes]
Reader = Callable[[bytes], Any]


class _DeclineError(Exception):
    """Raised inside a generated reader: let the reference decoder look at these bytes."""


class UnsupportedSchemaError(Exception):
    """The schema or value type uses something the generator does not handle."""


def _zigzag(n: int) -> bytes:
    if not -(1 << 63) <= n < (1 << 63):
        raise OverflowError(f"{n} does not fit an Avro long")
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = tuple(_zigzag(n) for n in range(-64, 64))


def _long(n: int) -> bytes:
    if -64 <= n < 64:
        return _SMALL[n + 64]
    return _zigzag(n)


def _int(n: int) -> bytes:
    if not -(1 << 31) <= n < (1 << 31):
        raise OverflowError(f"{n} does not fit an Avro int")
    return _long(n)


def _read_long(b: bytes, p: int) -> tuple[int, int]:
    c = b[p]
    if c < 0x80:
        return (c >> 1) ^ -(c & 1), p + 1
    p += 1
    n = c & 0x7F
    shift = 7
    while c & 0x80:
        if shift > 63:
            raise _DeclineError
        c = b[p]
        p += 1
        n |= (c & 0x7F) << shift
        shift += 7
    if n >> 64:
        raise _DeclineError  # wider than a long: let the reference decoder say what it is
    return (n >> 1) ^ -(n & 1), p


def _hex_to_raw(text: str) -> bytes:
    # In a schema marked "digest_bytes": "sha256", bytes under a str field hold a hex digest's
    # 32 raw bytes (session_state v3, `engine.wire.raw_digests`); the round trip refuses upper
    # case and spaces, which `bytes.fromhex` would accept.
    raw = bytes.fromhex(text)
    if len(raw) != 32 or raw.hex() != text:
        raise ValueError("expected 64 lowercase hex characters")
    return raw


_RAW_DIGEST_LENGTH = b"\x40"  # 32 as an Avro long


_COMMON: dict[str, Any] = {
    "_hexraw": _hex_to_raw,
    "_long": _long,
    "_SMALL": _SMALL,
    "_int": _int,
    "_rl": _read_long,
    "_DeclineError": _DeclineError,
    "_BOOL": (False, True),
    "_ONE": tuple(byte >> 1 if byte < 0x80 and not byte & 1 else -1 for byte in range(256)),
}


class _Gen:
    """Source text for one top-level schema: one function, nested records written out inline
    (the shipped schemas are not recursive)."""

    def __init__(self, limits: WireLimits | None, schema: Mapping[str, Any]) -> None:
        self.limits = limits
        self.raw_digests = schema.get("digest_bytes") == "sha256"
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = dict(_COMMON)
        self.records: dict[str, str] = {}  # Avro full name of the top record -> function name
        self.named: dict[str, Any] = {}  # Avro full name -> definition
        self.counter = 0

    def const(self, prefix: str, value: Any) -> str:
        self.counter += 1
        name = f"_{prefix}{self.counter}"
        self.namespace[name] = value
        return name

    def temp(self) -> str:
        self.counter += 1
        return f"t{self.counter}"

    def resolve(self, avro: Any) -> Any:
        if isinstance(avro, str) and avro in self.named:
            return self.named[avro]
        if isinstance(avro, dict) and avro.get("type") in ("record", "enum"):
            self.named.setdefault(avro["name"], avro)
        return avro

    def raw_digest(self, avro: Any, info: Any) -> bool:
        if not self.raw_digests or _kind(avro) != "bytes":
            return False
        if not isinstance(info, msgspec.inspect.StrType):
            raise UnsupportedSchemaError(f"raw digest bytes for a value of {info!r}")
        return True

    def record_fields(self, avro: Mapping[str, Any], info: Any) -> list[tuple[str, Any, Any]]:
        if not isinstance(info, msgspec.inspect.StructType):
            raise UnsupportedSchemaError(f"{avro['name']} is not a struct")
        fields = {field.name: field.type for field in info.fields}
        names = [field["name"] for field in avro["fields"]]
        if names != list(fields):
            raise UnsupportedSchemaError(f"{avro['name']} fields differ from {info.cls.__name__}")
        return [(f["name"], f["type"], fields[f["name"]]) for f in avro["fields"]]


class _WriterGen(_Gen):
    def function(self, avro: Mapping[str, Any], info: Any) -> str:
        name = avro["name"]
        self.named.setdefault(name, avro)
        if name in self.records:
            return self.records[name]
        fn = self.records[name] = f"_w{len(self.records)}"
        body: list[str] = []
        for field, field_avro, field_info in self.record_fields(avro, info):
            self.write(field_avro, field_info, f"v.{field}", body, "    ")
        self.lines += [f"def {fn}(v, o):", *(body or ["    pass"]), ""]
        return fn

    def write(self, avro: Any, info: Any, expr: str, out: list[str], ind: str) -> None:
        _not_too_deep(ind)
        avro = self.resolve(avro)
        kind = _kind(avro)
        if self.raw_digest(avro, info):
            out.append(f"{ind}o += {_RAW_DIGEST_LENGTH!r} + _hexraw({expr})")
        elif kind == "string":
            t = self.temp()
            out.append(f"{ind}{t} = {expr}.encode()")
            _write_length(t, out, ind)
        elif kind == "bytes":
            t = self.temp()
            out.append(f"{ind}{t} = {expr}")
            _write_length(t, out, ind)
        elif kind == "long":
            t = self.temp()
            out.append(f"{ind}{t} = {expr}")
            out.append(f"{ind}o += _SMALL[{t} + 64] if -64 <= {t} < 64 else _long({t})")
        elif kind == "int":
            out.append(f"{ind}o += _int({expr})")
        elif kind == "boolean":
            out.append(f"{ind}o += b'\\x01' if {expr} else b'\\x00'")
        elif kind == "enum":
            table = self.const("E", {s: _long(i) for i, s in enumerate(avro["symbols"])})
            out.append(f"{ind}o += {table}[{expr}]")
        elif kind == "array":
            t, x = self.temp(), self.temp()
            out += [f"{ind}{t} = {expr}", f"{ind}if {t}:", f"{ind}    o += _long(len({t}))"]
            out.append(f"{ind}    for {x} in {t}:")
            self.write(avro["items"], _list_item(info), x, out, ind + "        ")
            out.append(f"{ind}o += b'\\x00'")
        elif kind == "record":  # inline: a call per nested record costs more than its fields
            self.named.setdefault(avro["name"], avro)
            t = self.temp()
            out.append(f"{ind}{t} = {expr}")
            for field, field_avro, field_info in self.record_fields(avro, info):
                self.write(field_avro, field_info, f"{t}.{field}", out, ind)
        elif isinstance(avro, list) and len(avro) == 2 and "null" in avro:
            other = 1 - avro.index("null")
            t = self.temp()
            out += [f"{ind}{t} = {expr}", f"{ind}if {t} is None:"]
            out += [f"{ind}    o += {_long(1 - other)!r}", f"{ind}else:"]
            out.append(f"{ind}    o += {_long(other)!r}")
            self.write(avro[other], _non_null(info), t, out, ind + "    ")
        else:
            raise UnsupportedSchemaError(f"Avro type {avro!r}")


class _ReaderGen(_Gen):
    def function(self, avro: Mapping[str, Any], info: Any) -> str:
        name = avro["name"]
        self.named.setdefault(name, avro)
        if name in self.records:
            return self.records[name]
        fn = self.records[name] = f"_r{len(self.records)}"
        body: list[str] = []
        args = []
        for field, field_avro, field_info in self.record_fields(avro, info):
            target = self.temp()
            self.read(field_avro, field_info, target, field, body, "    ")
            args.append(f"{field}={target}")
        cls = self.const("C", info.cls)
        body.append(f"    return {cls}({', '.join(args)}), p")
        self.lines += [f"def {fn}(b, p):", "    lb = len(b)", *body, ""]
        return fn

    def read(self, avro: Any, info: Any, target: str, field: str, out: list[str], ind: str) -> None:
        _not_too_deep(ind)
        avro = self.resolve(avro)
        kind = _kind(avro)
        assert self.limits is not None
        if self.raw_digest(avro, info):  # anything but length 32 is the reference's to refuse
            out.append(f"{ind}if b[p] != 0x40 or p + 33 > lb: raise _DeclineError")
            out += [f"{ind}{target} = b[p + 1:p + 33].hex()", f"{ind}p += 33"]
        elif kind in ("string", "bytes"):
            n, end = self.temp(), self.temp()
            _inline_long(n, out, ind)
            out.append(f"{ind}{end} = p + {n}")
            out.append(f"{ind}if {n} < 0 or {end} > lb: raise _DeclineError")
            if kind == "bytes":
                out.append(f"{ind}{target} = b[p:{end}]")
            else:
                limit = self.limits.max_string_length
                out.append(f"{ind}{target} = b[p:{end}].decode()")
                out.append(
                    f"{ind}if {n} > {limit} and len({target}) > {limit}: raise _DeclineError"
                )
                pattern = getattr(info, "pattern", None)
                if pattern is not None:
                    check = self.const("P", re.compile(pattern).match)
                    out.append(f"{ind}if {check}({target}) is None: raise _DeclineError")
            out.append(f"{ind}p = {end}")
        elif kind in ("long", "int"):
            _inline_long(target, out, ind)
        elif kind == "boolean":
            out += [f"{ind}{target} = _BOOL[b[p]]", f"{ind}p += 1"]
        elif kind == "enum":
            if len(avro["symbols"]) > 64 or not isinstance(info, msgspec.inspect.EnumType):
                raise UnsupportedSchemaError(f"enum {avro['name']}")
            known = {member.value: member for member in info.cls}
            by_byte: list[Any] = [None] * 128
            for index, symbol in enumerate(avro["symbols"]):
                # UNRECOGNIZED stays None (declined), and so does a symbol over the string limit.
                if len(symbol) <= self.limits.max_string_length:
                    by_byte[index << 1] = known.get(symbol)
            table = self.const("E", tuple(by_byte))
            out += [f"{ind}{target} = {table}[b[p]]", f"{ind}p += 1"]
            out.append(f"{ind}if {target} is None: raise _DeclineError")
        elif kind == "array":
            n, x = self.temp(), self.temp()
            bound = self._list_bound(field)
            out += [f"{ind}{target} = []", f"{ind}while True:"]
            _inline_long(n, out, ind + "    ")
            out += [f"{ind}    if {n} == 0: break", f"{ind}    if {n} < 0: raise _DeclineError"]
            # Every item takes at least one byte: a count beyond the bytes left is forged.
            out.append(f"{ind}    if {n} > lb - p: raise _DeclineError")
            out.append(f"{ind}    for _ in range({n}):")
            self.read(avro["items"], _list_item(info), x, field, out, ind + "        ")
            out.append(f"{ind}        {target}.append({x})")
            if bound is not None:
                out.append(f"{ind}    if len({target}) > {bound}: raise _DeclineError")
        elif kind == "record":  # inline, as in the writer
            self.named.setdefault(avro["name"], avro)
            args = []
            for name, field_avro, field_info in self.record_fields(avro, info):
                value = self.temp()
                self.read(field_avro, field_info, value, name, out, ind)
                args.append(f"{name}={value}")
            out.append(f"{ind}{target} = {self.const('C', info.cls)}({', '.join(args)})")
        elif isinstance(avro, list) and len(avro) == 2 and "null" in avro:
            other = 1 - avro.index("null")
            branch = self.temp()
            out += [f"{ind}{branch} = b[p]", f"{ind}p += 1"]
            out += [f"{ind}if {branch} == {(1 - other) << 1}:", f"{ind}    {target} = None"]
            out.append(f"{ind}elif {branch} == {other << 1}:")
            self.read(avro[other], _non_null(info), target, field, out, ind + "    ")
            out.append(f"{ind}else: raise _DeclineError")
        else:
            raise UnsupportedSchemaError(f"Avro type {avro!r}")

    def _list_bound(self, field: str) -> int | None:
        assert self.limits is not None
        return {
            "items": self.limits.max_items_per_batch,
            "before": self.limits.max_digests_per_tail,
            "observed_tail": self.limits.max_digests_per_tail,
            "trail": self.limits.max_trail_entries,
        }.get(field)


def _write_length(data: str, out: list[str], ind: str) -> None:
    # Most strings are shorter than 64 bytes: their length is one precomputed byte.
    n = f"n{data}"
    out += [f"{ind}{n} = len({data})", f"{ind}o += _SMALL[{n} + 64] if {n} < 64 else _long({n})"]
    out.append(f"{ind}o += {data}")


def _inline_long(target: str, out: list[str], ind: str) -> None:
    # Lengths, counts and most longs are one byte from 0 to 63: a table gives those; anything
    # else (negative, longer) takes the call, and the caller's checks see the real value.
    out += [f"{ind}{target} = _ONE[b[p]]", f"{ind}if {target} < 0:"]
    out += [f"{ind}    {target}, p = _rl(b, p)", f"{ind}else:", f"{ind}    p += 1"]


def _not_too_deep(ind: str) -> None:
    # A recursive schema would nest without end, and Python allows 20 nested blocks.
    if len(ind) > 4 * 16:
        raise UnsupportedSchemaError("the schema nests too deeply for generated code")


def _kind(avro: Any) -> str | None:
    if isinstance(avro, str):
        return avro
    return avro.get("type") if isinstance(avro, dict) else None


def _list_item(info: Any) -> Any:
    if not isinstance(info, msgspec.inspect.ListType):
        raise UnsupportedSchemaError(f"expected a list, got {info!r}")
    return info.item_type


def _non_null(info: Any) -> Any:
    if not isinstance(info, msgspec.inspect.UnionType):
        raise UnsupportedSchemaError(f"expected an optional, got {info!r}")
    branches = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
    if len(branches) != 1:
        raise UnsupportedSchemaError(f"expected one non-null branch, got {info!r}")
    return branches[0]


def _compile(gen: _Gen, entry: str, source_name: str) -> Any:
    source = "\n".join(gen.lines)
    exec(compile(source, f"<{source_name}>", "exec"), gen.namespace)  # our own generated text
    return gen.namespace[entry]


def writer_for(parsed_schema: Mapping[str, Any], value_type: type[msgspec.Struct]) -> Writer:
    """A function value -> Avro body bytes, the same bytes fastavro writes for the value's
    record. Raises `UnsupportedSchemaError` when the schema uses a type it does not handle."""
    gen = _WriterGen(None, parsed_schema)
    top = gen.function(parsed_schema, msgspec.inspect.type_info(value_type))
    gen.lines += ["def write(v):", "    o = bytearray()", f"    {top}(v, o)", "    return bytes(o)"]
    write: Writer = _compile(gen, "write", f"writer {parsed_schema['name']}")
    return write


def reader_for(
    parsed_schema: Mapping[str, Any], value_type: type[msgspec.Struct], limits: WireLimits
) -> Reader:
    """A function body bytes -> value, or None when the reference decoder must look (anything
    it does not accept as it stands). Raises `UnsupportedSchemaError` like `writer_for`."""
    gen = _ReaderGen(limits, parsed_schema)
    top = gen.function(parsed_schema, msgspec.inspect.type_info(value_type))
    gen.lines += [
        "def read(b):",
        "    try:",
        f"        v, p = {top}(b, 0)",
        "    except Exception:",  # bad bytes raise many types here; all mean: decline
        "        return None",
        "    return v if p == len(b) else None",
    ]
    read: Reader = _compile(gen, "read", f"reader {parsed_schema['name']}")
    return read
