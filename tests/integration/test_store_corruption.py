"""One partition's local store is corrupted under load: that task alone is wiped and restored
from the changelog while the other partitions go on deciding, and every input is still
answered exactly once with no session state lost.

The engine runs in a thread against the real broker. After a first workload is decided, the
test overwrites every page but the first of partition 0's SQLite store (the database file and
the frames of its write-ahead log) with 0xFF bytes, the way a failing disk or a stray write
would, while a second workload streams in. SQLite reports the damage at the next read of a
page it does not hold in its (small, here) page cache: a fold's store read, step 6's write or
the periodic session count, which scans the table. What it catches:

- corruption handled by dropping every task and rejoining (the `rejoins` and `fatal` counts
  stay 0, and partitions 1 and 2 must publish decisions while partition 0 restores);
- a wipe without a restore, or a restore that misses records (the sessions of partition 0
  then lose their state, and the replay of `assert_exactly_once` differs);
- inputs of the restoring partition folded before its state is back, or folded twice after the
  abort that precedes the wipe (duplicates or a differing replay);
- a task that never becomes RUNNING again (the inputs of partition 0 stay unanswered).

`RESTORE_BATCH` is lowered so that partition 0's restore spans many loop iterations, and each
restore step pauses (`RESTORE_STEP_PAUSE_S`, the cost of a larger store's batch), so the window
in which the other partitions must be seen deciding is wider than their own way back: the abort
before the wipe rewinds them to their committed offsets, and their inputs are fetched again.
Without the pause a compiled engine restored partition 0 (8,756 records) in 0.26 s, before the
other partitions' first fetch after the rewind, and no decision of theirs fell in the window.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from engine.core.events import Event
from engine.runtime import restorer
from engine.runtime.process.metrics import EngineMetrics
from engine.settings import Settings
from tests.integration.engine_harness import engine_settings, engine_thread, produce, read_decisions
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload

pytestmark = pytest.mark.kafka

CORRUPTED = 0  # the partition whose store is damaged
RESTORE_STEP_PAUSE_S = 0.01  # per restore step: about 4 s over partition 0's ~440 steps
WAL_HEADER, FRAME_HEADER = 32, 24  # SQLite's write-ahead log format


class _Lines(logging.Handler):
    """The engine's log lines with their wall-clock times."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.created, record.getMessage()))

    def first(self, needle: str, after: float = 0.0) -> float | None:
        return next((t for t, m in list(self.records) if needle in m and t >= after), None)


@pytest.fixture
def lines() -> Iterator[_Lines]:
    handler = _Lines()
    logger = logging.getLogger("reconciler.engine")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def _corrupt(db: Path) -> int:
    """Overwrite every page but page 1 (the header and the schema) with 0xFF, in the database
    file and in the write-ahead log's frames; returns the pages overwritten."""
    data = db.read_bytes()
    page = struct.unpack(">H", data[16:18])[0] or 65_536
    overwritten = 0
    with db.open("r+b") as f:
        for offset in range(page, len(data) - page + 1, page):
            f.seek(offset)
            f.write(b"\xff" * page)
            overwritten += 1
    wal = Path(f"{db}-wal")
    if wal.exists():
        log = wal.read_bytes()
        with wal.open("r+b") as f:
            for frame in range(WAL_HEADER, len(log) - FRAME_HEADER - page + 1, FRAME_HEADER + page):
                if struct.unpack(">I", log[frame : frame + 4])[0] != 1:
                    f.seek(frame + FRAME_HEADER)
                    f.write(b"\xff" * page)
                    overwritten += 1
    return overwritten


