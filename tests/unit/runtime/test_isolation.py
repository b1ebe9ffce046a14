"""No single input stops a partition (fake clients): a fold that raises, an event time of
2^63-1, a 3 MB value and a 2.5 MB key each become one bounded dead letter, and every other
input of the same partitions is answered exactly once, in the same engine process."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest
from msgspec.structs import replace

from engine.core import fold as fold_module
from engine.core.events import AnswerSuffix, Decision, Event
from engine.core.fold import FoldResult
from engine.core.state import SessionState
from engine.runtime import restorer
from engine.runtime.tasks import state_codec
from engine.runtime.tasks import task as task_module
from engine.runtime.tasks.state import TaskState
from engine.runtime.tasks.store import LocalStore
from engine.runtime.tasks.task import PartitionTask
from engine.settings import Settings
from engine.wire import DeadLetter, DecodeReason, RecordType
from engine.wire.dead_letter import EXCERPT_BYTES
from tests.integration.engine_harness import CODEC
from tests.unit.runtime.fakes import Crash, FakeBroker, Faults
from tests.unit.runtime.test_faults import EVENTS, PARTITIONS, _broker, _run_until_done, _settings


def _decided(broker: FakeBroker, settings: Settings) -> Counter[str]:
    ids: Counter[str] = Counter()
    for p in range(PARTITIONS):
        for record in broker.log(settings.topics.decisions, p):
            decision = CODEC.decode(RecordType.DECISION, record.value)
            assert isinstance(decision, Decision)
            ids[decision.decision_id] += 1
    return ids


def _letters(broker: FakeBroker, settings: Settings) -> list[DeadLetter]:
    letters = []
    for p in range(PARTITIONS):
        for record in broker.log(settings.topics.dead_letters, p):
            letter = CODEC.decode(RecordType.DEAD_LETTER, record.value)
            assert isinstance(letter, DeadLetter)
            letters.append(letter)
    return letters


def _assert_others_answered_once(broker: FakeBroker, settings: Settings, bad: set[str]) -> None:
    decided = _decided(broker, settings)
    # A parked input is answered twice (its first answer, then `/final`): count inputs, not ids.
    answered = {decision_id.removesuffix(AnswerSuffix.FINAL) for decision_id in decided}
    assert answered == {e.event_id for e in EVENTS} - bad
    assert answered <= set(decided), "a /final answer without its first answer"
    assert max(decided.values()) == 1
    assert broker.clients_created == 1, "one process, no rejoin"
    assert broker.aborts == 0


def test_an_input_whose_fold_raises_is_dead_lettered_and_the_partition_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path)
    victim: Event = EVENTS[7]
    real = fold_module.fold

    def fold(state: SessionState | None, event: Event, offset: int) -> FoldResult:
        if event.event_id == victim.event_id:
            raise OverflowError("lease arithmetic overflowed")
        return real(state, event, offset)

    def task(partition: int, store: LocalStore, cache: int, state: TaskState) -> PartitionTask:
        return PartitionTask(partition, store, cache, state, folder=fold)  # every task made

    monkeypatch.setattr(restorer, "PartitionTask", task)
    broker = _broker(settings, Faults())
    assert _run_until_done(settings, broker) == 1
    _assert_others_answered_once(broker, settings, {victim.event_id})
    (letter,) = _letters(broker, settings)
    assert letter.reason is DecodeReason.PROCESSING_FAILED
    assert letter.detail.startswith("OverflowError: lease arithmetic")
    assert letter.value == CODEC.encode(victim)


def test_an_event_time_of_2_63_minus_1_is_refused_at_decode(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    victim = replace(EVENTS[3], event_id="far-future", event_time_ms=2**63 - 1)
    broker = _broker(settings, Faults())
    broker.append(
        settings.topics.topic_for(victim), victim.session_id.encode(), CODEC.encode(victim)
    )
    assert _run_until_done(settings, broker) == 1
    _assert_others_answered_once(broker, settings, set())
    (letter,) = _letters(broker, settings)
    assert letter.reason is DecodeReason.INVALID_FIELDS
    assert "event_time_ms" in letter.detail


def test_huge_records_get_a_bounded_dead_letter(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    broker = _broker(settings, Faults())
    big_value = b"v" * 3_000_000
    big_key = b"k" * 2_500_000
    broker.append(settings.topics.intents, b"session-x", big_value, partition=0)
    broker.append(settings.topics.acks, big_key, b"\x00", partition=1)
    assert _run_until_done(settings, broker) == 1
    _assert_others_answered_once(broker, settings, set())
    letters = {letter.source_partition: letter for letter in _letters(broker, settings)}
    value_letter, key_letter = letters[0], letters[1]
    assert value_letter.truncated
    assert value_letter.value == big_value[:EXCERPT_BYTES]
    assert value_letter.value_length == len(big_value)
    assert value_letter.value_sha256 == hashlib.sha256(big_value).hexdigest()
    assert key_letter.truncated
    assert key_letter.key == big_key[:EXCERPT_BYTES]
    assert key_letter.key_length == len(big_key)
    assert key_letter.key_sha256 == hashlib.sha256(big_key).hexdigest()
    for letter in (value_letter, key_letter):
        assert len(CODEC.encode(letter)) < 4 * EXCERPT_BYTES


def _victim_with_a_later_input() -> Event:
    """An intent whose session has more inputs after it (they fold on the state before it)."""
    for event in EVENTS:
        if event.event_id.endswith("/e1"):
            return event
    raise AssertionError("the workload has no intent")


def test_a_state_that_fails_to_encode_at_step_3_dead_letters_only_the_input_behind_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """States are encoded once per transaction, at step 3. One that cannot be encoded aborts
    that transaction; folded again, its session is encoded input by input, so exactly the
    input that broke it is dead-lettered and every other input, of its session too, is
    answered once (the aborted transaction's outputs never became visible)."""
    settings = _settings(tmp_path)
    victim = _victim_with_a_later_input()
    real = state_codec.encode_state
    calls: Counter[str] = Counter()

    def encode_state(state: SessionState) -> bytes:
        calls[state.session_id] += 1
        if broker.aborts > 1:  # aborting again and again: end the process (bounded run)
            raise Crash("step 3 failed again after the abort")
        if victim.event_id in state.recent_event_ids:
            raise OverflowError("a field beyond its Avro range")
        return real(state)

    monkeypatch.setattr(task_module, "encode_state", encode_state)
    broker = _broker(settings, Faults())
    assert _run_until_done(settings, broker) == 1
    decided = _decided(broker, settings)
    answered = {decision_id.removesuffix(AnswerSuffix.FINAL) for decision_id in decided}
    assert answered == {e.event_id for e in EVENTS} - {victim.event_id}
    assert max(decided.values()) == 1
    assert broker.aborts == 1, "one abort: the transaction whose step 3 failed"
    (letter,) = _letters(broker, settings)
    assert letter.reason is DecodeReason.PROCESSING_FAILED
    assert letter.detail.startswith("OverflowError: a field beyond its Avro range")
    assert letter.value == CODEC.encode(victim)
    later = [e for e in EVENTS if e.session_id == victim.session_id and e != victim]
    assert later, "the victim's session has other inputs, answered on the state before it"
    assert calls[victim.session_id] >= 2, "encoded at step 3, then again input by input"


def test_a_state_is_encoded_once_per_transaction_not_once_per_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every changelog record's bytes come from one encode at step 3; a session folded many
    times in one transaction is encoded once (the workload fits one transaction per batch)."""
    settings = _settings(tmp_path)
    real = state_codec.encode_state
    encodes = 0

    def encode_state(state: SessionState) -> bytes:
        nonlocal encodes
        encodes += 1
        return real(state)

    monkeypatch.setattr(task_module, "encode_state", encode_state)
    broker = _broker(settings, Faults())
    assert _run_until_done(settings, broker) == 1
    changelog = sum(len(broker.log(settings.topics.changelog, p)) for p in range(PARTITIONS))
    assert encodes == changelog
    assert encodes < len(EVENTS)
