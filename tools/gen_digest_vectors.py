"""Write `schemas/digest_vectors.json`: the digest and partitioner test vectors of the spec.

The inputs are chosen by hand to cover every rule of `schemas/SPEC.md` (key order, escapes,
numbers, stripped keys, ids); the outputs come from the reference implementation
(`engine.core.digest`, `engine.wire.partitioner`). Run it only when the spec changes; the
Python tests and the Java example runner read the file and must reproduce every output.

    .venv/bin/python -m tools.gen_digest_vectors
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.core.digest import canonical_json, item_digest
from engine.wire.partitioner import murmur2, partition_for

OUT = Path(__file__).resolve().parents[1] / "schemas" / "digest_vectors.json"

ITEMS: list[tuple[str, dict[str, Any], bool]] = [
    ("easy input message", {"role": "user", "content": "refund order 7"}, False),
    (
        "function call, id kept",
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call-1",
            "name": "refund",
            "arguments": '{"order": 7}',
        },
        False,
    ),
    (
        "function call, id ignored (top-level id dropped)",
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call-1",
            "name": "refund",
            "arguments": '{"order": 7}',
        },
        True,
    ),
    (
        "internal keys stripped at the top level only",
        {
            "type": "function_call_output",
            "call_id": "call-1",
            "output": "done",
            "created_by": "runner",
            "_agents_tool_title": "Refund",
            "_agents_tool_description": "Refunds an order",
            "meta": {"created_by": "kept when nested", "id": "kept when nested"},
        },
        True,
    ),
    (
        "nested objects sorted, arrays keep order",
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "b", "annotations": []}, {"z": 1, "a": 2}],
        },
        False,
    ),
    (
        "key order is by code point (upper case before lower case, then non-ASCII)",
        {"b": 1, "B": 2, "a": 3, "_": 4, "é": 5, "Z": 6, "1": 7},
        False,
    ),
    (
        "non-ASCII escaped as \\u, astral characters as surrogate pairs",
        {"role": "user", "content": "café 東京 😀"},
        False,
    ),
    (
        "escapes: quote, backslash, controls and DEL; the slash stays raw",
        {"role": "user", "content": 'say "hi"\\ / \n\r\t\b\f \u0001 \u001f \u007f'},
        False,
    ),
    (
        "literals and integers",
        {"t": True, "f": False, "n": None, "zero": 0, "neg": -42, "big": 12345678901234567890},
        False,
    ),
    (
        "floats in Python repr: shortest round trip, .0 on integral values, exponent form",
        {
            "half": 0.5,
            "one": 1.0,
            "neg_zero": -0.0,
            "pi": 3.14159,
            "tenth": 0.1,
            "small": 0.0001,
            "smaller": 0.00001,
            "tiny": 1.5e-7,
            "large": 1e15,
            "larger": 1e16,
            "huge": 1.7976931348623157e308,
            "third": 1 / 3,
        },
        False,
    ),
    ("empty containers", {"type": "message", "content": [], "extra": {}}, False),
    ("empty object", {}, False),
]

KEYS = ["", "s1", "session-42", "demo-1a2b3c-lost-ack", "東京-session", "a" * 37]
PARTITION_COUNTS = [1, 3, 6, 12]


def vectors() -> dict[str, Any]:
    """The document written to `schemas/digest_vectors.json`."""
    return {
        "description": (
            "Test vectors of schemas/SPEC.md. 'digests': canonical JSON (as a JSON string) and "
            "SHA-256 hex of each item under scheme sdk-sha256-v1. 'partitions': Kafka's murmur2 "
            "of the UTF-8 key bytes (signed 32-bit) and the partition for each count."
        ),
        "digests": [
            {
                "name": name,
                "ignore_ids": ignore_ids,
                "item": item,
                "canonical": canonical_json(item, ignore_ids=ignore_ids),
                "sha256": item_digest(item, ignore_ids=ignore_ids),
            }
            for name, item, ignore_ids in ITEMS
        ],
        "partitions": [
            {
                "key": key,
                "murmur2": murmur2(key.encode()),
                "partition": {str(n): partition_for(key, n) for n in PARTITION_COUNTS},
            }
            for key in KEYS
        ],
    }


def main() -> None:
    OUT.write_text(json.dumps(vectors(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
