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

import hashlib
import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import msgspec

from engine.core.events import DIGEST_PATTERN
from engine.wire import avro_prims
from engine.wire.limits import WireLimits
from engine.wire.validation import MAX_CAUSES

Writer = Callable[[Any], bytes]


class Reader(Protocol):
    """Body bytes -> value or None. ``start``: where the body begins in ``data`` (a framed
    record is read in place, without first copying its body out)."""

    def __call__(self, data: bytes, start: int = 0, /) -> Any: ...


class UnsupportedSchemaError(Exception):
    """The schema or value type uses something the generator does not handle."""


# The primitives, under the names the generated text uses (a module written at build time
# imports them under the same names).
_PRIMS = {
    "_hexraw": "hex_to_raw",
    "_long": "write_long",
    "_SMALL": "SMALL",
    "_int": "write_int",
    "_rl": "read_long",
    "_DeclineError": "DeclineError",
    "_BOOL": "BOOL",
    "_ONE": "ONE",
    "_HEXKEEP": "HEX_KEEP",
}
_COMMON: dict[str, Any] = {name: getattr(avro_prims, real) for name, real in _PRIMS.items()}
_long = avro_prims.write_long
BUILT_MODULE = "engine.wire.avro_built"
_RAW_DIGEST_LENGTH = b"\x40"  # 32 as an Avro long


class _Gen:
    """Source text for one top-level schema: one function, nested records written out inline
    (the shipped schemas are not recursive)."""

    def __init__(self, limits: WireLimits | None, prefix: str, schema: Mapping[str, Any]) -> None:
        self.limits = limits
        # In a schema marked "digest_bytes": "sha256", Avro bytes under a str field hold a hex
        # digest's 32 raw bytes (session_state v3, `engine.wire.raw_digests`).
        self.raw_digests = schema.get("digest_bytes") == "sha256"
        self.prefix = prefix  # of every name defined, so several schemas share one module
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = dict(_COMMON)
        # Module-level definitions the text needs, as source: name -> (type, expression).
        self.consts: dict[str, tuple[str, str]] = {}
        self.classes: dict[str, type] = {}  # name in the text -> class (imported by a module)
        self.records: dict[str, str] = {}  # Avro full name of the top record -> function name
        self.named: dict[str, Any] = {}  # Avro full name -> definition
        self.counter = 0
        self.declared: set[str] = set()  # temporaries annotated already

    def const(self, prefix: str, value: Any, type_text: str, source: str) -> str:
        self.counter += 1
        name = f"_{self.prefix}{prefix}{self.counter}"
        self.namespace[name] = value
        self.consts[name] = (type_text, source)
        return name

    def cls(self, value: type) -> str:
        """The name the text uses for ``value`` (a value class or an enum)."""
        name = value.__name__
        if self.classes.setdefault(name, value) is not value:
            raise UnsupportedSchemaError(f"two classes named {name}")
        self.namespace[name] = value
        return name

    def member(self, value: Any) -> str:
        return "None" if value is None else f"{self.cls(type(value))}.{value.name}"

    def text(self) -> str:
        """The generated functions, as source (the constants they use are in `consts`)."""
        return "\n".join(self.lines)

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
        fn = self.records[name] = f"_{self.prefix}w{len(self.records)}"
        body: list[str] = []
        for field, field_avro, field_info in self.record_fields(avro, info):
            self.write(field_avro, field_info, f"v.{field}", body, "    ")
        cls = self.cls(info.cls)
        self.lines += [f"def {fn}(v: {cls}, o: list[bytes]) -> None:", *(body or ["    pass"]), ""]
        return fn

    def write(self, avro: Any, info: Any, expr: str, out: list[str], ind: str) -> None:
        _not_too_deep(ind)
        avro = self.resolve(avro)
        kind = _kind(avro)
        if self.raw_digest(avro, info):
            out += [f"{ind}o.append({_RAW_DIGEST_LENGTH!r})", f"{ind}o.append(_hexraw({expr}))"]
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
            out.append(f"{ind}o.append(_SMALL[{t} + 64] if -64 <= {t} < 64 else _long({t}))")
        elif kind == "int":
            out.append(f"{ind}o.append(_int({expr}))")
        elif kind == "boolean":
            out.append(f"{ind}o.append(b'\\x01' if {expr} else b'\\x00')")
        elif kind == "enum":
            symbols = {s: _long(i) for i, s in enumerate(avro["symbols"])}
            # Keyed by the enum's own members where it has them: a value is then found by
            # identity, where a plain str key made each lookup compare the strings.
            known = {m.value: m for m in info.cls} if _is_enum(info) else {}
            keys = {s: known.get(s, s) for s in symbols}
            source = ", ".join(
                f"{self.member(keys[s]) if s in known else repr(s)}: {code!r}"
                for s, code in symbols.items()
            )
            value = {keys[s]: code for s, code in symbols.items()}
            table = self.const("E", value, "dict[str, bytes]", f"{{{source}}}")
            out.append(f"{ind}o.append({table}[{expr}])")
        elif kind == "array":
            t, x = self.temp(), self.temp()
            out += [f"{ind}{t} = {expr}", f"{ind}if {t}:", f"{ind}    o.append(_long(len({t})))"]
            out.append(f"{ind}    for {x} in {t}:")
            self.write(avro["items"], _list_item(info), x, out, ind + "        ")
            out.append(f"{ind}o.append(b'\\x00')")
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
            out += [f"{ind}    o.append({_long(1 - other)!r})", f"{ind}else:"]
            out.append(f"{ind}    o.append({_long(other)!r})")
            self.write(avro[other], _non_null(info), t, out, ind + "    ")
        else:
            raise UnsupportedSchemaError(f"Avro type {avro!r}")


