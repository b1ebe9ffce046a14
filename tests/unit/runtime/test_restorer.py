"""Step A2 in the loop (engine/runtime/restorer.py), over the fake broker: bounded work per
iteration, a task RUNNING only at its changelog partition's end with its inputs paused until
then, a revoke while restoring, and a corrupted store wiped and restored alone."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Collection
from pathlib import Path
from typing import cast

import pytest
from confluent_kafka import TopicPartition

from engine.runtime import engine as engine_module
from engine.runtime import restorer
from engine.runtime.clients import ConsumerLike
from engine.runtime.engine import Engine
from engine.runtime.loop import Loop
from engine.runtime.tasks.state import TaskState
from engine.runtime.tasks.store import LocalStore
from engine.settings import Settings, load_settings
from tests.integration.engine_harness import CODEC
from tests.unit.runtime.fakes import FakeBroker, FakeChangelogReader, FakeClients, FakeConsumer
from tests.unit.runtime.test_faults import EVENTS, PARTITIONS, _check_replay, _done

BATCH = 10


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restorer, "RESTORE_BATCH", BATCH)
    monkeypatch.setattr(engine_module, "REJOIN_INITIAL_S", 0.0)


def _settings(tmp_path: Path) -> Settings:
    return load_settings(
        environ={},
        partitions=PARTITIONS,
        state_dir=tmp_path / "state",
        metrics_port=0,
        commit_max_events=5,
        commit_interval_ms=60_000,
        transaction_timeout_ms=65_000,
    )


def _broker(settings: Settings, changelog_records: int) -> FakeBroker:
    """The workload's inputs, and `changelog_records` states of partition 0 in its changelog
    (distinct sessions: the store counts them)."""
    broker = FakeBroker(PARTITIONS)
    for event in EVENTS:
        broker.append(
            settings.topics.topic_for(event), event.session_id.encode(), CODEC.encode(event)
        )
    for n in range(changelog_records):
        broker.append(settings.topics.changelog, f"old-{n}".encode(), b"state", partition=0)
    return broker


def _started(tmp_path: Path, broker: FakeBroker) -> tuple[Engine, Loop, FakeConsumer]:
    """An engine with its clients, after the first iteration (the assignment: A0-A1)."""
    settings = _settings(tmp_path)
    engine = Engine(settings, clients=FakeClients(broker))
    loop = engine._create_clients()
    assert loop.iterate()
    consumer = loop.intake.consumer
    assert isinstance(consumer, FakeConsumer)
    return engine, loop, consumer


def _inputs(loop: Loop, partition: int) -> set[tuple[str, int]]:
    return {(t, partition) for t in loop.parts.topics.inputs}


def _run_until_folded(engine: Engine, clients: FakeClients) -> None:
    """Run until nothing is left to restore, consume or fold, and no transaction is open."""

    def on_idle() -> None:
        txn, loop = engine.transactions, engine.loop
        restoring = loop is not None and bool(loop.restorer.restores)
        if not restoring and not len(engine.order) and (txn is None or not txn.open):
            engine.stop()

    clients.on_idle = on_idle
    engine.run()


def test_restore_reads_a_bounded_batch_per_iteration_and_runs_at_the_end(tmp_path: Path) -> None:
    broker = _broker(_settings(tmp_path), changelog_records=5 * BATCH + 3)
    engine, loop, consumer = _started(tmp_path, broker)
    restores = loop.restorer.restores
    assert sorted(restores) == [0, 1]
    assert _inputs(loop, 0) | _inputs(loop, 1) <= consumer.paused, "restoring inputs are paused"
    assert engine.metrics.restoring == (0, 1)
    applied = []
    while 0 in restores:
        assert _inputs(loop, 0) <= consumer.paused
        assert 0 not in engine.tasks, "a restoring task folds nothing"
        assert not broker.log(loop.parts.topics.decisions, 0)
        loop.iterate()
        applied.append(restores[0].records if 0 in restores else None)
        assert 1 in engine.tasks, "an empty changelog partition is at its end at once"
    # at most one batch per iteration, then RUNNING at the end of the partition
    assert applied == [10, 20, 30, 40, 50, None]
    task = engine.tasks[0]
    assert task.state is TaskState.RUNNING
    assert task.store.count() == 5 * BATCH + 3
    assert task.store.changelog_offset() == 5 * BATCH + 2
    assert not _inputs(loop, 0) & consumer.paused, "its inputs resume at A3"
    assert not engine.metrics.restoring
    assert loop.restorer.reader is None, "the reader is closed once nobody restores"
    assert engine.metrics.registry.get_sample_value("reconciler_restore_seconds_count") == 2
    engine._close(loop)


def test_a_revoke_while_restoring_closes_the_task_and_unassigns_its_changelog(
    tmp_path: Path,
) -> None:
    broker = _broker(_settings(tmp_path), changelog_records=5 * BATCH)
    engine, loop, consumer = _started(tmp_path, broker)
    loop.iterate()  # one batch
    restoring = loop.restorer.restores[0]
    reader = loop.restorer.reader
    assert isinstance(reader, FakeChangelogReader)
    assert 0 in reader.positions
    assert consumer.positions is not None
    tps = [TopicPartition(t, p) for t, p in sorted(consumer.positions)]
    consumer.callbacks["revoke"](consumer, tps)
    assert restoring.task.state is TaskState.CLOSED
    assert loop.restorer.restores == {}
    assert 0 not in reader.positions
    assert reader.closed
    assert engine.metrics.restoring == ()
    with pytest.raises(sqlite3.ProgrammingError):
        restoring.task.store.count()  # its store is closed
    engine._close(loop)


def test_a_store_that_is_not_a_database_is_wiped_and_restored(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    broker = _broker(settings, changelog_records=3)
    path = Path(settings.state_dir) / settings.group_id / settings.topic_prefix / "p0.sqlite"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff" * 8192)
    engine, loop, _ = _started(tmp_path, broker)
    while loop.restorer.restores:
        loop.iterate()
    assert engine.tasks[0].store.count() == 3
    counted = engine.metrics.registry.get_sample_value
    assert counted("reconciler_task_corrupted_total", {"partition": "0"}) == 1
    engine._close(loop)


def test_a_store_ahead_of_the_changelog_is_wiped_and_restored(tmp_path: Path) -> None:
    """Its offset names a record the changelog does not have (the topic was recreated)."""
    settings = _settings(tmp_path)
    broker = _broker(settings, changelog_records=3)
    path = Path(settings.state_dir) / settings.group_id / settings.topic_prefix / "p0.sqlite"
    store = LocalStore(path)
    store.apply([], changelog_offset=99)
    store.close()
    engine, loop, _ = _started(tmp_path, broker)
    while loop.restorer.restores:
        loop.iterate()
    assert engine.tasks[0].store.changelog_offset() == 2
    assert engine.tasks[0].store.count() == 3
    counted = engine.metrics.registry.get_sample_value
    assert counted("reconciler_task_corrupted_total", {"partition": "0"}) == 1
    engine._close(loop)


def _malformed() -> sqlite3.DatabaseError:
    error = sqlite3.DatabaseError("database disk image is malformed")
    error.sqlite_errorcode = 11  # SQLITE_CORRUPT, as SQLite sets it
    return error


@pytest.mark.parametrize(
    ("where", "nth", "batch"),
    [
        ("get_many", 1, 4),
        ("get_many", 1, 100),
        ("get", 3, 4),
        ("apply_lazily", 2, 4),
        ("count", 2, 4),
    ],
)
def test_a_store_corrupted_while_running_is_rebuilt_alone(
    where: str, nth: int, batch: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 0's store fails once, mid-run: in a batch's prefetch, in a fold's read (the
    open transaction then holds decisions of partition 0), in step 6's write or in the session
    count. The open transaction is aborted, partition 0 alone is wiped and restored from the
    changelog, the clients stay (no rejoin), and every input is answered exactly once with the
    states the replay expects (none lost with the wiped store). With `batch` 100 the first
    consume takes every input, so the first batch released, whose prefetch fails before any
    transaction is open, holds partition 1's records too: they are read again, not lost."""
    settings = _settings(tmp_path)
    broker = _broker(settings, changelog_records=0)
    original = getattr(LocalStore, where)
    calls = {"n": 0}

    def failing(self: LocalStore, *args: object, **kwargs: object) -> object:
        if self.path.name == "p0.sqlite":
            calls["n"] += 1
            if calls["n"] == nth:
                raise _malformed()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LocalStore, where, failing)
    if where == "get":  # a fold's own read: partition 0's batch prefetch finds nothing
        get_many = LocalStore.get_many

        def prefetched(self: LocalStore, session_ids: Collection[str]) -> dict[str, bytes | None]:
            return {} if self.path.name == "p0.sqlite" else get_many(self, session_ids)

        monkeypatch.setattr(LocalStore, "get_many", prefetched)
    monkeypatch.setattr("engine.runtime.process.metrics.SESSIONS_INTERVAL_S", 0.0)
    clients = FakeClients(broker, batch=batch)
    engine = Engine(settings, clients=clients)
    _run_until_folded(engine, clients)
    assert calls["n"] >= nth, f"{where} never failed"
    assert _done(broker, settings)
    counted = engine.metrics.registry.get_sample_value
    assert counted("reconciler_task_corrupted_total", {"partition": "0"}) == 1
    assert counted("reconciler_task_corrupted_total", {"partition": "1"}) == 0
    assert broker.clients_created == 1, "a corrupted store must not rejoin"
    _check_replay(broker, settings)


