"""With Kafka: no single input stops a partition, and a fenced producer rejoins.

After a record with event time 2^63-1, a 3 MB value and a 2.5 MB key (both zstd-compressed, so
the broker accepts them), or after the engine's producer is fenced, decisions for the other
sessions keep flowing from the same process, and nothing is lost or duplicated.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer
from msgspec.structs import replace

from engine.core.events import AckEvent
from engine.wire import DecodeReason
from engine.wire.dead_letter import EXCERPT_BYTES
from engine.wire.partitioner import partition_for
from tests.integration.engine_harness import (
    CODEC,
    EngineProcess,
    engine_settings,
    produce,
    read_dead_letters,
    read_decisions,
)
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload

pytestmark = pytest.mark.kafka


def _produce_big(bootstrap: str, topic: str, key: bytes, value: bytes, partitions: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "zstd",
            "message.max.bytes": 10_000_000,
        }
    )
    producer.produce(topic, key=key, value=value, partition=partition_for(key, partitions))
    assert producer.flush(30) == 0


def test_bad_and_huge_inputs_do_not_stop_their_partitions(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    events = workload(60, seed=41)
    far_future = replace(events[0], event_id="far-future", event_time_ms=2**63 - 1)
    engine = EngineProcess(settings, tmp_path / "engine.log").start()
    try:
        produce(kafka_bootstrap, settings, events[:90])
        produce(kafka_bootstrap, settings, [far_future])
        _produce_big(kafka_bootstrap, settings.topics.intents, b"big-value", b"v" * 3_000_000, 3)
        ack = CODEC.encode(next(e for e in events if isinstance(e, AckEvent)))
        _produce_big(kafka_bootstrap, settings.topics.acks, b"k" * 2_500_000, ack, 3)
        produce(kafka_bootstrap, settings, events[90:])
        seen = read_decisions(kafka_bootstrap, settings, until=len(events), timeout_s=120)
        letters = read_dead_letters(kafka_bootstrap, settings, until=3)
        assert engine.terminate() == 0
    finally:
        if engine.alive():
            engine.kill_all()
    assert_exactly_once(events, seen, read_inputs(kafka_bootstrap, settings))
    assert "far-future" not in {s.decision.decision_id for s in seen}
    # The far-future intent (range), the 3 MB value (size), the 2.5 MB key (not the session id).
    assert sorted(letter.reason for letter in letters) == sorted(
        [DecodeReason.INVALID_FIELDS, DecodeReason.OVERSIZE, DecodeReason.INVALID_FIELDS]
    )
    by_size = {letter.value_length: letter for letter in letters}
    assert by_size[3_000_000].truncated
    assert len(by_size[3_000_000].value or b"") == EXCERPT_BYTES
    (big_key,) = [letter for letter in letters if letter.key_length == 2_500_000]
    assert big_key.truncated
    assert len(big_key.key or b"") == EXCERPT_BYTES
    log = (tmp_path / "engine.log").read_text()
    assert "restart #" not in log, "no input may crash the engine"


def test_a_fenced_producer_rejoins_instead_of_exiting(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    events = workload(60, seed=43)
    engine = EngineProcess(settings, tmp_path / "engine.log").start()
    try:
        produce(kafka_bootstrap, settings, events[:80])
        read_decisions(kafka_bootstrap, settings, until=80, timeout_s=120, idle_s=0.5)
        intruder = Producer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "transactional.id": f"{settings.group_id}-{settings.instance_id}",
            }
        )
        intruder.init_transactions(30)  # a newer epoch: the engine's producer is fenced
        produce(kafka_bootstrap, settings, events[80:])
        seen = read_decisions(kafka_bootstrap, settings, until=len(events), timeout_s=120)
        assert engine.terminate() == 0
    finally:
        if engine.alive():
            engine.kill_all()
    assert_exactly_once(events, seen, read_inputs(kafka_bootstrap, settings))
    log = (tmp_path / "engine.log").read_text()
    assert "rejoining" in log, "the fence was never noticed"
    assert "restart #" not in log, "a fence must rejoin in the same process, not exit"
