"""The frozen fixture corpus: tied to the version policy, decoded by the current reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.wire import MODEL_OF, POLICY, Codec, DecodeError, DecodeReason, RecordType
from engine.wire.values import from_json

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "tests" / "fixtures" / "wire"
VARIANTS = ("minimal", "full")
SUPPORTED = [(rt, v) for rt, policy in POLICY.items() for v in sorted(policy.supported)]
MANIFEST = json.loads((CORPUS / "negative" / "manifest.json").read_text())


def test_every_supported_version_has_minimal_and_full_fixtures() -> None:
    expected = {
        f"{rt.value}/v{v}/{variant}.{ext}"
        for rt, v in SUPPORTED
        for variant in VARIANTS
        for ext in ("avro", "json")
    }
    present = {
        str(path.relative_to(CORPUS))
        for path in CORPUS.rglob("*")
        if path.is_file() and path.parent.name.startswith("v")
    }
    assert expected == present


@pytest.mark.parametrize(("record_type", "version"), SUPPORTED)
@pytest.mark.parametrize("variant", VARIANTS)
def test_fixture_decodes_to_its_expected_model(
    record_type: RecordType, version: int, variant: str
) -> None:
    folder = CORPUS / record_type.value / f"v{version}"
    expected = from_json(MODEL_OF[record_type], (folder / f"{variant}.json").read_text())
    decoded = Codec().decode(record_type, (folder / f"{variant}.avro").read_bytes())
    assert expected == decoded


@pytest.mark.parametrize(("record_type", "version"), SUPPORTED)
@pytest.mark.parametrize("variant", VARIANTS)
def test_writer_of_the_version_still_writes_the_frozen_bytes(
    record_type: RecordType, version: int, variant: str
) -> None:
    """A shipped schema edited in place changes its fingerprint and fails here."""
    folder = CORPUS / record_type.value / f"v{version}"
    model = from_json(MODEL_OF[record_type], (folder / f"{variant}.json").read_text())
    assert (folder / f"{variant}.avro").read_bytes() == Codec().encode(model, version=version)


def test_minimal_and_full_differ_so_optional_fields_are_exercised() -> None:
    for rt, v in SUPPORTED:
        folder = CORPUS / rt.value / f"v{v}"
        assert (folder / "minimal.avro").read_bytes() != (folder / "full.avro").read_bytes()


def test_negative_manifest_covers_every_negative_file_and_required_kind() -> None:
    files = {path.stem for path in (CORPUS / "negative").glob("*.bin")}
    assert set(MANIFEST) == files
    required = {
        DecodeReason.TRUNCATED,
        DecodeReason.UNKNOWN_SCHEMA,
        DecodeReason.BAD_MAGIC,
        DecodeReason.UNKNOWN_ENUM_SYMBOL,
        DecodeReason.LIMIT_EXCEEDED,
        DecodeReason.MALFORMED_BODY,
    }
    assert required <= {DecodeReason(case["reason"]) for case in MANIFEST.values()}


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_negative_fixture_is_refused_with_its_reason(name: str) -> None:
    case = MANIFEST[name]
    data = (CORPUS / "negative" / f"{name}.bin").read_bytes()
    with pytest.raises(DecodeError) as caught:
        Codec().decode(RecordType(case["record_type"]), data)
    assert DecodeReason(case["reason"]) == caught.value.reason


def test_generator_reports_no_drift() -> None:
    """Regenerating writes byte-identical files: nothing in the corpus was edited by hand."""
    run = [sys.executable, "-m", "tools.gen_wire_fixtures", "--check"]
    result = subprocess.run(run, cwd=REPO, capture_output=True, text=True, check=False)
    assert (result.returncode, result.stdout) == (0, "")
