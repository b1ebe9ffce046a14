"""Fault injection without Kafka: every named step x every kind of failure (fakes.py).

Each case runs the engine over a fixed workload, restarting it as a process manager would when
it crashes, and checks the protocol's outcome (retry, abort and rewind, rejoin, watchdog) and
that the committed decisions equal a pure replay of the inputs: each input answered exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from engine.core.events import Decision
from engine.runtime import engine as engine_module
from engine.runtime.clients import ConsumerLike
from engine.runtime.commit import commit as commit_module
from engine.runtime.commit.commit import Commit
from engine.runtime.engine import Engine
from engine.runtime.intake import intake
from engine.runtime.process.watchdog import Expired, Watchdog
from engine.runtime.tasks import corrupt
from engine.runtime.tasks.store import LocalStore
from engine.settings import Settings, load_settings
from engine.wire import RecordType
from tests.integration.engine_harness import CODEC, Seen
from tests.integration.exactly_once import assert_exactly_once, workload
from tests.unit.runtime.fakes import (
    KINDS,
    STEPS,
    Crash,
    FakeBroker,
    FakeClients,
    FakeConsumer,
    Faults,
)

PARTITIONS = 2
EVENTS = workload(12, seed=5)


@pytest.fixture(autouse=True)
def _no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "REJOIN_INITIAL_S", 0.0)


OVERLAP = {"overlap": False}


@pytest.fixture(autouse=True, params=[False, True], ids=["wait", "overlap"])
def _commit_overlap(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case twice: the loop waiting for each commit, and steps 4-5 in the worker while
    the loop folds ahead. Overlapped, the order buffer releases 2 records per look, so ready
    records wait when a commit starts, and the worker counts as busy until the loop has
    folded all of them: every commit folds ahead as much as it can, with no clock."""
    monkeypatch.setitem(OVERLAP, "overlap", request.param)
    if request.param:
        monkeypatch.setattr(intake, "CONSUME_BATCH", 2)
        monkeypatch.setattr(Commit, "worker_done", lambda self: False)


def _settings(tmp_path: Path) -> Settings:
    return load_settings(
        environ={},
        commit_overlap=OVERLAP["overlap"],
        partitions=PARTITIONS,
        state_dir=tmp_path / "state",
        metrics_port=0,
        commit_max_events=5,
        commit_interval_ms=60_000,  # commits come from the batch size: no clock in these tests
        transaction_timeout_ms=65_000,  # the interval + TXN_TIMEOUT_MARGIN_MS
    )


def _broker(settings: Settings, faults: Faults) -> FakeBroker:
    broker = FakeBroker(PARTITIONS, faults)
    for event in EVENTS:
        broker.append(
            settings.topics.topic_for(event), event.session_id.encode(), CODEC.encode(event)
        )
    return broker