class _ReaderGen(_Gen):
    def function(self, avro: Mapping[str, Any], info: Any) -> str:
        name = avro["name"]
        self.named.setdefault(name, avro)
        if name in self.records:
            return self.records[name]
        fn = self.records[name] = f"_{self.prefix}r{len(self.records)}"
        body: list[str] = []
        args = []
        for field, field_avro, field_info in self.record_fields(avro, info):
            target = self.temp()
            self.read(field_avro, field_info, target, field, body, "    ")
            args.append(f"{field}={target}")
        cls = self.cls(info.cls)
        body.append(f"    return {cls}({', '.join(args)}), p")
        signature = f"def {fn}(b: bytes, p: int) -> tuple[{cls}, int]:"
        self.lines += [signature, "    lb = len(b)", *body, ""]
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
            elif (
                getattr(info, "pattern", None) == DIGEST_PATTERN
                and self.limits.max_string_length >= 64
            ):
                # 64 lowercase hex characters, checked on the bytes: a table that keeps the hex
                # digits and changes every other byte leaves a digest as it was. The one-argument
                # translate is a mypyc primitive; the deleting form was a method call per digest.
                raw = self.temp()
                out.append(f"{ind}{raw} = b[p:{end}]")
                out.append(f"{ind}if {n} != 64 or {raw}.translate(_HEXKEEP) != {raw}:")
                out.append(f"{ind}    raise _DeclineError")
                out.append(f"{ind}{target} = {raw}.decode()")
            else:
                limit = self.limits.max_string_length
                out.append(f"{ind}{target} = b[p:{end}].decode()")
                out.append(
                    f"{ind}if {n} > {limit} and len({target}) > {limit}: raise _DeclineError"
                )
                pattern = getattr(info, "pattern", None)
                if pattern is not None:
                    check = self.const(
                        "P",
                        re.compile(pattern).match,
                        "Callable[[str], object]",
                        f"re.compile({pattern!r}).match",
                    )
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
            source = f"({', '.join(self.member(m) for m in by_byte)},)"
            table = self.const("E", tuple(by_byte), "tuple[Any, ...]", source)
            out += [f"{ind}{target} = {table}[b[p]]", f"{ind}p += 1"]
            out.append(f"{ind}if {target} is None: raise _DeclineError")
        elif kind == "array":
            n, x = self.temp(), self.temp()
            bound = self._list_bound(field)
            declare = "" if target in self.declared else ": list[Any]"
            out += [f"{ind}{target}{declare} = []", f"{ind}while True:"]
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
            out.append(f"{ind}{target} = {self.cls(info.cls)}({', '.join(args)})")
        elif isinstance(avro, list) and len(avro) == 2 and "null" in avro:
            other = 1 - avro.index("null")
            branch = self.temp()
            if target not in self.declared:
                self.declared.add(target)
                out.append(f"{ind}{target}: Any")
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
            "after": MAX_CAUSES,
        }.get(field)


def _write_length(data: str, out: list[str], ind: str) -> None:
    # Most strings are shorter than 64 bytes: their length is one precomputed byte.
    n = f"n{data}"
    out += [
        f"{ind}{n} = len({data})",
        f"{ind}o.append(_SMALL[{n} + 64] if {n} < 64 else _long({n}))",
    ]
    out.append(f"{ind}o.append({data})")


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


def _is_enum(info: Any) -> bool:
    return isinstance(info, msgspec.inspect.EnumType)


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


def _key(gen: _Gen) -> str:
    """What the generated text and its constants are, as a hash: a function built from the
    same text is the same function."""
    consts = "\n".join(f"{n}: {t} = {src}" for n, (t, src) in sorted(gen.consts.items()))
    return hashlib.sha256(f"{gen.text()}\n{consts}".encode()).hexdigest()


