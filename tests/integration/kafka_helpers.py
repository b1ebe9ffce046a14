"""Small helpers for tests against the real broker."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, Message
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(bootstrap: str, name: str, partitions: int = 1, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config)])
    for future in futures.values():
        future.result(timeout=30)


def drain(
    consumer: Consumer, expected: int, timeout_s: float = 20.0, idle_s: float = 2.0
) -> list[Message]:
    """Consume until `expected` records arrived and then `idle_s` passed with nothing new,
    or until `timeout_s`: a too-many result is seen, not hidden."""
    import time

    records: list[Message] = []
    deadline = time.monotonic() + timeout_s
    last_new = time.monotonic()
    while time.monotonic() < deadline:
        batch = consumer.consume(num_messages=500, timeout=0.2)
        for message in batch:
            if message.error() is not None:
                raise KafkaException(message.error())
            records.append(message)
        if batch:
            last_new = time.monotonic()
        elif len(records) >= expected and time.monotonic() - last_new > idle_s:
            break
    return records
