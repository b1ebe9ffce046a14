"""`schemas/SPEC.md` and its vectors: the Python implementation reproduces every vector, and the
document covers every field and fingerprint of every supported schema version."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine.core.digest import canonical_json, item_digest
from engine.wire import POLICY, SHIPPED_SCHEMAS, ShippedSchema
from engine.wire.partitioner import murmur2, partition_for
from tools.gen_digest_vectors import vectors

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
VECTORS: dict[str, Any] = json.loads((SCHEMAS / "digest_vectors.json").read_text("utf-8"))
SPEC = (SCHEMAS / "SPEC.md").read_text("utf-8")


@pytest.mark.parametrize("vector", VECTORS["digests"], ids=lambda v: v["name"])
def test_digest_vectors(vector: dict[str, Any]) -> None:
    item, ignore_ids = vector["item"], vector["ignore_ids"]
    assert canonical_json(item, ignore_ids=ignore_ids) == vector["canonical"]
    assert item_digest(item, ignore_ids=ignore_ids) == vector["sha256"]
    assert vector["canonical"].isascii()


@pytest.mark.parametrize("vector", VECTORS["partitions"], ids=lambda v: repr(v["key"]))
def test_partitioner_vectors(vector: dict[str, Any]) -> None:
    assert murmur2(vector["key"].encode()) == vector["murmur2"]
    for count, partition in vector["partition"].items():
        assert partition_for(vector["key"], int(count)) == partition


def test_the_vector_file_is_what_the_generator_writes() -> None:
    """A hand edit of the file (or of the generator's inputs) shows up here."""
    assert json.loads(json.dumps(vectors())) == VECTORS


def _fields(schema: Any, found: dict[str, set[str]]) -> None:
    if isinstance(schema, list):
        for branch in schema:
            _fields(branch, found)
    elif isinstance(schema, dict):
        if schema.get("type") == "record":
            found.setdefault(schema["name"], set()).update(f["name"] for f in schema["fields"])
            for field in schema["fields"]:
                _fields(field["type"], found)
        elif schema.get("type") == "array":
            _fields(schema["items"], found)


def _documented() -> dict[str, set[str]]:
    """Record name -> field names of the spec's `#### Name` tables (v1 and "added in v2")."""
    tables: dict[str, set[str]] = {}
    for section in re.split(r"^#### ", SPEC, flags=re.M)[1:]:
        name = section.split()[0]
        tables.setdefault(name, set()).update(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    return tables


def _spec_schemas() -> list[ShippedSchema]:
    """Every supported version of every record type (v1 in section 4, newer in section 7)."""
    return [
        SHIPPED_SCHEMAS.get(record_type, version)
        for record_type, policy in POLICY.items()
        for version in policy.supported
    ]


def test_spec_documents_every_field_of_every_record() -> None:
    found: dict[str, set[str]] = {}
    for schema in _spec_schemas():
        _fields(dict(schema.source), found)
    documented = _documented()
    missing = {name: fields - documented.get(name, set()) for name, fields in found.items()}
    # A new schema version: add its fields to SPEC.md section 7 ("fields added in v<N>" tables).
    assert {name: sorted(f) for name, f in missing.items() if f} == {}


def test_spec_lists_every_fingerprint() -> None:
    for schema in _spec_schemas():  # a new or edited schema: update SPEC.md's table (section 2)
        assert f"| `{schema.file_name}` |" in SPEC
        assert f"`{schema.fingerprint.hex()}` |" in SPEC