def _persist_hits(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    # step 6 of either path (a commit the loop waited for or an overlapped one): as each task's
    # sealed writes go to its store, after the tasks before it in the commit persisted theirs.
    # `Commit.persist` enters `detecting` once per task around its `persist_sealed`
    # (`PartitionTask`, compiled, refuses patched methods).
    original = corrupt.detecting

    @contextmanager
    def detecting(partition: int) -> Iterator[None]:
        with original(partition):
            faults.hit("persist")
            yield

    monkeypatch.setattr(commit_module, "detecting", detecting)


def _skip(step: str) -> int:
    """A1, A2 and A0's owner mark run once per assignment (the mark only while the committed
    offsets name another owner); other steps fail on their second call, when a transaction
    has already committed and state exists."""
    return 0 if step in ("owner mark", "A1", "A2") else 1


def _done(broker: FakeBroker, settings: Settings) -> bool:
    return all(
        broker.offsets.get((t, p), 0) == len(broker.log(t, p))
        for t in settings.topics.inputs
        for p in range(PARTITIONS)
    )


def _stop_when_folded(engine: Engine) -> Callable[[], None]:
    def on_idle() -> None:
        txn = engine.transactions
        if not len(engine.order) and (txn is None or not txn.open):
            engine.stop()

    return on_idle


def _run_until_done(
    settings: Settings,
    broker: FakeBroker,
    watchdog: Watchdog | None = None,
    shared: FakeClients | None = None,
) -> int:
    """Run engine processes until every input is committed; returns how many ran. `shared`:
    one set of clients for every process (to count what they saw), else new ones for each."""
    for incarnation in range(1, 6):
        clients = shared if shared is not None else FakeClients(broker)
        engine = Engine(settings, clients=clients, watchdog=watchdog)
        # Stop once nothing is left to consume or fold (the order buffer may hold records
        # released a few at a time) and no transaction is open (a failing last commit would
        # leave its inputs to the next process).
        clients.on_idle = _stop_when_folded(engine)
        try:
            engine.run()
        except Crash:
            # The process died: its open SQLite batch goes with it, as in a real crash (held
            # open, it would keep the write lock until garbage collection, and the next
            # process's restore would wait on it). The next one starts from Kafka and disk.
            for task in engine.tasks.values():
                task.store.abandon()
            continue
        if _done(broker, settings):
            return incarnation
    raise AssertionError("inputs still uncommitted after 5 engine processes")


def _check_replay(broker: FakeBroker, settings: Settings) -> None:
    inputs = {}
    for topic in settings.topics.inputs:
        for p in range(PARTITIONS):
            for offset, record in enumerate(broker.log(topic, p)):
                kind = {
                    settings.topics.intents: RecordType.INTENT,
                    settings.topics.acks: RecordType.ACK,
                }.get(topic, RecordType.RESUME)
                inputs[f"{topic}/{p}/{offset}"] = (CODEC.decode(kind, record.value), offset)
    seen = []
    for p in range(PARTITIONS):
        for offset, record in enumerate(broker.log(settings.topics.decisions, p)):
            decision = CODEC.decode(RecordType.DECISION, record.value)
            assert isinstance(decision, Decision)
            source = dict(record.headers)["source"].decode()
            seen.append(Seen(decision, source, p, offset))
    assert_exactly_once(EVENTS, seen, inputs)  # type: ignore[arg-type]


def test_no_fault_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[int] = []
    produce_held = Commit._produce_held

    def counted(self: Commit) -> int:
        held.append(produce_held(self))
        return held[-1]

    monkeypatch.setattr(Commit, "_produce_held", counted)
    settings = _settings(tmp_path)
    broker = _broker(settings, Faults())
    assert _run_until_done(settings, broker) == 1
    # overlapped, decisions were folded ahead and produced into the next transaction
    assert (sum(held) > 0) is OVERLAP["overlap"]
    assert (broker.clients_created, broker.aborts) == (1, 0)
    _check_replay(broker, settings)
    # A stop leaves step 6 on disk (no open SQLite batch): another reader sees every
    # partition's store at the last changelog record.
    root = Path(settings.state_dir) / settings.group_id / settings.topic_prefix
    for p in range(PARTITIONS):
        store = LocalStore(root / f"p{p}.sqlite")
        assert store.changelog_offset() == len(broker.log(settings.topics.changelog, p)) - 1
        store.close()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "hang"])
@pytest.mark.parametrize("step", STEPS)
def test_error_at_each_step(
    step: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path)
    faults = Faults(step=step, kind=kind, skip=_skip(step))
    broker = _broker(settings, faults)
    _persist_hits(monkeypatch, faults)
    _run_until_done(settings, broker)
    assert faults.fired == 1, f"{step} was never reached"
    transactional = step in ("begin", "produce", "flush", "offsets", "commit")
    if kind == "abortable" and transactional:
        assert broker.aborts >= 1, "an abortable error must abort and rewind"
        assert broker.clients_created == 1, "an abortable error must not rejoin"
    elif kind == "retriable" and step in ("begin", "flush", "offsets", "commit"):
        assert (broker.clients_created, broker.aborts) == (1, 0), "retried in place"
    else:  # fatal, fenced, anything at A1/A2/persist, a produce error: new clients, rejoin
        assert broker.clients_created >= 2, "the engine must rejoin with new clients"
    _check_replay(broker, settings)


