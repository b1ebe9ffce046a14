"""The opt-in latency trace (engine/runtime/process/trace.py): a line per folded input, written
at its commit, with the loop's steps in the order they happen; and nothing for an aborted batch."""

from __future__ import annotations

import csv
import gc
from pathlib import Path

from engine.runtime.engine import Engine
from engine.runtime.process.trace import LatencyTrace
from engine.settings import load_settings
from tests.integration.engine_harness import CODEC
from tests.unit.runtime.fakes import FakeBroker, FakeClients, Faults
from tools.bench_fold import build_log

STEPS = ("poll", "consumed", "released", "folded", "commit", "flushed", "committed")


def test_every_folded_input_gets_one_line_with_its_steps_in_order(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    settings = load_settings(
        environ={},
        partitions=2,
        state_dir=tmp_path / "state",
        metrics_port=0,
        latency_trace_path=path,
    )
    broker = FakeBroker(2, Faults())
    events = build_log(20)
    for event in events:
        broker.append(
            settings.topics.topic_for(event), event.session_id.encode(), CODEC.encode(event)
        )
    clients = FakeClients(broker, batch=8)
    engine = Engine(settings, clients=clients)
    clients.on_idle = engine.stop
    engine.run()
    assert engine.trace is not None
    engine.trace.close()
    with path.open(encoding="utf-8") as lines:
        rows = list(csv.DictReader(lines))
    assert len(rows) == len(events)
    assert sorted(r["session"] for r in rows) == sorted(e.session_id for e in events)
    for row in rows:
        times = [float(row[step]) for step in STEPS]
        assert times == sorted(times), row


def test_an_aborted_transaction_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    trace = LatencyTrace(path)
    trace.arrived(("t.resumes", 0, 7), 1.0)
    trace.folded(("t.resumes", 0, 7), "s-1")
    trace.aborted()
    trace.committed(flushed_ms=trace.now())
    trace.arrived(("t.resumes", 0, 8), 2.0)
    trace.folded(("t.resumes", 0, 8), "s-2")
    trace.committed(flushed_ms=trace.now())
    trace.close()
    with path.open(encoding="utf-8") as lines:
        rows = list(csv.DictReader(lines))
    assert [(r["session"], r["created"]) for r in rows] == [("s-2", "2.0")]


def test_every_garbage_collection_is_written_beside_the_trace(tmp_path: Path) -> None:
    trace = LatencyTrace(tmp_path / "trace.csv")
    gc.collect()
    trace.close()
    gc.collect()  # after close: not written, and no callback left behind
    with (tmp_path / "trace.csv.gc.csv").open(encoding="utf-8") as lines:
        rows = list(csv.DictReader(lines))
    assert "2" in [row["generation"] for row in rows]
    assert all(float(row["ms"]) >= 0 for row in rows)


def test_an_overlapped_commit_writes_its_own_lines_not_those_folded_ahead(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    trace = LatencyTrace(path)
    trace.arrived(("t.resumes", 0, 1), 1.0)
    trace.folded(("t.resumes", 0, 1), "s-1")
    trace.commit_ms = 10.0
    trace.seal()  # steps 4-5 of the transaction of s-1 go to the worker
    trace.arrived(("t.resumes", 0, 2), 2.0)
    trace.folded(("t.resumes", 0, 2), "s-2")  # folded ahead, into the next transaction
    trace.committed(flushed_ms=11.0, committed_ms=12.0, sealed=True)
    trace.commit_ms = 20.0
    trace.committed(flushed_ms=21.0, committed_ms=22.0)
    trace.close()
    with path.open(encoding="utf-8") as lines:
        rows = [
            (r["session"], r["ahead"], r["commit"], r["committed"]) for r in csv.DictReader(lines)
        ]
    assert rows == [("s-1", "0", "10.0", "12.0"), ("s-2", "1", "20.0", "22.0")]
