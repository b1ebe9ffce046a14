"""The broker the project runs supports what the engine is built on: EOS transactions.

A transactional consume-transform-produce round trip is seen exactly once by a read_committed
consumer, and records of an aborted transaction are never seen by it (but are by read_uncommitted,
which proves they were written).
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.kafka_helpers import create_topic, drain

pytestmark = pytest.mark.kafka


def _producer(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "transaction.timeout.ms": 10_000,
        }
    )
    producer.init_transactions(30)
    return producer


def _consumer(bootstrap: str, group: str, isolation: str = "read_committed") -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def test_consume_transform_produce_is_seen_exactly_once(
    kafka_bootstrap: str, unique_name: str
) -> None:
    source, sink = f"{unique_name}-in", f"{unique_name}-out"
    create_topic(kafka_bootstrap, source)
    create_topic(kafka_bootstrap, sink)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(50):
        plain.produce(source, key=f"s{i % 5}", value=f"event-{i}")
    assert plain.flush(30) == 0

    worker = _consumer(kafka_bootstrap, f"{unique_name}-worker")
    worker.subscribe([source])
    producer = _producer(kafka_bootstrap, f"{unique_name}-txn")
    inputs = drain(worker, expected=50)
    assert len(inputs) == 50
    producer.begin_transaction()
    for message in inputs:
        producer.produce(sink, key=message.key(), value=b"decided:" + (message.value() or b""))
    producer.send_offsets_to_transaction(
        worker.position(worker.assignment()), worker.consumer_group_metadata(), 30
    )
    producer.commit_transaction(30)

    committed = worker.committed([TopicPartition(source, 0)], timeout=10)
    assert committed[0].offset == 50  # the input offsets rode in the same transaction
    worker.close()

    reader = _consumer(kafka_bootstrap, f"{unique_name}-reader")
    reader.subscribe([sink])
    outputs = drain(reader, expected=50)
    reader.close()
    values = sorted((m.value() or b"").decode() for m in outputs)
    assert values == sorted(f"decided:event-{i}" for i in range(50))


def test_aborted_transaction_is_never_seen_by_read_committed(
    kafka_bootstrap: str, unique_name: str
) -> None:
    topic = f"{unique_name}-out"
    create_topic(kafka_bootstrap, topic)
    producer = _producer(kafka_bootstrap, f"{unique_name}-txn")
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, key="s", value=f"aborted-{i}")
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, key="s", value="committed-0")
    producer.commit_transaction(30)

    committed_reader = _consumer(kafka_bootstrap, f"{unique_name}-rc")
    committed_reader.subscribe([topic])
    seen = [(m.value() or b"").decode() for m in drain(committed_reader, expected=1)]
    committed_reader.close()
    assert seen == ["committed-0"]

    dirty_reader = _consumer(kafka_bootstrap, f"{unique_name}-ru", isolation="read_uncommitted")
    dirty_reader.subscribe([topic])
    dirty = [(m.value() or b"").decode() for m in drain(dirty_reader, expected=11)]
    dirty_reader.close()
    assert sorted(dirty) == sorted([f"aborted-{i}" for i in range(10)] + ["committed-0"])
