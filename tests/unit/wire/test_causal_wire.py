"""The causal context on the wire (intent v3, ack v2, resume v3): round trips on both paths,
older writers read as null, and bad contexts are refused with a reason, never folded."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from engine.core.events import AckEvent, AckOutcome, CausalContext, Cause, IntentEvent, ResumeEvent
from engine.wire import Codec, DecodeError, DecodeReason, RecordType
from engine.wire.validation import MAX_CAUSES
from tests.unit.core.builders import ack, intent, msg, record, resume

CONTEXT = CausalContext(
    producer="r2", seq=0, after=[Cause(producer="r1", seq=4), Cause(producer="store", seq=2)]
)
EVENTS: dict[RecordType, IntentEvent | AckEvent | ResumeEvent] = {
    RecordType.INTENT: replace(intent("e1", [msg("a")], []), causal=CONTEXT),
    RecordType.ACK: replace(ack("e2", AckOutcome.COMMITTED), causal=CONTEXT),
    RecordType.RESUME: replace(resume("e3", record([msg("a")], []), []), causal=CONTEXT),
}
OLDER = {RecordType.INTENT: 2, RecordType.ACK: 1, RecordType.RESUME: 2}


@pytest.mark.parametrize("generated", [True, False])
@pytest.mark.parametrize("record_type", list(EVENTS))
def test_the_context_round_trips_and_an_older_writer_reads_as_null(
    record_type: RecordType, generated: bool
) -> None:
    codec = Codec(generated=generated)
    event = EVENTS[record_type]
    assert codec.decode(record_type, codec.encode(event)) == event
    older = codec.decode(record_type, codec.encode(event, version=OLDER[record_type]))
    assert older == replace(event, causal=None)


@pytest.mark.parametrize("generated", [True, False])
@pytest.mark.parametrize(
    ("context", "reason"),
    [
        (CausalContext(producer=" ", seq=0), DecodeReason.INVALID_FIELDS),
        (CausalContext(producer="r", seq=-1), DecodeReason.INVALID_FIELDS),
        (
            CausalContext(producer="r", seq=1, after=[Cause(producer="", seq=0)]),
            DecodeReason.INVALID_FIELDS,
        ),
        (
            CausalContext(producer="r", seq=1, after=[Cause(producer="x", seq=2**53)]),
            DecodeReason.INVALID_FIELDS,
        ),
        (
            CausalContext(
                producer="r",
                seq=1,
                after=[Cause(producer="x", seq=n) for n in range(MAX_CAUSES + 1)],
            ),
            DecodeReason.LIMIT_EXCEEDED,
        ),
    ],
)
def test_a_bad_context_is_refused_with_a_reason(
    context: CausalContext, reason: DecodeReason, generated: bool
) -> None:
    codec = Codec(generated=generated)
    data = codec.encode(replace(EVENTS[RecordType.RESUME], causal=context))
    with pytest.raises(DecodeError) as refused:
        codec.decode(RecordType.RESUME, data)
    assert refused.value.reason is reason
