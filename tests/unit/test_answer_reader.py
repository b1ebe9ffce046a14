"""The bench client's partial read of a decision agrees with the full decode on every decision
of the bench's own mix, in every shipped decision version."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from engine.core.events import Reason
from engine.wire import Codec, RecordType
from engine.wire.schema_store import ShippedSchema
from tools.answer_reader import AnswerReader, UnsupportedDecisionSchemaError, _plan
from tools.bench_fold import build_log, fold_all

CODEC = Codec()


def _full(value: bytes) -> str | None:
    record = CODEC.decode_record(RecordType.DECISION, value)
    final = record["final"] and record["reason"] != Reason.PARKED
    return str(record["in_reply_to"]) if final else None


def test_final_answers_match_the_full_decode_in_every_decision_version() -> None:
    events = build_log(400)
    decisions, _ = fold_all(events, commit_every=50)
    reader = AnswerReader()
    versions = CODEC.store.policy[RecordType.DECISION].supported
    assert len(versions) >= 2
    for version in versions:
        answers = []
        for decision in decisions:
            value = CODEC.encode(decision, version=version)
            assert reader.final_answer(value) == _full(value)
            answers.append(reader.final_answer(value))
        finals = Counter(a for a in answers if a is not None)
        # The mix has deferred (PARKED, non-final) answers too, and each input one final answer.
        assert len(finals) < len(decisions)
        assert finals == Counter({e.event_id: 1 for e in events})


@pytest.mark.parametrize("version", CODEC.store.policy[RecordType.DECISION].supported)
def test_a_decision_schema_with_final_before_reason_is_refused(version: int) -> None:
    shipped = next(
        s
        for s in CODEC.store.by_fingerprint.values()
        if s.record_type == RecordType.DECISION and s.version == version
    )
    fields = list(shipped.source["fields"])
    final = next(f for f in fields if f["name"] == "final")
    fields.remove(final)
    fields.insert([f["name"] for f in fields].index("reason"), final)
    reordered = replace(shipped, source={**shipped.source, "fields": fields})
    with pytest.raises(UnsupportedDecisionSchemaError, match="`final` before `reason`"):
        _plan(reordered)
    plan, parked = _plan(shipped)  # the shipped order still reads
    assert plan[-1][0] == "final"
    assert parked == list(_reason_symbols(shipped)).index(Reason.PARKED.value)


def _reason_symbols(shipped: ShippedSchema) -> list[str]:
    reason = next(f for f in shipped.source["fields"] if f["name"] == "reason")
    return list(reason["type"]["symbols"])
