"""Encode/decode throughput of the wire codec against plain ``json`` on the same content.

Run from the repository root: ``.venv/bin/python -m tools.bench_codec [--seconds 1.0]``.
Not a test: it prints records/s. "full" decode includes validation into the core value,
"raw" stops at the plain dict (fastavro record, or ``json.loads``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from engine.core.events import (
    Binding,
    Classification,
    Decision,
    Fence,
    IntentEvent,
    IntentKind,
    ItemFacts,
    Reason,
    TrailEntry,
    Verdict,
)
from engine.wire import Codec, RecordType, WireModel
from engine.wire.values import from_record, to_json_record


def typical_intent() -> IntentEvent:
    """A 10-item batch (5 call/output pairs) with an 11-digest tail."""
    items = []
    for n in range(5):
        call_id = f"call_{n:04d}"
        items.append(ItemFacts(digest=f"{2 * n:064x}", item_type="function_call", call_id=call_id))
        items.append(
            ItemFacts(digest=f"{2 * n + 1:064x}", item_type="function_call_output", call_id=call_id)
        )
    return IntentEvent(
        event_id="runner-a:in-42:register",
        session_id="conv_6805a1f2c3d4",
        event_time_ms=1_767_225_600_000,
        kind=IntentKind.REGISTER,
        intent_id="in-42",
        runner_id="runner-a",
        fence_token=17,
        binding=Binding(backend_id="sqlite:/var/sessions.db", namespace="default"),
        before=[f"{n + 100:064x}" for n in range(11)],
        items=items,
        persisted_count=10,
        sequence=42,
    )


def typical_decision() -> Decision:
    return Decision(
        decision_id="d:resume-7",
        session_id="conv_6805a1f2c3d4",
        in_reply_to="resume-7",
        verdict=Verdict.CONTINUE,
        reason=Reason.COMMITTED,
        fence_token=18,
        fence=Fence.ADVISORY,
        holder="runner-b",
        classification=Classification.COMMITTED,
        event_time_ms=1_767_225_601_000,
        trail=[
            TrailEntry(step="observed", detail="tail of 21 digests read by runner-b"),
            TrailEntry(step="evidence", detail="runner ack UNKNOWN for in-42"),
            TrailEntry(step="classification", detail="observed == before + batch"),
            TrailEntry(step="authority", detail="granted to runner-b with fence 18"),
        ],
    )


def rate(operation: Callable[[], object], seconds: float) -> float:
    """Calls per second, measured over at least ``seconds`` after a short warm-up."""
    for _ in range(200):
        operation()
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(500):
            operation()
        count += 500
    return count / elapsed


def bench(name: str, record_type: RecordType, model: WireModel, seconds: float) -> None:
    codec = Codec()
    avro_bytes = codec.encode(model)
    as_dict = to_json_record(model)
    json_bytes = json.dumps(as_dict).encode()
    model_type = type(model)
    rows = [
        (
            "encode model",
            lambda: codec.encode(model),
            lambda: json.dumps(to_json_record(model)).encode(),
        ),
        (
            "decode full",
            lambda: codec.decode(record_type, avro_bytes),
            lambda: from_record(model_type, json.loads(json_bytes)),
        ),
        (
            "decode raw",
            lambda: codec.decode_record(record_type, avro_bytes),
            lambda: json.loads(json_bytes),
        ),
    ]
    print(f"\n{name}: avro {len(avro_bytes)} bytes, json {len(json_bytes)} bytes")
    print(f"  {'operation':<14}{'avro rec/s':>14}{'json rec/s':>14}{'avro/json':>11}")
    for label, ours, theirs in rows:
        a, j = rate(ours, seconds), rate(theirs, seconds)
        print(f"  {label:<14}{a:>14,.0f}{j:>14,.0f}{a / j:>11.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args()
    bench("intent (10 items)", RecordType.INTENT, typical_intent(), args.seconds)
    bench("decision (4 trail entries)", RecordType.DECISION, typical_decision(), args.seconds)


if __name__ == "__main__":
    main()
