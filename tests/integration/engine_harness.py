"""Run the engine against the real broker, in a thread or as a killable process, and read
its decisions back with read_committed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from engine.admin.topics import create_topics
from engine.core.events import Decision, Event
from engine.runtime.engine import Engine
from engine.runtime.process.metrics import EngineMetrics
from engine.settings import Settings, load_settings, settings_env
from engine.wire import Codec, DeadLetter, RecordType
from engine.wire.partitioner import partition_for

CODEC = Codec()
REPO = Path(__file__).resolve().parents[2]


def session_on(partition: int, partitions: int, stem: str) -> str:
    """A session id starting with `stem` whose records land in `partition`."""
    return next(
        f"{stem}-{n}" for n in count() if partition_for(f"{stem}-{n}", partitions) == partition
    )


def engine_settings(bootstrap: str, prefix: str, state_dir: Path, **extra: Any) -> Settings:
    given: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "topic_prefix": f"{prefix}.",
        "partitions": 3,
        "group_id": f"{prefix}-engine",
        "state_dir": state_dir,
        "commit_interval_ms": 100,
        "session_timeout_ms": 6_000,
        "transaction_timeout_ms": 10_000,
        "metrics_port": 0,
        "restart_backoff_max_s": 1.0,
    }
    settings = load_settings(environ={}, **(given | extra))
    create_topics(settings)
    return settings


@contextmanager
def engine_thread(settings: Settings, metrics: EngineMetrics | None = None) -> Iterator[Engine]:
    """An engine in a daemon thread, stopped and joined on exit (with the given metrics)."""
    engine = Engine(settings, metrics=metrics)
    thread = threading.Thread(target=engine.run, name="engine", daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        engine.stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the engine did not stop within 60 s"


@dataclass
class EngineProcess:
    """`reconciler run`, the supervised command a user starts: a supervisor and its engine
    child. `kill()` is kill -9 of the engine (the supervisor restarts it), `kill_all()` of both
    (a pod gone), `terminate()` SIGTERM to the supervisor (drain, exit 0)."""

    settings: Settings
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self) -> EngineProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "run"],
            # faulthandler: `dump_stacks` has an engine write every thread's stack to the log
            env=os.environ
            | settings_env(self.settings)
            | {"PYTHONFAULTHANDLER": "1"}
            | self.extra_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,  # one process group: kill_all() reaches the child too
        )
        return self

    def engine_pid(self, timeout_s: float = 60) -> int:
        """The current engine child's pid (waiting out a restart in progress)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            if pids:
                return int(pids[0])
            time.sleep(0.05)
        raise AssertionError(f"the supervisor started no engine within {timeout_s:.0f}s")

    def dump_stacks(self) -> None:
        """For a test about to fail on an engine that went quiet: each engine child's kernel
        state and wait channel, then its Python stacks (SIGABRT, written by faulthandler) in
        the log. The supervisor restarts the child afterwards."""
        assert self.proc is not None
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        pids = children.read_text().split() if children.exists() else []
        with open(self.log_path, "a") as log:
            log.write(f"== dump_stacks: supervisor {self.proc.pid}, children {pids}\n")
            for pid in pids:
                with contextlib.suppress(OSError):
                    state = Path(f"/proc/{pid}/status").read_text().splitlines()[2]
                    wchan = Path(f"/proc/{pid}/wchan").read_text()
                    log.write(f"== engine {pid}: {state}, wchan {wchan}\n")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGABRT)
        time.sleep(1)

    def kill(self) -> None:
        """kill -9 the engine child; the supervisor starts a new one."""
        pid = self.engine_pid()
        os.kill(pid, signal.SIGKILL)
        while self.engine_pid() == pid:  # until the supervisor reaped it and started another
            time.sleep(0.02)

    def kill_all(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self, timeout_s: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def produce(bootstrap: str, settings: Settings, events: Iterable[Event]) -> int:
    topics = settings.topics
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    count = 0
    for event in events:
        producer.produce(
            topics.topic_for(event), key=event.session_id.encode(), value=CODEC.encode(event)
        )
        count += 1
        if count % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return count


def produce_raw(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def _text(value: str | bytes | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


@dataclass(frozen=True)
class Seen:
    decision: Decision
    source: str
    partition: int
    offset: int


def read_decisions(
    bootstrap: str,
    settings: Settings,
    until: int,
    timeout_s: float = 60,
    idle_s: float = 3,
    inputs: bool = False,
) -> list[Seen]:
    """Decisions in topic order per partition, read_committed, until `until` arrived and
    `idle_s` passed without more (so duplicates would show), or `timeout_s`. With `inputs`,
    `until` counts the inputs answered: a resume's later final answer does not count again, so
    a stall near the end cannot stop the read while some inputs wait for their first answer."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.time_ns()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([settings.topics.decisions])
    seen: list[Seen] = []
    answered: set[str] = set()
    deadline = time.monotonic() + timeout_s
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(1000, timeout=0.3)
            for message in batch:
                assert message.error() is None, message.error()
                decision = CODEC.decode(RecordType.DECISION, message.value() or b"")
                assert isinstance(decision, Decision)
                headers = dict(message.headers() or [])
                seen.append(
                    Seen(
                        decision,
                        _text(headers.get("source")),
                        message.partition() or 0,
                        message.offset() or 0,
                    )
                )
                answered.add(decision.decision_id.removesuffix("/final"))
            if batch:
                last_new = time.monotonic()
            elif (
                len(answered if inputs else seen) >= until and time.monotonic() - last_new > idle_s
            ):
                break
    finally:
        consumer.close()
    return seen


def read_dead_letters(
    bootstrap: str, settings: Settings, until: int, timeout_s: float = 60
) -> list[DeadLetter]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dlq-{time.time_ns()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([settings.topics.dead_letters])
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(letters) < until:
            for message in consumer.consume(500, timeout=0.3):
                assert message.error() is None
                letter = CODEC.decode(RecordType.DEAD_LETTER, message.value() or b"")
                assert isinstance(letter, DeadLetter)
                letters.append(letter)
    finally:
        consumer.close()
    return letters
