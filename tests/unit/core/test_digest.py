"""The SDK 0.24.0 digest test vectors, verbatim from the reference."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from engine.core.digest import canonical_json, item_digest, item_facts, orphan_outputs

CALL = {
    "type": "function_call",
    "call_id": "charge-1",
    "name": "charge",
    "arguments": '{"amount":7}',
    "id": "charge-1",
}

VECTORS = [
    (
        {"role": "user", "content": "charge 7"},
        False,
        '{"content": "charge 7", "role": "user"}',
        "1db77228dec527b53e3e0db7aa3c0e0fd35d0e1f2cb255bd874aebdf72d6ce4d",
    ),
    (
        CALL,
        False,
        '{"arguments": "{\\"amount\\":7}", "call_id": "charge-1", "id": "charge-1", '
        '"name": "charge", "type": "function_call"}',
        "05e38837aa51706285c9c30e0395af425f4929b502a2842fbe8609592ab283de",
    ),
    (
        CALL,
        True,
        '{"arguments": "{\\"amount\\":7}", "call_id": "charge-1", "name": "charge", '
        '"type": "function_call"}',
        "5cebc80bdf44d15ec3c9fe8a426436e6de9808cc8a37c8f0d9fa031a4e68cd10",
    ),
    (
        {"type": "function_call_output", "call_id": "charge-1", "output": "receipt-7"},
        False,
        '{"call_id": "charge-1", "output": "receipt-7", "type": "function_call_output"}',
        "a7cf1cf5ec2b7224aa3408c5781d31b04db1711e5fac3775ab393ed53d9747cf",
    ),
    (
        {"role": "user", "content": "café"},
        False,
        '{"content": "caf\\u00e9", "role": "user"}',
        "82a1dec1bb9f94a1477802744333b3b05a23a8eab984a3b17079af99886a6126",
    ),
]


@pytest.mark.parametrize(("item", "ignore_ids", "canonical", "sha"), VECTORS)
def test_sdk_vectors(item: dict[str, Any], ignore_ids: bool, canonical: str, sha: str) -> None:
    assert canonical == canonical_json(item, ignore_ids=ignore_ids)
    assert sha == item_digest(item, ignore_ids=ignore_ids)


def test_internal_metadata_is_stripped_at_top_level_only() -> None:
    item = {"role": "user", "content": "charge 7", "created_by": "x", "_agents_tool_title": "t"}
    assert VECTORS[0][3] == item_digest(item, ignore_ids=False)
    nested = {"role": "user", "content": [{"created_by": "x"}]}
    assert item_digest(nested, ignore_ids=False) != item_digest(
        {"role": "user", "content": [{}]}, ignore_ids=False
    )


def test_facts_carry_no_content_and_match_sdk() -> None:
    from agents.run_internal.items import fingerprint_input_item

    facts = item_facts(CALL, ignore_ids=True)
    assert facts.item_type == "function_call"
    assert facts.call_id == "charge-1"
    assert "charge" not in msgspec.json.encode(facts).decode().replace("charge-1", "")
    import hashlib

    sdk = fingerprint_input_item(CALL, ignore_ids_for_matching=True)
    assert sdk is not None
    assert hashlib.sha256(sdk.encode()).hexdigest() == facts.digest


def test_orphan_outputs() -> None:
    call = item_facts({"type": "function_call", "call_id": "a"}, ignore_ids=False)
    output = item_facts({"type": "function_call_output", "call_id": "a"}, ignore_ids=False)
    assert orphan_outputs([call, output]) == []
    assert [output] == orphan_outputs([output, call])