@pytest.mark.parametrize("step", STEPS)
def test_a_call_that_never_returns_is_cut_by_the_watchdog(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path)
    faults = Faults(step=step, kind="hang", skip=_skip(step))
    broker = _broker(settings, faults)
    _persist_hits(monkeypatch, faults)
    now = [0.0]
    reported: list[Expired] = []

    def on_expired(expired: Expired) -> None:  # production: log stacks, os._exit(75)
        reported.append(expired)
        faults.release.set()

    watchdog = Watchdog(clock=lambda: now[0], on_expired=on_expired)
    runs: list[int] = []
    thread = threading.Thread(
        target=lambda: runs.append(_run_until_done(settings, broker, watchdog))
    )
    thread.start()
    assert faults.hung.wait(60), f"{step} was never reached"
    names = {"owner mark": "A0 owner mark", "A1": "A1", "A2": "A2", "begin": "1"}
    names |= {"produce": "2 fold", "flush": "4 flush", "offsets": "4 send_offsets"}
    names |= {"commit": "5", "persist": "6"}
    # Overlapped, the loop may still fold ahead while the worker hangs: the hung call's guard
    # is the innermost once the loop waits for the worker.
    until = time.monotonic() + 60
    while watchdog.current_step() != names[step] and time.monotonic() < until:
        time.sleep(0.001)
    assert watchdog.check() is None, "nothing is late before the budget passes"
    now[0] += 10_000.0
    expired = watchdog.check()
    thread.join(60)
    assert not thread.is_alive()
    assert expired is not None
    assert reported == [expired]
    assert expired.step == names[step]
    assert runs
    assert broker.clients_created >= 2
    _check_replay(broker, settings)


