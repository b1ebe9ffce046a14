"""The version policy and the shipped schemas agree, and the schemas mirror the models."""

from __future__ import annotations

import json
import shutil
import types
import typing
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from msgspec import Struct

from engine.wire import MODEL_OF, POLICY, SchemaPolicyError, SchemaStore, ShippedSchema
from engine.wire.codec import UNRECOGNIZED_SYMBOL
from engine.wire.policy import NAMESPACE
from engine.wire.schema_store import load_shipped_schemas, shipped_schema_root


@pytest.fixture
def schema_copy(tmp_path: Path) -> Path:
    root = Path(str(shipped_schema_root()))
    for path in root.glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


def test_every_current_version_is_supported_and_has_a_summary() -> None:
    for policy in POLICY.values():
        assert policy.current in policy.supported
        assert all(summary.strip() for summary in policy.supported.values())


def test_missing_schema_file_is_refused(schema_copy: Path) -> None:
    (schema_copy / "ack.v1.avsc").unlink()
    with pytest.raises(SchemaPolicyError, match=r"missing \['ack.v1.avsc'\]"):
        load_shipped_schemas(schema_copy)


def test_unlisted_schema_file_is_refused(schema_copy: Path) -> None:
    shutil.copy(schema_copy / "repair.v1.avsc", schema_copy / "repair.v2.avsc")
    with pytest.raises(SchemaPolicyError, match=r"unlisted \['repair.v2.avsc'\]"):
        load_shipped_schemas(schema_copy)


def test_undocumented_field_is_refused(schema_copy: Path) -> None:
    path = schema_copy / "repair.v1.avsc"
    source = json.loads(path.read_text())
    del source["fields"][0]["doc"]
    path.write_text(json.dumps(source))
    with pytest.raises(SchemaPolicyError, match="needs a doc"):
        load_shipped_schemas(schema_copy)


def test_misnamed_record_is_refused(schema_copy: Path) -> None:
    path = schema_copy / "repair.v1.avsc"
    source = json.loads(path.read_text())
    source["name"] = "Repairs"
    path.write_text(json.dumps(source))
    with pytest.raises(SchemaPolicyError, match=r"policy expects io\.reconciler\.Repair"):
        load_shipped_schemas(schema_copy)


def test_unknown_version_request_lists_supported_versions(schema_copy: Path) -> None:
    store = load_shipped_schemas(schema_copy)
    record_type = next(iter(POLICY))
    listed = ", ".join(str(v) for v in sorted(POLICY[record_type].supported))
    with pytest.raises(SchemaPolicyError, match=rf"supported versions are \[{listed}\]"):
        store.get(record_type, 99)


def _named_types(schema: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        if schema.get("type") in ("record", "enum"):
            found.append(schema)
        for value in schema.values():
            found.extend(_named_types(value))
    elif isinstance(schema, list):
        for value in schema:
            found.extend(_named_types(value))
    return found


def _all_shipped() -> list[ShippedSchema]:
    store: SchemaStore = load_shipped_schemas()
    return list(store.by_version.values())


@pytest.mark.parametrize("shipped", _all_shipped(), ids=lambda s: s.file_name)
def test_every_enum_has_the_unrecognized_default(shipped: ShippedSchema) -> None:
    for enum in [t for t in _named_types(dict(shipped.source)) if t["type"] == "enum"]:
        assert (enum["default"], enum["symbols"][-1]) == (UNRECOGNIZED_SYMBOL, UNRECOGNIZED_SYMBOL)


@pytest.mark.parametrize("shipped", _all_shipped(), ids=lambda s: s.file_name)
def test_every_field_of_every_nested_record_is_documented(shipped: ShippedSchema) -> None:
    assert shipped.source["namespace"] == NAMESPACE
    for record in [t for t in _named_types(dict(shipped.source)) if t["type"] == "record"]:
        assert record.get("doc")
        assert all(field.get("doc") for field in record["fields"])


def _model_of_annotation(annotation: Any) -> list[type]:
    """The classes inside an annotation such as ``list[ItemFacts] | None``."""
    if isinstance(annotation, type):
        return [annotation]
    found: list[type] = []
    for arg in typing.get_args(annotation):
        found.extend(_model_of_annotation(arg))
    return found


def _assert_mirrors(
    model: type[Struct], record: dict[str, Any], where: str, named: dict[str, Any]
) -> None:
    fields = {field["name"]: field for field in record["fields"]}
    assert list(model.__struct_fields__) == list(fields), where
    hints = typing.get_type_hints(model)
    for name in model.__struct_fields__:
        annotation = hints[name]
        field = fields[name]
        avro_type = field["type"]
        nullable = isinstance(avro_type, list) and "null" in avro_type
        origin = typing.get_origin(annotation)
        optional = origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(
            annotation
        )
        assert optional == nullable, f"{where}.{name}: nullability differs"
        inner = next(t for t in avro_type if t != "null") if nullable else avro_type
        if isinstance(inner, dict) and isinstance(inner.get("items"), str):
            inner = {**inner, "items": named.get(inner["items"], inner["items"])}
        inner = named.get(inner, inner) if isinstance(inner, str) else inner
        for cls in _model_of_annotation(annotation):
            if issubclass(cls, Struct):
                nested = inner["items"] if inner.get("type") == "array" else inner
                _assert_mirrors(cls, nested, f"{where}.{name}", named)
            elif issubclass(cls, StrEnum):
                symbols = [str(member.value) for member in cls]
                assert [*symbols, UNRECOGNIZED_SYMBOL] == inner["symbols"], f"{where}.{name}"


@pytest.mark.parametrize("record_type", list(MODEL_OF))
def test_current_schema_mirrors_the_model_field_for_field(record_type: Any) -> None:
    shipped = load_shipped_schemas().current(record_type)
    named = {f"{NAMESPACE}.{t['name']}": t for t in _named_types(dict(shipped.source))}
    _assert_mirrors(MODEL_OF[record_type], dict(shipped.source), record_type.value, named)
