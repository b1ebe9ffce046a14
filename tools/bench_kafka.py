"""What the `make bench` runs share: fresh topics per run, the pre-encoded input, the answer
counter (the bench client) and starting or stopping a system under test.

Every run gets its own topic prefix and group, so no run sees another's decisions, changelog or
offsets; the input bytes are encoded once and produced again for each run before it starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from engine.admin.topics import create_topics
from engine.core.events import AckEvent, Event, IntentEvent
from engine.settings import Settings, load_settings, settings_env
from engine.wire import Codec, RecordType
from tools.answer_reader import AnswerReader
from tools.bench_fold import session_events

CODEC = Codec()
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Input:
    """One pre-encoded input record; `kind` picks the topic of whatever prefix a run has."""

    kind: RecordType
    key: bytes
    value: bytes
    event_id: str


def encode_inputs(events: Sequence[Event]) -> list[Input]:
    def kind(event: Event) -> RecordType:
        if isinstance(event, IntentEvent):
            return RecordType.INTENT
        return RecordType.ACK if isinstance(event, AckEvent) else RecordType.RESUME

    return [Input(kind(e), e.session_id.encode(), CODEC.encode(e), e.event_id) for e in events]


def register_intent(n: int) -> IntentEvent:
    """Session n's REGISTER intent from tools/bench_fold.py's mix (not always its first
    event: some sessions have their ack and resume first)."""
    return next(e for e in session_events(n) if isinstance(e, IntentEvent))


def topic_of(settings: Settings, kind: RecordType) -> str:
    topics = settings.topics
    return {RecordType.INTENT: topics.intents, RecordType.ACK: topics.acks}.get(
        kind, topics.resumes
    )


def fresh_settings(bootstrap: str, partitions: int, commit_ms: int, **extra: Any) -> Settings:
    """A new prefix, group and state folder, with the engine's topics created."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    settings = load_settings(
        environ={},
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        partitions=partitions,
        group_id=f"{prefix}engine",
        commit_interval_ms=commit_ms,
        state_dir=Path(tempfile.mkdtemp(prefix="bench-state-")),
        **extra,
    )
    create_topics(settings)
    return settings


def produce_inputs(settings: Settings, inputs: Sequence[Input]) -> None:
    """Everything, flushed, before the system under test starts (Java-compatible murmur2)."""
    producer = Producer(settings.client_config(partitioner="murmur2_random", **{"linger.ms": 20}))
    for n, record in enumerate(inputs):
        while True:
            try:
                producer.produce(
                    topic_of(settings, record.kind), key=record.key, value=record.value
                )
                break
            except BufferError:  # librdkafka's local queue is full: let deliveries drain
                producer.poll(0.1)
        if n % 5000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise SystemExit("bench: the input did not reach the broker within 120 s")


@dataclass
class AnswerCounter:
    """The bench client: reads the decisions topic read_committed from the start and notes
    when the first answer arrived and when every input had its final answer.

    An input counts once, at its final answer: not at a PARKED record or a DEFERRED (non-final)
    answer, which inputs that arrive before the intent they name get first. With
    `count_records`, every record counts (the raw pipe writes one per input and no decisions).
    """

    settings: Settings
    expected: set[str]
    count_records: bool = False
    from_end: bool = False
    # How long the broker holds a fetch that finds nothing new. A fetch returns as soon as a
    # commit makes answers readable, so this bounds only the idle polling: at 10 ms it kept
    # the broker at ~25% of a core on its own, which the throughput runs compete with.
    fetch_wait_ms: int = 10
    first_at: float = 0.0
    first_batch: int = 0
    done_at: float = 0.0
    decisions: int = 0
    _waiting: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> AnswerCounter:
        self._waiting = set(self.expected)
        self._thread = threading.Thread(target=self._run, name="answer-counter", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        consumer = Consumer(
            self.settings.client_config(
                **{
                    "group.id": f"count-{uuid.uuid4().hex[:8]}",
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": self.fetch_wait_ms,
                }
            )
        )
        topic = self.settings.topics.decisions
        # assign(), not subscribe(): reading starts at once, with no group join to wait for
        starts = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] if self.from_end else 0
            for p in range(self.settings.partitions)
        ]
        consumer.assign([TopicPartition(topic, p, o) for p, o in enumerate(starts)])
        remaining = len(self.expected)
        final_answer = AnswerReader().final_answer  # the fields counting needs, not the trail
        try:
            while not self._stop.is_set() and remaining:
                batch = consumer.consume(5000, timeout=0.1)
                now = time.monotonic()
                for message in batch:
                    if message.error() is not None:
                        continue
                    self.first_at = self.first_at or now
                    self.decisions += 1
                    if self.count_records:
                        remaining -= 1
                        continue
                    answered = final_answer(message.value() or b"")
                    if answered is not None:
                        self._waiting.discard(answered)
                if not self.count_records:
                    remaining = len(self._waiting)
                if self.first_at == now:  # the answers read together with the first one
                    self.first_batch = len(self.expected) - remaining
            if not remaining:
                self.done_at = time.monotonic()
        finally:
            consumer.close()

    def rate(self) -> float:
        """Answers per second after the first read: (answers - those in the first read) /
        (last answer - first answer). Start-up (imports, group join, restore) and the first
        transaction's wait are left out; a steady stream is estimated without bias."""
        later = len(self.expected) - self.first_batch
        return later / max(1e-6, self.done_at - self.first_at)

    def wait(self, timeout_s: float) -> bool:
        """True when every input was answered within `timeout_s`."""
        assert self._thread is not None
        self._thread.join(timeout_s)
        self._stop.set()
        self._thread.join()
        return bool(self.done_at)