def _decision_times(bootstrap: str, settings: Settings) -> list[tuple[int, float]]:
    """(partition, producer timestamp in s) of every committed decision."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"times-{time.time_ns()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([settings.topics.decisions])
    out: list[tuple[int, float]] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(ended) < settings.partitions and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is not None:
                    ended.add(message.partition() or 0)
                    continue
                out.append((message.partition() or 0, message.timestamp()[1] / 1000))
    finally:
        consumer.close()
    return out


@pytest.mark.timeout(300)
def test_a_corrupted_store_is_wiped_and_restored_alone_under_load(
    kafka_bootstrap: str,
    unique_name: str,
    tmp_path: Path,
    lines: _Lines,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(restorer, "RESTORE_BATCH", 20)
    step = restorer.Restorer.step

    def paused_step(self: restorer.Restorer, wait_s: float) -> None:
        step(self, wait_s)
        if self.restores:
            time.sleep(RESTORE_STEP_PAUSE_S)

    monkeypatch.setattr(restorer.Restorer, "step", paused_step)
    settings = engine_settings(
        kafka_bootstrap, unique_name, tmp_path / "state", store_cache_mb=1, read_cache_mb=1
    )
    # 8,000 sessions put about 1.3 MB in partition 0's store, twice its share of the page cache
    # with room to spare (4,000 came within 4% of the bound once). The second workload streams
    # until the restore is over (or runs out, about 30 s of load), so the other partitions have
    # inputs to decide throughout the restore's window.
    first, second = workload(8_000, seed=31), workload(10_000, seed=32)
    sent: list[Event] = []
    restored = threading.Event()
    metrics = EngineMetrics()
    db = Path(settings.state_dir) / settings.group_id / settings.topic_prefix / "p0.sqlite"
    with engine_thread(settings, metrics):
        produce(kafka_bootstrap, settings, first)
        read_decisions(kafka_bootstrap, settings, until=len(first), timeout_s=120, idle_s=1)
        cache = settings.store_cache_mb * 2**20 // settings.partitions
        wal = Path(f"{db}-wal")
        size = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        assert size > 2 * cache, f"the store ({size} bytes) must outgrow SQLite's page cache"

        def load() -> None:
            for start in range(0, len(second), 100):
                if restored.is_set():
                    return
                produce(kafka_bootstrap, settings, second[start : start + 100])
                sent.extend(second[start : start + 100])
                time.sleep(0.05)

        producer = threading.Thread(target=load)
        producer.start()
        try:
            time.sleep(0.3)
            damaged_at = time.time()
            assert _corrupt(db) > 10
            deadline = time.monotonic() + 60
            restored_at = None
            while restored_at is None and time.monotonic() < deadline:
                time.sleep(0.1)
                detected = lines.first("cannot be read", damaged_at)
                if detected is not None:
                    restored_at = lines.first(f"partition {CORRUPTED} restored", detected)
        finally:
            restored.set()
            producer.join()
        assert detected is not None, "the damaged store was never read"
        assert restored_at is not None, "the damaged store was not restored within 60 s"
        assert len(sent) < len(second), "the load ran out before the restore ended"
        seen = read_decisions(kafka_bootstrap, settings, until=len(first) + len(sent), inputs=True)

    corrupted = [m for _, m in lines.records if "cannot be read" in m]
    assert len(corrupted) == 1, corrupted
    assert f"partition {CORRUPTED}:" in corrupted[0]
    value = metrics.registry.get_sample_value
    assert value("reconciler_task_corrupted_total", {"partition": str(CORRUPTED)}) == 1
    assert (value("reconciler_rejoins_total") or 0) == 0, "corruption must not rejoin"
    assert (value("reconciler_transaction_aborts_total", {"kind": "fatal"}) or 0) == 0
    assert (value("reconciler_transaction_aborts_total", {"kind": "state"}) or 0) == 0
    others = [
        t
        for p, t in _decision_times(kafka_bootstrap, settings)
        if p != CORRUPTED and detected <= t <= restored_at
    ]
    assert others, (
        f"no other partition decided while partition {CORRUPTED} restored "
        f"({restored_at - detected:.2f}s)"
    )
    print(
        f"partition {CORRUPTED} restored {restored_at - detected:.2f}s after the damage was "
        f"read; {len(others)} decisions of the other partitions meanwhile"
    )
    inputs = read_inputs(kafka_bootstrap, settings)
    assert_exactly_once(first + sent, seen, inputs)
