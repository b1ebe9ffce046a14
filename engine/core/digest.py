"""The openai-agents 0.24.0 item digest, exactly (scheme ``sdk-sha256-v1``).

The SDK fingerprints a dict item by dropping the top-level internal keys
``_agents_tool_description``, ``_agents_tool_title`` and ``created_by`` (and ``id`` when the
backend ignores ids), then serializing with ``json.dumps(item, sort_keys=True, default=str)``
(Python's default separators and ``ensure_ascii``), and hashing the UTF-8 bytes with SHA-256.

Dependency-free on purpose: the runner-side client library imports this module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.core.events import ItemFacts

_INTERNAL_KEYS = ("_agents_tool_description", "_agents_tool_title", "created_by")

# Call families and their output types (SDK ``_TOOL_CALL_TO_OUTPUT_TYPE``) plus hosted MCP.
CALL_TO_OUTPUT_TYPE: Mapping[str, str] = {
    "program": "program_output",
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "tool_search_call": "tool_search_output",
    "mcp_approval_request": "mcp_approval_response",
}
OUTPUT_TO_CALL_TYPE: Mapping[str, str] = {v: k for k, v in CALL_TO_OUTPUT_TYPE.items()}


def canonical_json(item: Mapping[str, Any], *, ignore_ids: bool) -> str:
    """The SDK's fingerprint string of one dict item."""
    payload = {k: v for k, v in item.items() if k not in _INTERNAL_KEYS}
    if ignore_ids:
        payload.pop("id", None)
    return json.dumps(payload, sort_keys=True, default=str)


def item_digest(item: Mapping[str, Any], *, ignore_ids: bool) -> str:
    """SHA-256 hex digest (64 lowercase hex characters) of the item's canonical JSON."""
    return hashlib.sha256(canonical_json(item, ignore_ids=ignore_ids).encode("utf-8")).hexdigest()


def digests(items: Iterable[Mapping[str, Any]], *, ignore_ids: bool) -> list[str]:
    return [item_digest(item, ignore_ids=ignore_ids) for item in items]


def item_type(item: Mapping[str, Any]) -> str:
    """The item's ``type``; role-only easy input messages count as ``message``."""
    kind = item.get("type")
    return str(kind) if kind is not None else "message"


def pairing_id(item: Mapping[str, Any]) -> str | None:
    """The key that pairs a call with its output: ``call_id``, or the MCP approval request id."""
    kind = item_type(item)
    if kind == "mcp_approval_request":
        value = item.get("id")
    elif kind == "mcp_approval_response":
        value = item.get("approval_request_id")
    else:
        value = item.get("call_id")
    return str(value) if value is not None else None


def item_facts(item: Mapping[str, Any], *, ignore_ids: bool) -> ItemFacts:
    """Payload-free facts of one item: digest, type and pairing id. Never its content."""
    return ItemFacts(
        digest=item_digest(item, ignore_ids=ignore_ids),
        item_type=item_type(item),
        call_id=pairing_id(item),
    )


def orphan_outputs(batch: Sequence[ItemFacts]) -> list[ItemFacts]:
    """Outputs in ``batch`` with no same-family call (same pairing id) earlier in the batch."""
    seen_calls: set[tuple[str, str | None]] = set()
    orphans: list[ItemFacts] = []
    for facts in batch:
        if facts.item_type in CALL_TO_OUTPUT_TYPE:
            seen_calls.add((facts.item_type, facts.call_id))
        call_type = OUTPUT_TO_CALL_TYPE.get(facts.item_type)
        if call_type is not None and (call_type, facts.call_id) not in seen_calls:
            orphans.append(facts)
    return orphans


def has_outputs(batch: Sequence[ItemFacts]) -> bool:
    """True when the batch carries a tool output, i.e. a tool in it already ran."""
    return any(facts.item_type in OUTPUT_TO_CALL_TYPE for facts in batch)