def test_crash_between_step_5_and_step_6(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The changelog and offsets are committed, the local store is not: the next process
    restores the difference (A2) and nothing is decided twice or lost."""
    settings = _settings(tmp_path)
    faults = Faults(step="persist", kind="crash", skip=1)
    broker = _broker(settings, faults)
    _persist_hits(monkeypatch, faults)
    assert _run_until_done(settings, broker) == 2
    assert faults.fired == 1
    _check_replay(broker, settings)


class _InFlightConsumer(FakeConsumer):
    """Rebalances (revoke + assign) or loses its partitions from inside consume(), the moment
    librdkafka would run the callbacks in the loop's poll: `rebalance` and `lost` while a
    commit is in flight (overlapped only), `lost at fault` at the first consume after the
    injected fault fired (waiting and overlapped; the failed commit may still be in flight)."""

    def __init__(self, clients: _InFlightClients) -> None:
        super().__init__(clients.broker, lambda: clients.on_idle(), clients.batch)
        self.clients = clients
        self.lost: Any = None
        self.was_lost = False

    def subscribe(
        self, topics: list[str], on_assign: Any = None, on_revoke: Any = None, on_lost: Any = None
    ) -> None:
        super().subscribe(topics, on_assign, on_revoke, on_lost)
        self.lost = on_lost

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        clients = self.clients
        if self.was_lost:  # the engine must rejoin with new clients after a lost assignment
            clients.reused_after_lost += 1
        if self.positions is not None and self._now(clients):
            clients.count[0] += 1
            if clients.mode == "rebalance":
                self.rebalance()
            else:
                self.lost(self, [TopicPartition(t, p) for t, p in sorted(self.positions)])
                self.positions, self.was_lost = None, True
                return []
        return super().consume(num_messages, timeout)

    @staticmethod
    def _now(clients: _InFlightClients) -> bool:
        if clients.mode == "lost at fault":
            return clients.broker.faults.fired > 0 and clients.count[0] == 0
        txn = clients.engine.transactions if clients.engine is not None else None
        return txn is not None and txn.in_flight and clients.count[0] < 3


class _InFlightClients(FakeClients):
    def __init__(self, broker: FakeBroker, mode: str, count: list[int]) -> None:
        super().__init__(broker)
        self.mode, self.count = mode, count
        self.engine: Engine | None = None
        self.reused_after_lost = 0

    def consumer(self, settings: Settings) -> ConsumerLike:
        return _InFlightConsumer(self)


def _worker_waits_for_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps 4-5 of an overlapped commit start only once the loop waits for the worker
    (`Commit.join`, also when it leaves with an exception: `abandon` joins): a callback that
    touched the producer or the tasks before settling the commit then does so before the
    worker even flushed, in every run, not only when the thread scheduler happens to let it."""
    gate = threading.Event()
    start, join, steps = Commit.start_worker, Commit.join, Commit.commit_steps

    def start_worker(self: Commit) -> None:
        gate.clear()
        start(self)

    def joined(self: Commit) -> None:
        gate.set()
        join(self)

    def steps_4_5(self: Commit) -> None:
        if threading.current_thread().name == "commit":  # the worker, not a waited commit
            gate.wait()
        steps(self)

    monkeypatch.setattr(Commit, "start_worker", start_worker)
    monkeypatch.setattr(Commit, "join", joined)
    monkeypatch.setattr(Commit, "commit_steps", steps_4_5)


@pytest.mark.parametrize("mode", ["rebalance", "lost", "lost at fault"])
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "hang"])
@pytest.mark.parametrize("step", STEPS)
def test_rebalance_while_a_commit_is_in_flight(
    step: str, kind: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebalance callbacks must settle the commit the worker is running before they touch
    the tasks; waiting for each commit, none is ever in flight when consume() runs. A lost
    assignment commits nothing more and rejoins with new clients, whatever the fault left
    behind. Mutations and the cases that fail (of 216): `Committer.settle` a no-op 27 (step 6
    refuses the tasks a revoke closed under the commit in flight); no settle in `on_lost` only
    0 (the commit in flight is then abandoned with the clients, as in a crash: the store stays
    behind Kafka and A2 reads the difference); no rejoin after a lost assignment 108;
    `Intake.consume` calling consume() again after a callback asked for a rejoin 72 (every
    "lost at fault" case)."""
    settings = _settings(tmp_path)
    faults = Faults(step=step, kind=kind, skip=_skip(step))
    broker = _broker(settings, faults)
    _persist_hits(monkeypatch, faults)
    _worker_waits_for_the_loop(monkeypatch)
    count = [0]
    reused = 0
    for _ in range(5):
        clients = _InFlightClients(broker, mode, count)
        engine = clients.engine = Engine(settings, clients=clients)
        clients.on_idle = _stop_when_folded(engine)
        try:
            engine.run()
        except Crash:
            for task in engine.tasks.values():
                task.store.abandon()
            continue
        finally:
            reused += clients.reused_after_lost
        if _done(broker, settings):
            break
    assert _done(broker, settings), "inputs still uncommitted after 5 engine processes"
    assert faults.fired == 1, f"{step} was never reached"
    if mode == "lost at fault":
        assert count[0] == 1, "the assignment was never lost after the fault"
    else:
        assert (count[0] > 0) is OVERLAP["overlap"]
    assert reused == 0, "a consumer was used again after its assignment was lost"
    _check_replay(broker, settings)


class _UnreadOffsetClients(FakeClients):
    """The second assignment's committed-offset read fails for one partition (an error in
    that partition's entry, the call itself returning)."""

    def __init__(self, broker: FakeBroker) -> None:
        super().__init__(broker)
        self.reads = 0

    def consumer(self, settings: Settings) -> ConsumerLike:
        clients = self

        class Consumer(FakeConsumer):
            def committed(
                self, partitions: list[TopicPartition], timeout: float = -1
            ) -> list[TopicPartition]:
                out = super().committed(partitions, timeout)
                clients.reads += 1
                if clients.reads == 2:  # TopicPartition's error cannot be set from Python
                    error = KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
                    unread = SimpleNamespace(
                        topic=out[0].topic,
                        partition=out[0].partition,
                        offset=-1001,
                        metadata=None,
                        error=error,
                    )
                    out[0] = cast(TopicPartition, unread)
                return out

        return Consumer(self.broker, lambda: self.on_idle(), self.batch)


def test_a1_with_a_partition_unread_rejoins_instead_of_folding_it_from_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read as "nothing committed", the partition would be folded again from offset 0 and
    every input on it answered twice."""
    settings = _settings(tmp_path)
    broker = _broker(settings, Faults(step="persist", kind="crash", skip=1))
    _persist_hits(monkeypatch, broker.faults)
    clients = _UnreadOffsetClients(broker)
    _run_until_done(settings, broker, shared=clients)
    _check_replay(broker, settings)
    assert clients.reads >= 3, "the unread assignment was not retried"


def test_an_owner_mark_with_a_partition_error_rejoins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The synchronous offset commit reports a partition's failure in the returned list
    without raising; read as written, that partition would be folded with no mark, its owner
    invisible to the next A0, and a late mark could land after our transactional commits."""
    settings = _settings(tmp_path)
    faults = Faults(step="owner mark", kind="partition")
    broker = _broker(settings, faults)
    _run_until_done(settings, broker)
    assert faults.fired == 1, "the owner mark was never reached"
    assert broker.clients_created >= 2, "a partition not marked must rejoin with new clients"
    _check_replay(broker, settings)
