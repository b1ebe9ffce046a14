"""The Java example runner (`examples/java-runner/`), written from `schemas/SPEC.md` only:
its digests equal the shared vectors, it gets its answers from the real engine, and it shares
a session with the Python client (each side's digests are compared by the engine)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumers.client import ReconcilerClient
from consumers.outcomes import AppendOnce, ContinueWithoutReplay
from engine.core.digest import digests, item_facts
from engine.core.events import AckOutcome, Binding, PendingRecord
from engine.core.state import LEASE_MS
from engine.settings import Settings
from engine.wire.values import from_record
from tests.integration.engine_harness import engine_settings, engine_thread, read_decisions
from tools import java_runner

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
RUN_TIMEOUT_S = 180  # a safety net for a hung JVM, not a measurement
USER = {"role": "user", "content": "ship order 9 to Zürich 🚚"}
CALL = {
    "type": "function_call",
    "id": "fc_9",
    "call_id": "ship-9",
    "name": "ship",
    "arguments": "{}",
}
OUT = {"type": "function_call_output", "call_id": "ship-9", "output": "shipped", "created_by": "x"}
BINDING = {"backend_id": "mem:java", "namespace": "interop", "ignore_ids": False}


@pytest.fixture(scope="module")
def built() -> None:
    java_runner.build()


def _java(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        java_runner.command(*args),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def test_java_digests_and_partitions_equal_the_shared_vectors(built: None) -> None:
    vectors = json.loads((SCHEMAS / "digest_vectors.json").read_text("utf-8"))
    done = _java("vectors", str(SCHEMAS / "digest_vectors.json"))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    expected = [
        {"name": v["name"], "canonical": v["canonical"], "sha256": v["sha256"]}
        for v in vectors["digests"]
    ] + [
        {"key": v["key"], "murmur2": v["murmur2"], "partition": v["partition"]}
        for v in vectors["partitions"]
    ]
    assert lines == expected


def _play(
    tmp_path: Path, settings: Settings, session_id: str, runner_id: str, steps: list[Any]
) -> list[dict[str, Any]]:
    script = {
        "bootstrap": settings.bootstrap_servers,
        "prefix": settings.topic_prefix,
        "schemas": str(SCHEMAS),
        "session_id": session_id,
        "runner_id": runner_id,
        "binding": BINDING,
        "timeout_ms": 60_000,
        "steps": steps,
    }
    path = tmp_path / f"{session_id}-{runner_id}.json"
    path.write_text(json.dumps(script))
    done = _java("run", str(path))
    assert done.returncode == 0, done.stderr
    answers: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    return answers


def _intent_and_ack(t0: int) -> list[dict[str, Any]]:
    return [
        {
            "op": "intent",
            "event_id": "j-intent",
            "intent_id": "w1",
            "event_time_ms": t0,
            "items": [OUT],
            "before_tail": [USER, CALL],
            "sequence": 1,
        },
        {
            "op": "ack",
            "event_id": "j-ack",
            "intent_id": "w1",
            "event_time_ms": t0 + 1,
            "outcome": "UNKNOWN",
        },
    ]


def _resume(event_id: str, at_ms: int, tail: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "op": "resume",
        "event_id": event_id,
        "event_time_ms": at_ms,
        "checkpoint_id": f"cp-{event_id}",
        "checkpoint_sequence": 1,
        "pending": {"intent_id": "w1", "items": [OUT], "before_tail": [USER, CALL]},
        "observed_tail": tail,
    }


@pytest.fixture
def engine(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, built: None
) -> Iterator[Settings]:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    with engine_thread(settings):
        yield settings


@pytest.mark.kafka
def test_java_runner_against_the_engine(engine: Settings, tmp_path: Path) -> None:
    t0 = 1_700_000_000_000
    lost_ack = _play(
        tmp_path,
        engine,
        "java-lost-ack",
        "java-1",
        [*_intent_and_ack(t0), _resume("j-resume", t0 + LEASE_MS + 1_000, [USER, CALL, OUT])],
    )
    assert [(a["in_reply_to"], a["verdict"]) for a in lost_ack] == [
        ("j-intent", "RECORDED"),
        ("j-ack", "RECORDED"),
        ("j-resume", "CONTINUE"),
    ]
    assert (lost_ack[2]["reason"], lost_ack[2]["classification"]) == ("COMMITTED", "COMMITTED")
    assert lost_ack[2]["source"].startswith(f"{engine.topic_prefix}resumes/")
    absent = _play(
        tmp_path,
        engine,
        "java-absent",
        "java-1",
        [*_intent_and_ack(t0), _resume("j-resume", t0 + LEASE_MS + 1_000, [USER, CALL])],
    )
    resumed = absent[2]
    assert (resumed["verdict"], resumed["reason"]) == ("APPEND_ONCE", "UNCHANGED")
    assert resumed["fence_token"] > 0
    assert resumed["holder"] == "java-1"


@pytest.mark.kafka
def test_java_and_python_share_a_session(engine: Settings, tmp_path: Path) -> None:
    t0 = 1_700_000_000_000
    at = {"now": t0}
    python = ReconcilerClient(
        engine.bootstrap_servers,
        runner_id="python-1",
        topic_prefix=engine.topic_prefix,
        clock=lambda: at["now"],
    )
    binding = from_record(Binding, BINDING)
    try:
        # Python registers and loses the ack; Java restores and finds the batch committed.
        sid = f"mixed-{uuid.uuid4().hex[:6]}"
        python.register_intent(
            session_id=sid,
            binding=binding,
            items=[OUT],
            before_tail=[USER, CALL],
            sequence=1,
            intent_id="w1",
        )
        python.acknowledge(session_id=sid, intent_id="w1", outcome=AckOutcome.UNKNOWN)
        (answer,) = _play(
            tmp_path,
            engine,
            sid,
            "java-2",
            [_resume("j-resume", t0 + LEASE_MS + 1_000, [USER, CALL, OUT])],
        )
        assert (answer["verdict"], answer["reason"]) == ("CONTINUE", "COMMITTED")

        # Java registers and loses the ack; Python restores and finds the batch absent.
        sid = f"mixed-{uuid.uuid4().hex[:6]}"
        _play(tmp_path, engine, sid, "java-3", _intent_and_ack(t0))
        at["now"] = t0 + LEASE_MS + 1_000
        outcome = python.resume(
            session_id=sid,
            binding=binding,
            checkpoint_id="cp-python",
            checkpoint_sequence=1,
            pending=PendingRecord(
                intent_id="w1",
                items=[item_facts(OUT, ignore_ids=False)],
                before=digests([USER, CALL], ignore_ids=False),
            ),
            observed_tail=[USER, CALL],
            timeout_s=60.0,
        )
        assert isinstance(outcome, AppendOnce), outcome
        assert not isinstance(outcome, ContinueWithoutReplay)
    finally:
        python.close()


def _answers_to(engine: Settings, event_id: str, verdict: str, timeout_s: float) -> list[Any]:
    """The engine's decisions answering `event_id`, once one with `verdict` is among them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = read_decisions(engine.bootstrap_servers, engine, until=1, timeout_s=2, idle_s=0.3)
        mine = [s.decision for s in seen if s.decision.in_reply_to == event_id]
        if any(d.verdict.value == verdict for d in mine):
            return mine
    raise AssertionError(f"no {verdict} answer to {event_id} within {timeout_s} s")


