"""COMMIT_PROTOCOL.md, "Overlap": only a commit that records wait behind runs steps 4-5 in the
worker; one started because librdkafka's queue was drained runs them in the loop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.runtime.commit.commit import Commit
from engine.runtime.engine import Engine
from engine.runtime.intake import intake
from engine.settings import load_settings
from engine.wire import Codec
from tests.unit.runtime.fakes import FakeBroker, FakeClients, Faults
from tools.bench_fold import build_log

CODEC = Codec()


def _commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_events: int) -> tuple[int, int]:
    """Every input of a small log folded with overlap on, a commit every `max_events` folds
    at most: (commits the loop waited for, commits handed to the worker)."""
    settings = load_settings(
        environ={},
        commit_overlap=True,
        commit_max_events=max_events,
        partitions=2,
        state_dir=tmp_path / "state",
        metrics_port=0,
    )
    broker = FakeBroker(2, Faults())
    events = build_log(40)
    for event in events:
        broker.append(
            settings.topics.topic_for(event), event.session_id.encode(), CODEC.encode(event)
        )
    counts = {"waited": 0, "overlapped": 0}
    commit_steps, start_worker = Commit.commit_steps, Commit.start_worker

    def waited(self: Commit) -> None:
        if threading.current_thread().name != "commit":  # not the worker's own call
            counts["waited"] += 1
        commit_steps(self)

    def overlapped(self: Commit) -> None:
        counts["overlapped"] += 1
        start_worker(self)

    monkeypatch.setattr(Commit, "commit_steps", waited)
    monkeypatch.setattr(Commit, "start_worker", overlapped)
    clients = FakeClients(broker, batch=8)
    engine = Engine(settings, clients=clients)

    def stop_when_folded() -> None:
        txn = engine.transactions
        if not len(engine.order) and (txn is None or not txn.open):
            engine.stop()

    clients.on_idle = stop_when_folded
    engine.run()
    # the stop's last commit runs in the loop whatever the policy: every input is committed
    assert all(
        broker.offsets.get((t, p), 0) == len(broker.log(t, p))
        for t in settings.topics.inputs
        for p in range(2)
    )
    return counts["waited"], counts["overlapped"]


def test_a_commit_started_because_the_queue_was_drained_is_not_overlapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each consume returns at most 8 records, less than a full batch: always drained
    waited, overlapped = _commits(tmp_path, monkeypatch, max_events=5)
    assert waited > 0
    assert overlapped == 0


def test_a_commit_with_records_waiting_behind_it_is_overlapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a full batch at every consume: records wait behind each commit the size bound starts
    monkeypatch.setattr(intake, "CONSUME_BATCH", 2)
    _, overlapped = _commits(tmp_path, monkeypatch, max_events=5)
    assert overlapped > 0
