"""Engine benchmark against the local broker (`make bench`); prints figures, asserts nothing.

1. throughput: inputs answered per second (each counted at its final answer) exactly-once by
   one `reconciler run` process on a pre-produced realistic mix (per session: intent, ack,
   resume), against
2. the ceiling: the same consume -> produce (one output + one changelog record per input) ->
   send offsets -> commit loop with no decoding and no fold, on the same records;
3. resume-to-decision latency (p50/p99) at a fixed resume rate with background intents;
4. restore: 1,000,000 session states written to a changelog partition, rebuilt into an empty
   local store (time, resident memory), then a restart with the local store intact (delta only).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from engine.admin.topics import create_topics
from engine.core.events import Event, Reason, ResumeEvent
from engine.core.fold import replay
from engine.core.state import SessionState
from engine.runtime.restore import restore_partition
from engine.runtime.state_codec import encode_state
from engine.runtime.store import LocalStore
from engine.settings import Settings, load_settings
from engine.wire import Codec, RecordType
from tools.bench_fold import BINDING, build_log, session_events

CODEC = Codec()


def produce_all(settings: Settings, events: list[Event]) -> None:
    producer = Producer(settings.client_config(partitioner="murmur2_random", **{"linger.ms": 20}))
    for n, event in enumerate(events):
        while True:
            try:
                producer.produce(
                    settings.topics.topic_for(event),
                    key=event.session_id.encode(),
                    value=CODEC.encode(event),
                )
                break
            except BufferError:
                producer.poll(0.1)
        if n % 5000 == 0:
            producer.poll(0)
    producer.flush(120)


def fresh_settings(bootstrap: str, commit_ms: int) -> Settings:
    prefix = f"bench-{uuid.uuid4().hex[:6]}."
    settings = load_settings(
        environ={},
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        partitions=3,
        group_id=f"{prefix}engine",
        commit_interval_ms=commit_ms,
        state_dir=Path(tempfile.mkdtemp()),
        metrics_port=19464,
    )
    create_topics(settings)
    return settings


def start_engine(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    for name in (
        "bootstrap_servers",
        "topic_prefix",
        "partitions",
        "group_id",
        "state_dir",
        "commit_interval_ms",
        "metrics_port",
    ):
        env[f"RECONCILER_{name.upper()}"] = str(getattr(settings, name))
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "run"],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{settings.metrics_port}/readyz", timeout=1
            ):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"engine did not become ready; see {log}")


def wait_answered(
    settings: Settings, inputs: set[str], timeout_s: float = 600
) -> tuple[float, int]:
    """When every input has its final answer, and how many decisions it took.

    An input counts once, at its final answer: not at a PARKED record or a DEFERRED answer
    (non-final), which the engine gives to inputs that arrive before the intent they name.
    Counting decisions instead would overstate throughput by those extra answers.
    """
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"count-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
    )
    consumer.subscribe([settings.topics.decisions])
    waiting, decisions = set(inputs), 0
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        for message in consumer.consume(5000, timeout=0.5):
            if message.error() is not None:
                continue
            decisions += 1
            decision = CODEC.decode_record(RecordType.DECISION, message.value() or b"")
            if decision["final"] and decision["reason"] != Reason.PARKED:
                waiting.discard(str(decision["in_reply_to"]))
    consumer.close()
    if waiting:
        raise SystemExit(f"{len(waiting)} inputs had no final answer within {timeout_s:.0f} s")
    return time.monotonic(), decisions


def bench_throughput(bootstrap: str, sessions: int) -> tuple[float, Settings, int]:
    settings = fresh_settings(bootstrap, commit_ms=200)
    events = build_log(sessions)
    produce_all(settings, events)
    log = Path(tempfile.mkdtemp()) / "engine.log"
    started = time.monotonic()
    engine = start_engine(settings, log)
    ready = time.monotonic()
    done, decisions = wait_answered(settings, {event.event_id for event in events})
    engine.terminate()
    engine.wait(60)
    print(f"  engine start to ready: {ready - started:.1f}s")
    per_input, in_order = decisions / len(events), len(replay(events)) / len(events)
    print(f"  decisions per input: {per_input:.2f} (folded in log order: {in_order:.2f})")
    return len(events) / (done - ready), settings, len(events)


def _produce(producer: Producer, topic: str, **record: Any) -> None:
    """produce(), waiting for deliveries while librdkafka's local queue is full (BufferError:
    a fast consume loop fills it between two commits)."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:
            producer.poll(0.05)


def bench_ceiling(settings: Settings, total: int) -> float:
    """Same records, same transaction cadence; no decoding, no fold, no state store."""
    sink = f"{settings.topic_prefix}ceiling-sink"
    admin = AdminClient(settings.client_config())  # must outlive its futures
    admin.create_topics([NewTopic(sink, 3, 1)])[sink].result()
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"ceiling-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
    )
    consumer.subscribe(list(settings.topics.inputs))
    producer = Producer(
        settings.client_config(
            **{"transactional.id": f"ceiling-{uuid.uuid4().hex[:6]}", "linger.ms": 5}
        )
    )
    producer.init_transactions(30)
    done, started, last_commit = 0, 0.0, time.monotonic()
    producer.begin_transaction()
    while done < total:
        for message in consumer.consume(1000, timeout=0.2):
            if message.error() is not None:
                continue
            if not started:
                started = time.monotonic()
            _produce(producer, sink, key=message.key(), value=message.value())
            _produce(
                producer,
                sink,
                key=message.key(),
                value=b"state",
                partition=message.partition() or 0,
            )
            done += 1
        if time.monotonic() - last_commit > 0.2:
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
            producer.begin_transaction()
            last_commit = time.monotonic()
    producer.send_offsets_to_transaction(
        consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
    )
    producer.commit_transaction(30)
    elapsed = time.monotonic() - started
    consumer.close()
    return total / elapsed


