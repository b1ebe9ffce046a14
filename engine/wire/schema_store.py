"""The shipped Avro schemas, loaded once and checked against the version policy.

Schemas are read through ``reconciler_schemas.schema_root()`` (never a repo-relative path),
so an installed wheel finds the same files as a checkout.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from engine.wire.errors import SchemaPolicyError
from engine.wire.policy import POLICY, RecordPolicy, RecordType, schema_file_name

SINGLE_OBJECT_FINGERPRINT = "CRC-64-AVRO"


@dataclass(frozen=True, slots=True)
class ShippedSchema:
    """One version of one record type, ready for fastavro.

    ``fingerprint`` is the 8-byte CRC-64-AVRO Rabin fingerprint of the Parsing Canonical Form,
    in the little-endian byte order the single-object encoding puts on the wire.
    """

    record_type: RecordType
    version: int
    source: Mapping[str, Any]
    parsed: Any
    canonical: str
    fingerprint: bytes

    @property
    def file_name(self) -> str:
        """The shipped file of this version, e.g. ``intent.v1.avsc``."""
        return schema_file_name(self.record_type, self.version)


def shipped_schema_root() -> Traversable:
    """The folder of the shipped ``.avsc`` files (``reconciler_schemas.schema_root()``)."""
    # Imported by name: the package is the top-level `schemas/` folder mapped by setuptools,
    # which mypy cannot see through an editable install.
    package = importlib.import_module("reconciler_schemas")
    root: Traversable = package.schema_root()
    return root


def parse_json_schema(text: str) -> Any:
    """The JSON value of a schema text (a registry answer or a shipped file)."""
    return json.loads(text)


def _load_one(
    root: Traversable, policy: RecordPolicy, record_type: RecordType, version: int
) -> ShippedSchema:
    name = schema_file_name(record_type, version)
    try:
        source = json.loads(root.joinpath(name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchemaPolicyError(
            f"schema file {name} is missing or not JSON ({exc}); the version policy "
            "lists it as supported: restore the file or remove the version from the policy"
        ) from exc
    _check_shape(name, source, policy)
    canonical = to_parsing_canonical_form(source)
    return ShippedSchema(
        record_type=record_type,
        version=version,
        source=source,
        parsed=parse_schema(source, named_schemas={}),
        canonical=canonical,
        fingerprint=bytes.fromhex(fingerprint(canonical, SINGLE_OBJECT_FINGERPRINT)),
    )


def _check_shape(name: str, source: object, policy: RecordPolicy) -> None:
    if not isinstance(source, dict) or source.get("type") != "record":
        raise SchemaPolicyError(f"{name}: the top level must be an Avro record")
    full_name = source.get("name")
    if "." not in str(full_name):
        full_name = f"{source.get('namespace')}.{full_name}"
    if full_name != policy.full_name:
        raise SchemaPolicyError(
            f"{name}: record is named {full_name}, policy expects {policy.full_name}"
        )
    undocumented = [f.get("name") for f in source.get("fields", []) if not f.get("doc")]
    if undocumented or not source.get("doc"):
        raise SchemaPolicyError(f"{name}: every record and field needs a doc: {undocumented}")


@dataclass(frozen=True, slots=True)
class SchemaStore:
    """All supported schema versions, addressable by (type, version) and by fingerprint."""

    by_version: Mapping[tuple[RecordType, int], ShippedSchema]
    by_fingerprint: Mapping[bytes, ShippedSchema]
    policy: Mapping[RecordType, RecordPolicy] = field(default_factory=lambda: POLICY)

    def current(self, record_type: RecordType) -> ShippedSchema:
        """The reader schema: every record is resolved to this version when decoded."""
        return self.by_version[(record_type, self.policy[record_type].current)]

    def reader_of(self, writer: ShippedSchema) -> ShippedSchema:
        """The schema a record written with ``writer`` resolves to: the current one, or for a
        writer older than a break in the policy, the newest schema of the writer's own line."""
        policy = self.policy[writer.record_type]
        return self.by_version[(writer.record_type, policy.reader_version(writer.version))]

    def get(self, record_type: RecordType, version: int) -> ShippedSchema:
        """One supported version of a record type; `SchemaPolicyError` naming the supported ones."""
        try:
            return self.by_version[(record_type, version)]
        except KeyError:
            supported = sorted(self.policy[record_type].supported)
            raise SchemaPolicyError(
                f"{record_type} schema version {version} is not supported; "
                f"supported versions are {supported}"
            ) from None


def load_shipped_schemas(
    root: Traversable | None = None, policy: Mapping[RecordType, RecordPolicy] = POLICY
) -> SchemaStore:
    """Load every version the policy lists and check that the folder holds exactly those.

    Raises `SchemaPolicyError` on a missing, extra, misnamed or undocumented schema, or on two
    versions with the same fingerprint (a version bump that changed nothing on the wire).
    """
    folder = root if root is not None else shipped_schema_root()
    expected = {
        schema_file_name(rt, v): (rt, v) for rt, entry in policy.items() for v in entry.supported
    }
    present = {entry.name for entry in folder.iterdir() if entry.name.endswith(".avsc")}
    if present != set(expected):
        raise SchemaPolicyError(
            "shipped schema files do not match engine.wire.policy: "
            f"missing {sorted(set(expected) - present)}, unlisted {sorted(present - set(expected))}"
        )
    by_version = {key: _load_one(folder, policy[key[0]], *key) for key in expected.values()}
    by_fingerprint: dict[bytes, ShippedSchema] = {}
    for shipped in by_version.values():
        clash = by_fingerprint.setdefault(shipped.fingerprint, shipped)
        if clash is not shipped:
            raise SchemaPolicyError(
                f"{shipped.file_name} and {clash.file_name} have the same canonical form"
            )
    return SchemaStore(by_version=by_version, by_fingerprint=by_fingerprint, policy=policy)


SHIPPED_SCHEMAS = load_shipped_schemas()
"""Loaded at import: a build whose schema files disagree with the policy fails to start."""