def engine_env(
    settings: Settings, processes: int = 1, instance_id: str = "engine-0"
) -> dict[str, str]:
    """This environment plus every field of `settings`, for `processes` engine children
    under `instance_id`."""
    own = settings.model_copy(update={"processes": processes, "instance_id": instance_id})
    return os.environ | settings_env(own)


def start(
    command: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A system under test in its own process group (stop() reaches its children too)."""
    return subprocess.Popen(
        list(command),
        env=env,
        cwd=REPO,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def start_engine(
    settings: Settings, log: Path, processes: int = 1, instance_id: str = "engine-0"
) -> subprocess.Popen[bytes]:
    """`reconciler run`, the command a user starts, with the settings in its environment."""
    command = [sys.executable, "-m", "engine.cli", "run"]
    return start(command, log, engine_env(settings, processes, instance_id))


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """SIGTERM to the process (a supervisor forwards it once: a second one would make the engine
    exit at once), then SIGKILL of the whole group if it hangs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 of the whole process group (a pod gone: supervisor and engine at once)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def cpu_s(pid: int, *, reaped: bool = True) -> float:
    """CPU seconds (user + system) of a process, all its threads, and (with `reaped`) its
    children it has waited for; 0.0 when it is gone. From /proc, no psutil."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and every descendant, living or reaped (the supervisor and its
    engine children)."""
    return cpu_s(pid) + sum(tree_cpu_s(child) for child in children_of(pid))


def broker_pid(bootstrap: str) -> int | None:
    """The pid of the tools/kafka_local.py broker serving `bootstrap`, if it is one."""
    port = bootstrap.rsplit(":", 1)[-1]
    for info_file in (REPO / ".kafka").glob("*/broker.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            info = json.loads(info_file.read_text())
            if str(info["port"]) == port and Path(f"/proc/{info['pid']}").exists():
                return int(info["pid"])
    return None


@dataclass
class CpuSampler:
    """CPU seconds (`read()`: e.g. a process tree's), sampled every `interval_s` in a thread,
    so the CPU spent between two instants (the first and the last answer) can be read off
    afterwards."""

    read: Callable[[], float]
    interval_s: float = 0.02
    samples: list[tuple[float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> CpuSampler:
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), self.read()))
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def at(self, when: float) -> float:
        """CPU seconds at `when`, interpolated between the samples around it."""
        before = [(t, c) for t, c in self.samples if t <= when]
        after = [(t, c) for t, c in self.samples if t >= when]
        if not before or not after:
            return (before or after or [(0.0, 0.0)])[-1 if before else 0][1]
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)


def rss_mb(pid: int, field_name: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children_of(pid: int) -> list[int]:
    """Child pids, whichever thread of `pid` started them."""
    found: list[int] = []
    tasks = Path(f"/proc/{pid}/task")
    with contextlib.suppress(OSError):  # the process or one of its threads just ended
        for task in list(tasks.iterdir()):
            with contextlib.suppress(OSError):
                found += [int(child) for child in (task / "children").read_text().split()]
    return sorted(found)
