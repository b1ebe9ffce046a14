"""State figures for `make bench`: memory and disk with many live sessions, how long decisions
take to resume after a restart (local state intact, or cold from the changelog), a cold restore
of one large changelog partition, and failover when one of three instances is killed.

"Decisions resume" is measured by the bench client: resumes on new sessions, two per partition,
produced when the engine is launched (or an instance killed); the figure is the time until
every one of them has its final answer.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from engine.core.events import ResumeEvent
from engine.core.state import SessionState
from engine.runtime.tasks.restore import restore_partition
from engine.runtime.tasks.state_codec import encode_state
from engine.runtime.tasks.store import LocalStore
from engine.settings import Settings
from engine.wire import RecordType
from tools.bench_fold import BINDING
from tools.bench_kafka import (
    CODEC,
    AnswerCounter,
    children_of,
    encode_inputs,
    fresh_settings,
    kill,
    produce_inputs,
    register_intent,
    rss_mb,
    start_engine,
    stop,
)
from tools.bench_latency import free_port, wait_ready


def _resume(sid: str) -> ResumeEvent:
    return ResumeEvent(
        event_id=sid,
        session_id=sid,
        event_time_ms=int(time.time() * 1000),
        runner_id="r",
        checkpoint_id="c",
        binding=BINDING,
    )


def _probe(settings: Settings, tag: str, started: float, timeout_s: float = 300) -> float:
    """Probes produced now, answered when? Seconds from `started` to the last answer."""
    probes = [_resume(f"probe-{tag}-{n}") for n in range(2 * settings.partitions * 4)]
    counter = AnswerCounter(settings, {p.event_id for p in probes}, from_end=True).start()
    produce_inputs(settings, encode_inputs(probes))
    if not counter.wait(timeout_s):
        return float("nan")
    return counter.done_at - started


def live_sessions(args: argparse.Namespace) -> None:
    """RSS and disk with N live sessions, then restart (state intact) and cold restore."""
    n = args.live_sessions
    port = free_port()
    settings = fresh_settings(
        args.bootstrap_servers, args.partitions, args.commit_ms, metrics_port=port
    )
    intents = encode_inputs([register_intent(i) for i in range(n)])
    produce_inputs(settings, intents)
    log = Path(tempfile.mkdtemp(prefix="bench-log-")) / "engine.log"
    counter = AnswerCounter(settings, {i.event_id for i in intents}).start()
    engine = start_engine(settings, log)
    answered = counter.wait(args.timeout)
    pids = children_of(engine.pid)
    rss = rss_mb(pids[0]) if pids else 0.0
    peak = rss_mb(pids[0], "VmHWM") if pids else 0.0
    stop(engine)
    if not answered:
        print(f"  {n:,} live sessions: not all answered within {args.timeout:.0f} s; see {log}")
        return
    disk = sum(f.stat().st_size for f in settings.state_dir.rglob("*") if f.is_file())
    print(
        f"| {n:,} live sessions (one registered intent each), 1 process | RSS {rss:,.0f} MB "
        f"(peak {peak:,.0f} MB); local state {disk / 1e6:,.0f} MB on disk, "
        f"{disk / n:,.0f} B per session |"
    )
    launched = time.monotonic()
    engine = start_engine(settings, log)
    warm = _probe(settings, "warm", launched)
    stop(engine)
    print(
        f"| restart, local state of {n:,} sessions intact | decisions resume after "
        f"{warm:.1f} s (from launch) |"
    )
    shutil.rmtree(settings.state_dir)
    settings.state_dir.mkdir()
    launched = time.monotonic()
    engine = start_engine(settings, log)
    cold = _probe(settings, "cold", launched)
    stop(engine)
    print(
        f"| restart, local state gone: restore {n:,} sessions from the changelog "
        f"({settings.partitions} partitions) | decisions resume after {cold:.1f} s |"
    )


def cold_restore(args: argparse.Namespace) -> None:
    """N session states in one changelog partition rebuilt into an empty local store."""
    sessions = args.restore_sessions
    settings = fresh_settings(args.bootstrap_servers, 1, args.commit_ms)
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
    store_dir = Path(tempfile.mkdtemp(prefix="bench-restore-"))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    store = LocalStore(store_dir / "p0.sqlite")
    full = restore_partition(settings.client_config(), changelog, 0, store, timeout_s=1800)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    store.close()
    store = LocalStore(store_dir / "p0.sqlite")
    delta = restore_partition(settings.client_config(), changelog, 0, store)
    store.close()
    size = (store_dir / "p0.sqlite").stat().st_size
    shutil.rmtree(store_dir)
    print(
        f"| cold restore of {full.records:,} sessions, one partition (in-process) | "
        f"{full.seconds:.1f} s ({full.records / full.seconds:,.0f} sessions/s); store "
        f"{size / 1e6:,.0f} MB; max RSS {rss_before:,.0f} -> {rss_after:,.0f} MB |"
    )
    print(
        f"| the same store reopened (local state intact) | {delta.records} records in "
        f"{delta.seconds:.2f} s |"
    )


def failover(args: argparse.Namespace) -> None:
    """Three `reconciler run` instances in one group under a steady probe load; one is killed
    (supervisor and engine at once, as a pod or node is lost). Per partition: time from the kill
    to the first answer to a probe produced after it."""
    session = {"session_timeout_ms": args.failover_session_ms} if args.failover_session_ms else {}
    settings = fresh_settings(args.bootstrap_servers, args.partitions, args.commit_ms, **session)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-log-"))
    instances, ports = [], []
    for n in range(3):
        port = free_port()
        ports.append(port)
        own = settings.model_copy(
            update={"metrics_port": port, "state_dir": settings.state_dir / f"instance-{n}"}
        )
        instances.append(start_engine(own, log_dir / f"engine-{n}.log", instance_id=f"fo-{n}"))
    sent: dict[str, float] = {}
    answers: list[tuple[int, str, float]] = []
    stopping = threading.Event()
    reader = threading.Thread(target=_read_answers, args=(settings, stopping, answers))
    try:
        for port in ports:
            wait_ready(port)
        reader.start()
        producer = Producer(
            settings.client_config(**{"partitioner": "murmur2_random", "linger.ms": 1})
        )

        def send_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                sid = f"fo-{uuid.uuid4().hex[:10]}"
                producer.produce(
                    settings.topics.resumes, key=sid.encode(), value=CODEC.encode(_resume(sid))
                )
                sent[sid] = time.monotonic()
                producer.poll(0)
                time.sleep(0.005)  # about 200 resumes/s

        send_for(10)  # the group settles with all three
        killed_at = time.monotonic()
        kill(instances[0])
        print(
            f"  killed fo-0 at {time.strftime('%H:%M:%S', time.gmtime())}"
            f".{int(time.time() * 1000) % 1000:03d} UTC; engine logs in {log_dir}",
            flush=True,
        )
        send_for(args.failover_seconds)
        producer.flush(30)
        time.sleep(2)
    finally:
        stopping.set()
        if reader.is_alive():
            reader.join()
        for proc in instances:
            stop(proc)
    first: dict[int, float] = {}
    latency_before: list[float] = []
    for partition, sid, at in answers:
        if sid not in sent:
            continue
        if sent[sid] > killed_at:
            first[partition] = min(first.get(partition, at), at)
        else:
            latency_before.append(at - sent[sid])
    gaps = {p: first[p] - killed_at for p in sorted(first)}
    missing = [p for p in range(settings.partitions) if p not in gaps]
    worst = max(gaps.values()) if gaps else float("nan")
    before = statistics.median(latency_before) * 1000 if latency_before else float("nan")
    per_partition = ", ".join(f"p{p} {g:.1f}" for p, g in gaps.items())
    never = f"; never on {missing}" if missing else ""
    print(
        f"| failover: 1 of 3 instances killed -9 (session.timeout.ms "
        f"{settings.session_timeout_ms:,}) | decisions resume on every partition after "
        f"{worst:.1f} s (seconds per partition: {per_partition}{never}); answer p50 before "
        f"the kill {before:.0f} ms |"
    )


def _read_answers(
    settings: Settings, stopping: threading.Event, into: list[tuple[int, str, float]]
) -> None:
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"fo-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 5,
            }
        )
    )
    topic = settings.topics.decisions
    consumer.assign([TopicPartition(topic, p, 0) for p in range(settings.partitions)])
    while not stopping.is_set():
        for message in consumer.consume(1000, timeout=0.05):
            if message.error() is None:
                decision = CODEC.decode_record(RecordType.DECISION, message.value() or b"")
                if decision["final"]:
                    into.append(
                        (message.partition() or 0, str(decision["in_reply_to"]), time.monotonic())
                    )
    consumer.close()


def report(args: argparse.Namespace, *, failover_only: bool = False) -> None:
    print("failover:" if failover_only else "state, restart and failover:")
    print("| case | figure |")
    print("|---|---|")
    if not failover_only:
        live_sessions(args)
        cold_restore(args)
    for _ in range(args.failover_runs):
        failover(args)
    print()