@pytest.mark.kafka
def test_a_java_resume_waits_for_the_python_ack_its_checkpoint_names(
    engine: Settings, tmp_path: Path
) -> None:
    """Causal context across languages: the Java resume names the Python runner's ack (the
    last event its checkpoint knew) and reaches the engine first. It is folded only after that
    ack (its answer is the `/final` one), and the ack, folded after the grant it could not have
    seen, is ACCEPTED, as it is when it arrives first."""
    t0 = 1_700_000_000_000
    sid = f"causal-{uuid.uuid4().hex[:6]}"
    python = ReconcilerClient(
        engine.bootstrap_servers,
        runner_id="python-c",
        topic_prefix=engine.topic_prefix,
        clock=lambda: t0,
    )
    binding = from_record(Binding, BINDING)
    script = {
        "bootstrap": engine.bootstrap_servers,
        "prefix": engine.topic_prefix,
        "schemas": str(SCHEMAS),
        "session_id": sid,
        "runner_id": "java-c",
        "binding": BINDING,
        "timeout_ms": 90_000,
        "steps": [
            {
                **_resume("j-resume-c", t0 + LEASE_MS + 1_000, [USER, CALL, OUT]),
                "after": [{"producer": "python-c", "seq": 1}],
            }
        ],
    }
    path = tmp_path / "causal.json"
    path.write_text(json.dumps(script))
    try:
        python.register_intent(
            session_id=sid,
            binding=binding,
            items=[OUT],
            before_tail=[USER, CALL],
            sequence=1,
            intent_id="w1",
        )
        assert python.last_published(sid) is not None
        with subprocess.Popen(
            java_runner.command("run", str(path)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as java:
            try:
                waiting = _answers_to(engine, "j-resume-c", "DEFERRED", timeout_s=90)
                assert [d.decision_id for d in waiting] == ["j-resume-c"]
                python.acknowledge(session_id=sid, intent_id="w1", outcome=AckOutcome.UNKNOWN)
                out, err = java.communicate(timeout=RUN_TIMEOUT_S)
            finally:
                java.kill()
        assert java.returncode == 0, err
        (answer,) = [json.loads(line) for line in out.splitlines()]
        assert answer["decision_id"] == "j-resume-c/final"
        assert (answer["verdict"], answer["reason"]) == ("CONTINUE", "COMMITTED")
        last = python.last_published(sid)
        assert last is not None
        assert last.seq == 1
    finally:
        python.close()
    # The intent's and the ack's answers: both ACCEPTED (the ack is not STALE_FENCE).
    recorded = [
        s.decision
        for s in read_decisions(engine.bootstrap_servers, engine, until=4, timeout_s=30)
        if s.decision.session_id == sid and s.decision.verdict.value == "RECORDED"
    ]
    assert [d.reason.value for d in recorded] == ["ACCEPTED", "ACCEPTED"]