def _compile(gen: _Gen, entry: str, source_name: str, *, built: bool) -> Any:
    if built:
        # The same text compiled by `make` (tools/build_compiled.py) when it is current.
        found = _built_functions().get(_key(gen))
        if found is not None:
            return found
    source = f"from __future__ import annotations\n{gen.text()}"
    exec(compile(source, f"<{source_name}>", "exec"), gen.namespace)  # our own generated text
    return gen.namespace[entry]


def _built_functions() -> dict[str, Any]:
    try:
        module = importlib.import_module(BUILT_MODULE)
    except ImportError:
        return {}
    functions: dict[str, Any] = module.BUILT
    return functions


def _prefix(parsed_schema: Mapping[str, Any]) -> str:
    return re.sub(r"\W", "_", str(parsed_schema["name"]).rsplit(".", 1)[-1]).lower() + "_"


def _writer_gen(parsed_schema: Mapping[str, Any], value_type: type[msgspec.Struct]) -> _Gen:
    gen = _WriterGen(None, _prefix(parsed_schema), parsed_schema)
    top = gen.function(parsed_schema, msgspec.inspect.type_info(value_type))
    gen.lines += [
        f"def _{gen.prefix}write(v: {gen.cls(value_type)}) -> bytes:",
        "    o: list[bytes] = []",
        f"    {top}(v, o)",
        '    return b"".join(o)',
        "",
    ]
    return gen


def _reader_gen(
    parsed_schema: Mapping[str, Any], value_type: type[msgspec.Struct], limits: WireLimits
) -> _Gen:
    gen = _ReaderGen(limits, _prefix(parsed_schema), parsed_schema)
    top = gen.function(parsed_schema, msgspec.inspect.type_info(value_type))
    gen.lines += [
        f"def _{gen.prefix}read(b: bytes, start: int = 0) -> {gen.cls(value_type)} | None:",
        "    try:",
        f"        v, p = {top}(b, start)",
        "    except Exception:",  # bad bytes raise many types here; all mean: decline
        "        return None",
        "    return v if p == len(b) else None",
        "",
    ]
    return gen


def writer_for(
    parsed_schema: Mapping[str, Any], value_type: type[msgspec.Struct], *, built: bool = True
) -> Writer:
    """A function value -> Avro body bytes, the same bytes fastavro writes for the value's
    record. Raises `UnsupportedSchemaError` when the schema uses a type it does not handle.
    ``built=False``: always the text compiled here, never the build's copy of it."""
    gen = _writer_gen(parsed_schema, value_type)
    name = f"writer {parsed_schema['name']}"
    write: Writer = _compile(gen, f"_{gen.prefix}write", name, built=built)
    return write


def reader_for(
    parsed_schema: Mapping[str, Any],
    value_type: type[msgspec.Struct],
    limits: WireLimits,
    *,
    built: bool = True,
) -> Reader:
    """A function body bytes -> value, or None when the reference decoder must look (anything
    it does not accept as it stands). Raises `UnsupportedSchemaError` like `writer_for`."""
    gen = _reader_gen(parsed_schema, value_type, limits)
    name = f"reader {parsed_schema['name']}"
    read: Reader = _compile(gen, f"_{gen.prefix}read", name, built=built)
    return read


def module_source(
    schemas: Iterable[tuple[Mapping[str, Any], type[msgspec.Struct]]], limits: WireLimits
) -> str:
    """The text of `BUILT_MODULE`: the reader and writer of every schema given (those the
    generator handles), with their constants and imports, and ``BUILT``: key -> function."""
    gens: list[tuple[_Gen, str]] = []
    for parsed_schema, value_type in schemas:
        try:
            writer = _writer_gen(parsed_schema, value_type)
            reader = _reader_gen(parsed_schema, value_type, limits)
        except UnsupportedSchemaError:
            continue
        gens += [(writer, f"_{writer.prefix}write"), (reader, f"_{reader.prefix}read")]
    classes: dict[str, type] = {}
    for gen, _ in gens:
        classes.update(gen.classes)
    out = [
        f'"""Generated by tools/build_compiled.py from {__name__}: do not edit (git-ignored)."""',
        "",
        "from __future__ import annotations",
        "",
        "import re",
        "from collections.abc import Callable",
        "from typing import Any, Final",
        "",
        *(f"from engine.wire.avro_prims import {real} as {name}" for name, real in _PRIMS.items()),
        *(f"from {c.__module__} import {c.__name__}" for c in classes.values()),
        "",
    ]
    for gen, _ in gens:
        out += [f"{n}: Final[{t}] = {src}" for n, (t, src) in gen.consts.items()]
    out.append("")
    for gen, _ in gens:
        out += [gen.text(), ""]
    out.append("BUILT: Final[dict[str, Callable[..., Any]]] = {")
    out += [f"    {_key(gen)!r}: {entry}," for gen, entry in gens]
    out += ["}", ""]
    return "\n".join(out)
