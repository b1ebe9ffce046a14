"""Resume-to-decision latency under a steady load, for `make bench`.

At R resumes/s plus R intents/s (each resume on a new session, each intent registering another
new session), end to end is the time from a resume's produce (its event time, wall clock) to its
decision read back read_committed by the bench client. Per stage, p50/p99 come from the
engine's `reconciler_stage_seconds{stage=...}` histogram (scraped from /metrics before and after
the run, quantiles from the difference as Prometheus' histogram_quantile computes them), or
"n/a" while the engine does not export it.
"""

from __future__ import annotations

import argparse
import re
import socket
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from engine.core.events import ResumeEvent
from engine.settings import Settings
from engine.wire import RecordType
from tools.bench_fold import BINDING
from tools.bench_kafka import (
    CODEC,
    AnswerCounter,
    encode_inputs,
    fresh_settings,
    produce_inputs,
    register_intent,
    start_engine,
    stop,
)

STAGES = ("consume_wait", "fold", "produce", "commit")
_BUCKET = re.compile(r"^reconciler_stage_seconds_bucket\{(?P<labels>[^}]*)\}\s+(?P<n>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')

Buckets = dict[str, dict[float, float]]  # stage -> upper bound -> cumulative count


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape_stages(port: int) -> Buckets:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    found: Buckets = defaultdict(dict)
    for line in text.splitlines():
        match = _BUCKET.match(line)
        if match:
            labels = dict(_LABEL.findall(match["labels"]))
            found[labels.get("stage", "?")][float(labels["le"])] = float(match["n"])
    return dict(found)


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """histogram_quantile over the increase between two scrapes (linear within a bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank, lower, below = q * counts[-1], 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def wait_ready(port: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"bench: the engine on port {port} was not ready within {timeout_s:.0f} s")


def warm_up(settings: Settings, timeout_s: float = 120) -> None:
    """Until resumes on every partition get answers: ready is not yet a settled group."""
    probes = [
        ResumeEvent(
            event_id=f"warm-{n}",
            session_id=f"warm-{n}",
            event_time_ms=int(time.time() * 1000),
            runner_id="r",
            checkpoint_id="c",
            binding=BINDING,
        )
        for n in range(8 * settings.partitions)
    ]
    counter = AnswerCounter(settings, {p.event_id for p in probes}, from_end=True).start()
    produce_inputs(settings, encode_inputs(probes))
    if not counter.wait(timeout_s):
        raise SystemExit(f"bench: warm-up resumes unanswered after {timeout_s:.0f} s")


def _read_latencies(settings: Settings, stop: threading.Event, into: list[float]) -> None:
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"lat-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 5,
            }
        )
    )
    topic = settings.topics.decisions  # assign(): no group join delays the first reads
    consumer.assign([TopicPartition(topic, p, 0) for p in range(settings.partitions)])
    while not stop.is_set():
        for message in consumer.consume(1000, timeout=0.05):
            if message.error() is None:
                now_ms = time.time() * 1000
                decision = CODEC.decode_record(RecordType.DECISION, message.value() or b"")
                if str(decision["in_reply_to"]).startswith("lat-") and decision["final"]:
                    into.append(now_ms - decision["event_time_ms"])
    consumer.close()


def run_latency(
    bootstrap: str, partitions: int, commit_ms: int, rate: int, seconds: int
) -> tuple[list[float], dict[str, tuple[float | None, float | None]]]:
    """End-to-end samples (ms), and per stage (p50, p99) in ms."""
    port = free_port()
    settings = fresh_settings(bootstrap, partitions, commit_ms, metrics_port=port)
    log = Path(tempfile.mkdtemp(prefix="bench-log-")) / "engine.log"
    engine = start_engine(settings, log)
    latencies: list[float] = []
    stopping = threading.Event()
    reader = threading.Thread(target=_read_latencies, args=(settings, stopping, latencies))
    try:
        wait_ready(port)
        warm_up(settings)
        reader.start()
        producer = Producer(
            settings.client_config(**{"partitioner": "murmur2_random", "linger.ms": 1})
        )
        before = scrape_stages(port)
        interval, next_at = 1.0 / rate, time.monotonic()
        for n in range(rate * seconds):
            sid = f"lat-{n}"
            resume = ResumeEvent(
                event_id=sid,
                session_id=sid,
                event_time_ms=int(time.time() * 1000),
                runner_id="r",
                checkpoint_id="c",
                binding=BINDING,
            )
            producer.produce(settings.topics.resumes, key=sid.encode(), value=CODEC.encode(resume))
            load = register_intent(n)  # an intent on another session, as background load
            producer.produce(
                settings.topics.intents, key=load.session_id.encode(), value=CODEC.encode(load)
            )
            producer.poll(0)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        producer.flush(30)
        time.sleep(3)  # the last answers
        after = scrape_stages(port)
    finally:
        stopping.set()
        if reader.is_alive():
            reader.join()
        stop(engine)
    stages = {
        stage: (
            _ms(quantile(0.5, before.get(stage, {}), after[stage])),
            _ms(quantile(0.99, before.get(stage, {}), after[stage])),
        )
        for stage in STAGES
        if stage in after
    }
    return latencies, stages


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _show(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def report(args: argparse.Namespace) -> None:
    print(
        f"latency: resume -> final decision, end to end (bench client) and per engine stage, "
        f"1 process, {args.partitions} partitions, commit every {args.commit_ms} ms, "
        f"{args.seconds} s per rate"
    )
    print(
        "| resumes/s + intents/s | answered | end to end p50 / p99 ms | "
        + " | ".join(f"{s} p50 / p99 ms" for s in STAGES)
        + " |"
    )
    print("|---" * (3 + len(STAGES)) + "|")
    for rate in (int(r) for r in args.rates.split(",")):
        samples, stages = run_latency(
            args.bootstrap_servers, args.partitions, args.commit_ms, rate, args.seconds
        )
        samples.sort()
        p50 = samples[len(samples) // 2] if samples else None
        p99 = samples[int(len(samples) * 0.99)] if samples else None
        cells = [
            f"{_show(stages[s][0])} / {_show(stages[s][1])}" if s in stages else "n/a"
            for s in STAGES
        ]
        print(
            f"| {rate} + {rate} | {len(samples):,} / {rate * args.seconds:,} "
            f"| {_show(p50)} / {_show(p99)} | " + " | ".join(cells) + " |",
            flush=True,
        )
    print()