def bench_latency(bootstrap: str, rate: int, seconds: int, commit_ms: int) -> tuple[float, float]:
    settings = fresh_settings(bootstrap, commit_ms=commit_ms)
    engine = start_engine(settings, Path(tempfile.mkdtemp()) / "engine.log")
    latencies: list[float] = []
    stop = threading.Event()

    def read() -> None:
        consumer = Consumer(
            settings.client_config(
                **{
                    "group.id": f"lat-{uuid.uuid4().hex[:6]}",
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "latest",
                    "fetch.wait.max.ms": 10,
                }
            )
        )
        consumer.subscribe([settings.topics.decisions])
        while not stop.is_set():
            for message in consumer.consume(1000, timeout=0.1):
                if message.error() is None:
                    decision = CODEC.decode_record(RecordType.DECISION, message.value() or b"")
                    if str(decision["in_reply_to"]).startswith("lat-"):
                        latencies.append(time.time() * 1000 - decision["event_time_ms"])
        consumer.close()

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(3)  # the reader joins its group
    producer = Producer(settings.client_config(**{"partitioner": "murmur2_random", "linger.ms": 1}))
    interval = 1.0 / rate
    next_at = time.monotonic()
    for n in range(rate * seconds):
        now_ms = int(time.time() * 1000)
        sid = f"lat-{n}"
        resume = ResumeEvent(
            event_id=f"lat-{n}",
            session_id=sid,
            event_time_ms=now_ms,
            runner_id="r",
            checkpoint_id="c",
            binding=BINDING,
        )
        producer.produce(settings.topics.resumes, key=sid.encode(), value=CODEC.encode(resume))
        background = session_events(n)[0]  # one intent per resume as load
        producer.produce(
            settings.topics.intents,
            key=background.session_id.encode(),
            value=CODEC.encode(background),
        )
        producer.poll(0)
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    producer.flush(30)
    time.sleep(3)
    stop.set()
    reader.join()
    engine.terminate()
    engine.wait(60)
    latencies.sort()
    if not latencies:
        raise SystemExit("no latency samples")
    return latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


def bench_restore(bootstrap: str, sessions: int) -> None:
    settings = fresh_settings(bootstrap, commit_ms=200)
    changelog = f"{settings.topic_prefix}restore-changelog"
    admin = AdminClient(settings.client_config())  # must outlive its futures
    created = admin.create_topics([NewTopic(changelog, 1, 1, config={"cleanup.policy": "compact"})])
    created[changelog].result()
    producer = Producer(settings.client_config(**{"linger.ms": 50, "batch.size": 1_000_000}))
    value = encode_state(SessionState(session_id="x" * 12))
    for n in range(sessions):
        while True:
            try:
                producer.produce(
                    changelog, key=f"session-{n:09d}".encode(), value=value, partition=0
                )
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(300)
    store_dir = Path(tempfile.mkdtemp())
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    store = LocalStore(store_dir / "p0.sqlite")
    full = restore_partition(settings.client_config(), changelog, 0, store, timeout_s=1800)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    store.close()
    store = LocalStore(store_dir / "p0.sqlite")
    delta = restore_partition(settings.client_config(), changelog, 0, store)
    size_mb = (store_dir / "p0.sqlite").stat().st_size / 1e6
    print(
        f"  full rebuild of {full.records:,} sessions: {full.seconds:.1f}s "
        f"({full.records / full.seconds:,.0f}/s); store {size_mb:.0f} MB on disk"
    )
    print(
        f"  max RSS of this process: {rss_before / 1024:.0f} MB before, "
        f"{rss_after / 1024:.0f} MB after the rebuild"
    )
    print(f"  restart with the local store intact: {delta.records} records in {delta.seconds:.2f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--sessions", type=int, default=20_000, help="for the throughput run")
    parser.add_argument("--restore-sessions", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=1_000, help="resumes/s for the latency run")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--only", choices=["throughput", "latency", "restore"])
    args = parser.parse_args()
    if args.only in (None, "throughput"):
        print(f"throughput ({args.sessions:,} sessions x 3 events, 3 partitions, 1 engine):")
        folded, settings, total = bench_throughput(args.bootstrap_servers, args.sessions)
        print(f"  engine (decode + fold + EOS): {folded:,.0f} inputs answered/s")
        ceiling = bench_ceiling(settings, total)
        print(f"  ceiling (consume-produce-commit, no fold): {ceiling:,.0f} inputs/s")
        print(f"  ratio: {folded / ceiling:.2f}")
    if args.only in (None, "latency"):
        for commit_ms in (200, 20):
            p50, p99 = bench_latency(args.bootstrap_servers, args.rate, args.seconds, commit_ms)
            print(
                f"latency at {args.rate} resumes/s + {args.rate} intents/s, commit every "
                f"{commit_ms} ms: p50 {p50:.0f} ms, p99 {p99:.0f} ms"
            )
    if args.only in (None, "restore"):
        print(f"restore ({args.restore_sessions:,} sessions in one changelog partition):")
        bench_restore(args.bootstrap_servers, args.restore_sessions)


if __name__ == "__main__":
    main()
