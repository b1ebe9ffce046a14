"""The generated readers check a digest on its bytes (64 long, nothing left once the lowercase
hex digits are deleted) instead of decoding it and matching `DIGEST_PATTERN`. Every digest that
pattern refuses must still be declined, end to end through `Codec.decode`, and still reach the
dead letters with the reason and message of the reference path (fastavro, then msgspec)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.events import Binding, IntentEvent, IntentKind, ItemFacts
from engine.wire import (
    MODEL_OF,
    Codec,
    DeadLetter,
    DecodeError,
    DecodeReason,
    RecordType,
    SourcePosition,
)
from engine.wire.avro_gen import reader_for
from engine.wire.framing import SINGLE_OBJECT_HEADER_SIZE
from engine.wire.limits import DEFAULT_LIMITS

GOOD = "0123456789abcdef" * 4
BAD = {
    "uppercase": GOOD.upper(),
    "63 long": GOOD[:63],
    "65 long": GOOD + "0",
    "non-hex": GOOD[:63] + "g",
    "non-ascii, 64 bytes": GOOD[:62] + "é",
    "newline after 64": GOOD + "\n",
    "empty": "",
}
POSITION = SourcePosition("reconciler.intents", 0, 7)


def _intent(before: list[str], item_digest: str = GOOD) -> IntentEvent:
    # Built without validation (msgspec checks patterns only when decoding), as a faulty
    # producer would send it.
    return IntentEvent(
        event_id="e",
        session_id="s",
        event_time_ms=5,
        kind=IntentKind.REGISTER,
        intent_id="i",
        runner_id="r",
        binding=Binding(backend_id="b", namespace="n"),
        before=before,
        items=[ItemFacts(digest=item_digest, item_type="message")],
        sequence=1,
    )


def _refusal(codec: Codec, data: bytes) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        codec.decode(RecordType.INTENT, data, source=POSITION)
    return caught.value


def _generated_read(data: bytes) -> Any:
    schema = Codec().store.current(RecordType.INTENT)
    read = reader_for(schema.parsed, MODEL_OF[RecordType.INTENT], DEFAULT_LIMITS)
    return read(data[SINGLE_OBJECT_HEADER_SIZE:])


@pytest.mark.parametrize("where", ["before", "item"])
@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_a_bad_digest_is_declined_and_dead_lettered_as_before(where: str, bad: str) -> None:
    model = _intent([GOOD, bad]) if where == "before" else _intent([GOOD], item_digest=bad)
    data = Codec().encode(model)
    assert _generated_read(data) is None  # the generated reader declines it itself
    generated = _refusal(Codec(), data)
    reference = _refusal(Codec(generated=False), data)
    assert generated.reason is DecodeReason.INVALID_FIELDS
    assert (generated.reason, generated.message) == (reference.reason, reference.message)
    letter = DeadLetter.from_error(generated, POSITION, key=b"s", value=data)
    assert letter.reason.value == DecodeReason.INVALID_FIELDS.value


def test_a_digest_that_is_not_utf8_is_declined_like_the_reference() -> None:
    data = Codec().encode(_intent([GOOD]))
    at = data.index(GOOD.encode())
    broken = data[:at] + b"\xff" * 64 + data[at + 64 :]
    assert _generated_read(broken) is None
    generated = _refusal(Codec(), broken)
    reference = _refusal(Codec(generated=False), broken)
    assert (generated.reason, generated.message) == (reference.reason, reference.message)


def test_a_good_digest_still_reads_through_the_generated_reader() -> None:
    model = _intent([GOOD])
    data = Codec().encode(model)
    assert _generated_read(data) == model
    assert Codec().decode(RecordType.INTENT, data) == model
