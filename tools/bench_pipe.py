"""The raw exactly-once pipe `make bench` compares against: consume the three input topics,
produce one answer per input (its bytes, to the decisions topic) and one state record (to the
changelog), send the offsets, commit; no decoding, no fold, no state store. Runs until SIGTERM.

`python -m tools.bench_pipe --bootstrap-servers B --topic-prefix P --commit-ms 100`
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
import uuid
from types import FrameType

from confluent_kafka import Consumer, Message, Producer

from engine.settings import load_settings


def _produce(producer: Producer, topic: str, message: Message, value: bytes) -> None:
    while True:
        try:
            producer.produce(
                topic, key=message.key(), value=value, partition=message.partition() or 0
            )
            return
        except BufferError:  # the local queue is full between two commits: wait for deliveries
            producer.poll(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic-prefix", required=True)
    parser.add_argument("--commit-ms", type=int, default=100)
    parser.add_argument(
        "--commit-drained", action="store_true", help="also commit once a poll found no more"
    )
    args = parser.parse_args()
    settings = load_settings(
        environ={}, bootstrap_servers=args.bootstrap_servers, topic_prefix=args.topic_prefix
    )
    topics = settings.topics
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"{args.topic_prefix}pipe",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
    )
    consumer.subscribe(list(topics.inputs))
    producer = Producer(
        settings.client_config(
            **{"transactional.id": f"pipe-{uuid.uuid4().hex[:8]}", "linger.ms": 5}
        )
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    pending, last_commit = 0, time.monotonic()
    while not stopping.is_set():
        # As the engine polls: consume(n, timeout) would wait for n records or the timeout.
        messages = consumer.consume(1000, timeout=0)
        if not messages:
            messages = consumer.consume(1, timeout=0.05)
            if messages:
                messages += consumer.consume(999, timeout=0)
        drained = len(messages) < 1000
        for message in messages:
            if message.error() is not None:
                continue
            _produce(producer, topics.decisions, message, message.value() or b"")
            _produce(producer, topics.changelog, message, b"state")
            pending += 1
        due = time.monotonic() - last_commit >= args.commit_ms / 1000
        if pending and (due or (args.commit_drained and drained)):
            producer.flush(30)  # as the engine does before it sends the offsets
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
            producer.begin_transaction()
            pending, last_commit = 0, time.monotonic()
    producer.abort_transaction(30)
    consumer.close()


if __name__ == "__main__":
    main()
