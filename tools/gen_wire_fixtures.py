"""Write the frozen wire fixture corpus under ``tests/fixtures/wire/``.

Run from the repository root: ``.venv/bin/python -m tools.gen_wire_fixtures``.

For every supported version of every record type it writes ``<type>/v<N>/{minimal,full}.avro``
(single-object encoding, written with that version's schema: the writer of that version) and
``.json`` (the model the current reader must decode it to). It also writes negative fixtures
under ``negative/`` with a ``manifest.json`` of expected reason codes.

Existing files are never rewritten: the corpus is frozen once a version ships. ``--check``
only reports files that are missing or would now be written differently.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from msgspec.structs import replace

from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Binding,
    CausalContext,
    Cause,
    Classification,
    Decision,
    Fence,
    IntentEvent,
    IntentKind,
    ItemFacts,
    PendingRecord,
    Reason,
    RepairEvent,
    RepairResolution,
    ResumeEvent,
    RunnerAction,
    TrailEntry,
    Verdict,
)
from engine.core.state import (
    CausalWait,
    Health,
    IntentSlot,
    ParkedResume,
    ProducerMark,
    SessionState,
    SlotStatus,
)
from engine.wire import POLICY, SHIPPED_SCHEMAS, Codec, DeadLetter, DecodeReason, RecordType
from engine.wire.codec import UNRECOGNIZED_SYMBOL, WireModel, fields_of
from engine.wire.framing import SINGLE_OBJECT_HEADER_SIZE
from engine.wire.values import to_json, to_json_record, to_record

CORPUS = Path("tests/fixtures/wire")
NEGATIVE_WRITER_VERSION = 1
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, event time of every sample


def _digest(n: int) -> str:
    return f"{n:02x}" * 32


BINDING_MIN = Binding(backend_id="sqlite:/var/sessions.db", namespace="default")
BINDING_FULL = Binding(
    backend_id="openai-conversations",
    namespace="org-7/project-3",
    digest_scheme="sdk-sha256-v1",
    ignore_ids=True,
    checkpoint_schema_version="1.19",
    store_enforces_fence=True,
    chunk_size=20,
)
CALL = ItemFacts(digest=_digest(1), item_type="function_call", call_id="call_1")
OUTPUT = ItemFacts(digest=_digest(2), item_type="function_call_output", call_id="call_1")
MESSAGE = ItemFacts(digest=_digest(3), item_type="message")


def _ack_full() -> AckEvent:
    return AckEvent(
        event_id="ev-4",
        session_id="s-1",
        event_time_ms=T0 + 2,
        intent_id="in-2",
        runner_id="runner-a",
        outcome=AckOutcome.COMMITTED,
        source=AckSource.STORE,
        fence_token=41,
        observed_tail=[_digest(11), _digest(12), _digest(1), _digest(2)],
        committed_count=2,
    )


def _resume_full() -> ResumeEvent:
    return ResumeEvent(
        event_id="ev-6",
        session_id="s-1",
        event_time_ms=T0 + 3,
        runner_id="runner-b",
        checkpoint_id="ck-2",
        binding=BINDING_FULL,
        pending=PendingRecord(
            intent_id="in-2",
            items=[CALL, OUTPUT],
            before=[_digest(11), _digest(12)],
            persisted_count=2,
            held=False,
            append_acknowledged=True,
        ),
        observed_tail=[_digest(11), _digest(12), _digest(1), _digest(2)],
        checkpoint_sequence=7,
    )


SAMPLES: dict[RecordType, dict[str, Callable[[], WireModel]]] = {
    RecordType.INTENT: {
        "minimal": lambda: IntentEvent(
            event_id="ev-1",
            session_id="s-1",
            event_time_ms=T0,
            kind=IntentKind.DISCARD,
            intent_id="in-1",
            runner_id="runner-a",
            binding=BINDING_MIN,
            persisted_count=0,  # the v1 default (v2: null, unknown)
            sequence=0,
        ),
        "full": lambda: IntentEvent(
            event_id="ev-2",
            session_id="s-1",
            event_time_ms=T0 + 1,
            kind=IntentKind.REGISTER,
            intent_id="in-2",
            runner_id="runner-a",
            fence_token=41,
            binding=BINDING_FULL,
            before=[_digest(10), _digest(11), _digest(12)],
            items=[CALL, OUTPUT],
            persisted_count=2,
            sequence=7,
            tools_ran=True,
        ),
    },
    RecordType.ACK: {
        "minimal": lambda: AckEvent(
            event_id="ev-3",
            session_id="s-1",
            event_time_ms=T0,
            intent_id="in-2",
            outcome=AckOutcome.UNKNOWN,
            source=AckSource.RUNNER,
        ),
        "full": lambda: AckEvent(
            event_id="ev-4",
            session_id="s-1",
            event_time_ms=T0 + 2,
            intent_id="in-2",
            runner_id="runner-a",
            outcome=AckOutcome.COMMITTED,
            source=AckSource.STORE,
            fence_token=41,
            observed_tail=[_digest(11), _digest(12), _digest(1), _digest(2)],
            committed_count=2,
        ),
    },
    RecordType.RESUME: {
        "minimal": lambda: ResumeEvent(
            event_id="ev-5",
            session_id="s-1",
            event_time_ms=T0,
            runner_id="runner-b",
            checkpoint_id="ck-1",
            binding=BINDING_MIN,
        ),
        "full": lambda: ResumeEvent(
            event_id="ev-6",
            session_id="s-1",
            event_time_ms=T0 + 3,
            runner_id="runner-b",
            checkpoint_id="ck-2",
            binding=BINDING_FULL,
            pending=PendingRecord(
                intent_id="in-2",
                items=[CALL, OUTPUT],
                before=[_digest(11), _digest(12)],
                persisted_count=2,
                held=False,
                append_acknowledged=True,
            ),
            observed_tail=[_digest(11), _digest(12), _digest(1), _digest(2)],
            checkpoint_sequence=7,
        ),
    },
    RecordType.REPAIR: {
        "minimal": lambda: RepairEvent(
            event_id="ev-7",
            session_id="s-1",
            event_time_ms=T0,
            resolution=RepairResolution.ABANDON,
            actor="ops@example.com",
            reason="restart",
        ),
        "full": lambda: RepairEvent(
            event_id="ev-8",
            session_id="s-1",
            event_time_ms=T0 + 4,
            resolution=RepairResolution.ACCEPT_COMMITTED,
            actor="ops@example.com",
            reason="verified both items in the conversation export",
            intent_id="in-2",
        ),
    },
    RecordType.DECISION: {
        "minimal": lambda: Decision(
            decision_id="d-ev-5",
            session_id="s-1",
            in_reply_to="ev-5",
            verdict=Verdict.RECORDED,
            reason=Reason.ACCEPTED,
            event_time_ms=T0,
        ),
        "full": lambda: Decision(
            decision_id="d-ev-6",
            session_id="s-1",
            in_reply_to="ev-6",
            verdict=Verdict.APPEND_ONCE,
            reason=Reason.UNCHANGED,
            fence_token=42,
            fence=Fence.STORE_ENFORCED,
            holder="runner-b",
            classification=Classification.UNCHANGED,
            operator_action=None,
            alert=False,
            final=True,
            event_time_ms=T0 + 3,
            trail=[
                TrailEntry(step="observed", detail="tail of 2 digests"),
                TrailEntry(step="classification", detail="tail equals before"),
            ],
        ),
    },
    RecordType.DEAD_LETTER: {
        "minimal": lambda: DeadLetter(
            source_topic="reconciler.intents",
            source_partition=0,
            source_offset=0,
            reason=DecodeReason.EMPTY,
            detail="the record value is empty",
        ),
        "full": lambda: DeadLetter(
            source_topic="reconciler.acks",
            source_partition=3,
            source_offset=1234,
            source_timestamp_ms=T0,
            key=b"s-1",
            value=b"\xc3\x01\xff\x00garbage",
            reason=DecodeReason.UNKNOWN_SCHEMA,
            detail="schema fingerprint ff00... unknown",
            record_type="ack",
            key_length=3,
            key_sha256=_digest(3),
            value_length=3_000_000,
            value_sha256=_digest(4),
            truncated=True,
        ),
    },
    RecordType.SESSION_STATE: {
        "minimal": lambda: SessionState(session_id="s-1"),
        "full": lambda: SessionState(
            session_id="s-1",
            binding=BINDING_FULL,
            health=Health.AMBIGUOUS,
            health_reason=Reason.AMBIGUOUS,
            holder="runner-a",
            fence_token=41,
            lease_expires_ms=T0 + 60_000,
            grant_request_id="ev-0",
            grant_verdict=Verdict.APPEND_ONCE,
            granted_checkpoint_id="ck-0",
            progress_sequence=7,
            slot=IntentSlot(
                intent_id="in-2",
                runner_id="runner-a",
                sequence=7,
                held=False,
                status=SlotStatus.PENDING,
                before=[_digest(11), _digest(12)],
                items=[CALL, OUTPUT],
                persisted_count=2,
                committed_by_runner=True,
                partial_seen=True,
            ),
            previous_intent_id="in-1",
            parked_acks=[_ack_full()],
            parked_resumes=[ParkedResume(resume=_resume_full(), position=99)],
            recent_event_ids=["ev-1", "ev-2"],
        ),
    },
}


CAUSAL_SINCE = {
    RecordType.INTENT: 3,
    RecordType.ACK: 2,
    RecordType.RESUME: 3,
    RecordType.SESSION_STATE: 4,
}
"""The version of each record that carries the causal context (and, for the state, the
causal order: producer marks and inputs waiting for their causes)."""


def _causal(producer: str, seq: int, *after: tuple[str, int]) -> CausalContext:
    return CausalContext(
        producer=producer, seq=seq, after=[Cause(producer=p, seq=n) for p, n in after]
    )


def upgrade(record_type: RecordType, variant: str, model: WireModel, version: int) -> WireModel:
    """The ``full`` sample of a version sets the fields that version added (v1 samples stay)."""
    if variant != "full" or version < 2:
        return model
    if version >= CAUSAL_SINCE.get(record_type, version + 1):
        return _with_causes(record_type, upgrade(record_type, variant, model, version - 1))
    unstable = {"items_digest_stable": False}
    if isinstance(model, IntentEvent):
        return replace(model, binding=replace(model.binding, **unstable))
    if isinstance(model, ResumeEvent):
        return _resume_v2(model)
    if isinstance(model, Decision):
        return replace(model, runner_action=RunnerAction.STOP, reason=Reason.HISTORY_CHANGED)
    if isinstance(model, SessionState) and model.binding is not None:
        parked = [replace(p, resume=_resume_v2(p.resume)) for p in model.parked_resumes]
        return replace(
            model,
            binding=replace(model.binding, **unstable),
            health_reason=Reason.DIGEST_UNSTABLE,
            parked_resumes=parked,
            parked_intents=[
                upgrade(RecordType.INTENT, "full", SAMPLES[RecordType.INTENT]["full"](), version)
            ],
        )
    return model


def _with_causes(record_type: RecordType, model: WireModel) -> WireModel:
    """The causal fields set on a ``full`` sample of the version that added them."""
    if isinstance(model, IntentEvent):
        return replace(model, causal=_causal("runner-1", 3, ("runner-1", 2)))
    if isinstance(model, AckEvent):
        return replace(model, causal=_causal("store-1", 7, ("store-1", 6), ("runner-1", 3)))
    if isinstance(model, ResumeEvent):
        return replace(model, causal=_causal("runner-2", 0, ("runner-1", 4), ("store-1", 7)))
    if isinstance(model, SessionState):
        resume = _with_causes(RecordType.RESUME, model.parked_resumes[0].resume)
        ack = _with_causes(RecordType.ACK, model.parked_acks[0])
        intent = _with_causes(RecordType.INTENT, model.parked_intents[0])
        assert isinstance(resume, ResumeEvent)
        assert isinstance(ack, AckEvent)
        assert isinstance(intent, IntentEvent)
        return replace(
            model,
            parked_resumes=[replace(model.parked_resumes[0], resume=resume)],
            parked_acks=[ack],
            parked_intents=[intent],
            producers=[
                ProducerMark(producer="runner-1", seq=2, at_ms=1_700_000_000_000),
                ProducerMark(producer="store-1", seq=6, at_ms=1_700_000_000_100),
            ],
            causal_waiting=[
                CausalWait(ack=ack, position=12),
                CausalWait(resume=resume, position=13),
                CausalWait(intent=intent, position=14),
            ],
        )
    raise AssertionError(f"{record_type} has no causal fields")


def _resume_v2(resume: ResumeEvent) -> ResumeEvent:
    binding = replace(resume.binding, items_digest_stable=False)
    return replace(resume, binding=binding, checkpoint_session_id=resume.session_id)


def positive_fixtures() -> dict[Path, bytes]:
    """Every (type, version, variant) example as .avro and .json contents."""
    codec = Codec()
    files: dict[Path, bytes] = {}
    for record_type, policy in POLICY.items():
        for version in policy.supported:
            for variant, build in SAMPLES[record_type].items():
                model = upgrade(record_type, variant, build(), version)
                folder = CORPUS / record_type.value / f"v{version}"
                files[folder / f"{variant}.avro"] = codec.encode(model, version=version)
                if version == policy.current:
                    text = to_json(model, indent=2) + "\n"
                else:  # frozen: only the fields that version knows (the rest read as defaults)
                    schema = SHIPPED_SCHEMAS.get(record_type, version)
                    known = fields_of(schema, to_json_record(model))
                    text = json.dumps(known, indent=2, ensure_ascii=False) + "\n"
                files[folder / f"{variant}.json"] = text.encode()
    return files


def negative_fixtures() -> tuple[dict[Path, bytes], dict[str, dict[str, str]]]:
    """Broken records and the reason code the decoder must give for each."""
    codec = Codec()
    # The negatives were written by intent v1 and are frozen: they stay v1 records.
    intent = SHIPPED_SCHEMAS.get(RecordType.INTENT, NEGATIVE_WRITER_VERSION)
    full = codec.encode(SAMPLES[RecordType.INTENT]["full"](), version=NEGATIVE_WRITER_VERSION)
    raw = fields_of(intent, to_record(SAMPLES[RecordType.INTENT]["full"]()))
    wrong_fp = bytearray(full)
    wrong_fp[2] ^= 0xFF
    cases: dict[str, tuple[bytes, RecordType, DecodeReason]] = {
        "truncated_body": (full[:-5], RecordType.INTENT, DecodeReason.TRUNCATED),
        "truncated_header": (full[:6], RecordType.INTENT, DecodeReason.TRUNCATED),
        "trailing_bytes": (full + b"\x00", RecordType.INTENT, DecodeReason.TRAILING_BYTES),
        "wrong_fingerprint": (bytes(wrong_fp), RecordType.INTENT, DecodeReason.UNKNOWN_SCHEMA),
        "wrong_magic": (b"\x00" + full[1:], RecordType.INTENT, DecodeReason.BAD_MAGIC),
        "wrong_record_type": (full, RecordType.ACK, DecodeReason.WRONG_RECORD_TYPE),
        "unknown_enum": (
            codec.encode_record(intent, {**raw, "kind": UNRECOGNIZED_SYMBOL}),
            RecordType.INTENT,
            DecodeReason.UNKNOWN_ENUM_SYMBOL,
        ),
        "enum_index_out_of_range": (
            _with_enum_index(codec, raw),
            RecordType.INTENT,
            DecodeReason.MALFORMED_BODY,
        ),
        "oversize_batch": (
            codec.encode_record(intent, {**raw, "items": [raw["items"][0]] * 1001}),
            RecordType.INTENT,
            DecodeReason.LIMIT_EXCEEDED,
        ),
        "oversize_string": (
            codec.encode_record(intent, {**raw, "runner_id": "r" * 5000}),
            RecordType.INTENT,
            DecodeReason.LIMIT_EXCEEDED,
        ),
        "bad_digest": (
            codec.encode_record(intent, {**raw, "before": ["not-a-digest"]}),
            RecordType.INTENT,
            DecodeReason.INVALID_FIELDS,
        ),
        "type_confusion_ack_body": (
            full[:SINGLE_OBJECT_HEADER_SIZE]
            + codec.encode(SAMPLES[RecordType.ACK]["full"](), version=NEGATIVE_WRITER_VERSION)[
                SINGLE_OBJECT_HEADER_SIZE:
            ],
            RecordType.INTENT,
            DecodeReason.TRUNCATED,  # the shorter ack body runs out under the intent schema
        ),
        "empty_batch": (
            codec.encode_record(intent, {**raw, "items": []}),
            RecordType.INTENT,
            DecodeReason.INVALID_FIELDS,
        ),
        "negative_time": (
            codec.encode_record(intent, {**raw, "event_time_ms": -1}),
            RecordType.INTENT,
            DecodeReason.INVALID_FIELDS,
        ),
        "empty": (b"", RecordType.INTENT, DecodeReason.EMPTY),
    }
    files = {CORPUS / "negative" / f"{name}.bin": data for name, (data, _, _) in cases.items()}
    manifest = {
        name: {"record_type": rt.value, "reason": reason.value}
        for name, (_, rt, reason) in cases.items()
    }
    return files, manifest


def _with_enum_index(codec: Codec, raw: dict[str, object]) -> bytes:
    """The full intent with its `kind` enum index (first byte after 3 strings) set to 99."""
    schema = SHIPPED_SCHEMAS.get(RecordType.INTENT, NEGATIVE_WRITER_VERSION)
    body = bytearray(codec.encode_record(schema, raw)[SINGLE_OBJECT_HEADER_SIZE:])
    offset = 0
    for _ in range(2):  # event_id, session_id: zigzag length then bytes (short strings)
        offset += 1 + body[offset] // 2
    while body[offset] & 0x80:  # event_time_ms: zigzag varint
        offset += 1
    offset += 1
    body[offset] = 99 * 2  # zigzag(99), one byte
    return codec.framing.header_for(schema) + bytes(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, write nothing")
    args = parser.parse_args(argv)
    files = positive_fixtures()
    negatives, manifest = negative_fixtures()
    files.update(negatives)
    files[CORPUS / "negative" / "manifest.json"] = (
        json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    ).encode()
    drift = 0
    for path, content in sorted(files.items()):
        if path.exists():
            if path.read_bytes() != content:
                drift += 1
                print(f"differs (frozen, left as is): {path}")
            continue
        if args.check:
            drift += 1
            print(f"missing: {path}")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        print(f"wrote {path}")
    return 1 if drift and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