def test_a_new_consumers_inputs_stay_unfetched_while_their_tasks_restore(tmp_path: Path) -> None:
    """A new consumer's first assignment (every start and every rejoin): librdkafka skips a
    pause of a partition it never had assigned, so pausing inside the assign callback, before
    the client assigns, paused nothing; partition 0's inputs were fetched while its task
    restored (several iterations here), dropped as not ready, and never read again: inputs
    without a decision. The callback assigns, then pauses."""
    settings = _settings(tmp_path)
    broker = _broker(settings, changelog_records=5 * BATCH + 3)
    clients = FakeClients(broker)
    engine = Engine(settings, clients=clients)
    made: list[FakeConsumer] = []
    consumer_of = clients.consumer

    def consumer(s: Settings) -> FakeConsumer:
        made.append(cast(FakeConsumer, consumer_of(s)))
        return made[-1]

    clients.consumer = consumer  # type: ignore[method-assign,assignment]
    loop = engine._create_clients()
    assert loop.iterate()  # A0-A1: both tasks restore, partition 0 for six iterations
    inputs = _inputs(loop, 0)
    assert inputs <= made[0].paused, "the restoring task's inputs are paused"
    assert made[0].positions is not None
    loop.iterate()
    assert 0 in loop.restorer.restores
    assert all(made[0].positions[key] == 0 for key in inputs), "fetched while restoring"
    engine._close(loop)
    _run_until_folded(engine, clients)
    assert _done(broker, settings)
    _check_replay(broker, settings)


class _PauseNeverHolds(FakeConsumer):
    """A consumer whose pause() does nothing."""

    def pause(self, partitions: list[TopicPartition]) -> None:
        return None


def test_inputs_consumed_while_their_task_restores_are_read_again_at_a3(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever lets a restoring task's inputs through (a pause that does not hold), the
    records dropped meanwhile are read again: the task rewinds to its committed offsets at
    A3 rather than going on from where the consumer is."""
    settings = _settings(tmp_path)
    broker = _broker(settings, changelog_records=5 * BATCH + 3)
    clients = FakeClients(broker)

    def consumer(_: Settings) -> ConsumerLike:
        return _PauseNeverHolds(broker, lambda: clients.on_idle(), clients.batch)

    clients.consumer = consumer  # type: ignore[method-assign,assignment]
    engine = Engine(settings, clients=clients)
    caplog.set_level(logging.WARNING, logger="reconciler.engine")
    _run_until_folded(engine, clients)
    assert _done(broker, settings)
    _check_replay(broker, settings)
    lines = [r.getMessage() for r in caplog.records]
    warned = {int(line.split(":")[0].split()[1]) for line in lines if "while its task" in line}
    assert 0 in warned, "partition 0's inputs were consumed while it restored, and rewound"
