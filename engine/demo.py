"""`reconciler demo`: scripted runners through the interesting cases, decisions as a table.

Each case is one session: a runner registers a pending write (the tail before it: a user message
and a tool call; the batch: the tool's output), the append fails in some way, and a restored
runner rereads the Session tail and asks whether it may continue. The restore happens after the
crashed runner's lease lapsed (`LEASE_MS` of event time); before that, the engine withholds
authority from anyone else (HELD_BY_OTHER).
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from engine.admin.explain import session_decisions
from engine.admin.topics import create_topics
from engine.core.digest import item_facts
from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Binding,
    Decision,
    Event,
    IntentEvent,
    IntentKind,
    PendingRecord,
    RepairEvent,
    RepairResolution,
    ResumeEvent,
)
from engine.core.state import LEASE_MS
from engine.settings import Settings
from engine.wire import Codec

USER = {"role": "user", "content": "refund order 7"}
CALL = {"type": "function_call", "call_id": "refund-1", "name": "refund", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "refund-1", "output": "refunded"}
OTHER = {"role": "assistant", "content": "written by someone else"}
BINDING = Binding(backend_id="sqlite:demo", namespace="demo")


@dataclass(frozen=True)
class Case:
    name: str
    story: str
    tail: list[dict[str, Any]]
    ack: AckOutcome
    copies: int = 1
    repair: RepairResolution | None = None


CASES = [
    Case("lost-ack", "append committed, ack lost", [USER, CALL, OUTPUT], AckOutcome.UNKNOWN),
    Case("atomic-failure", "append failed, nothing written", [USER, CALL], AckOutcome.UNKNOWN),
    Case("ambiguous", "someone else wrote meanwhile", [USER, CALL, OTHER], AckOutcome.UNKNOWN),
    Case("two-copies", "one checkpoint restored twice", [USER, CALL], AckOutcome.UNKNOWN, 2),
    Case(
        "repaired",
        "ambiguous, operator accepts absent",
        [USER, CALL, OTHER],
        AckOutcome.UNKNOWN,
        repair=RepairResolution.ACCEPT_ABSENT,
    ),
]


def _digests(items: list[dict[str, Any]]) -> list[str]:
    return [item_facts(item, ignore_ids=False).digest for item in items]


def case_events(case: Case, run: str, now_ms: int) -> list[list[Event]]:
    """The case's events in waves: each wave is produced after the previous one is decided."""
    sid = f"{run}-{case.name}"
    batch = [item_facts(OUTPUT, ignore_ids=False)]
    before = _digests([USER, CALL])
    setup: list[Event] = [
        IntentEvent(
            event_id=f"{sid}/intent",
            session_id=sid,
            event_time_ms=now_ms,
            kind=IntentKind.REGISTER,
            intent_id="w1",
            runner_id="runner-1",
            binding=BINDING,
            before=before,
            items=batch,
            persisted_count=1,
            sequence=1,
        ),
        AckEvent(
            event_id=f"{sid}/ack",
            session_id=sid,
            event_time_ms=now_ms + 1,
            intent_id="w1",
            runner_id="runner-1",
            outcome=case.ack,
            source=AckSource.RUNNER,
        ),
    ]
    record = PendingRecord(intent_id="w1", items=batch, before=before, persisted_count=1)
    now_ms += LEASE_MS + 1_000  # the restored runners start after the crashed one's lease
    waves: list[list[Event]] = [setup]
    for copy in range(case.copies):
        waves.append(
            [
                ResumeEvent(
                    event_id=f"{sid}/resume-{copy + 1}",
                    session_id=sid,
                    event_time_ms=now_ms + 10 + copy,
                    runner_id=f"restored-{copy + 1}",
                    checkpoint_id="checkpoint-1",
                    binding=BINDING,
                    pending=record,
                    observed_tail=_digests(case.tail),
                    checkpoint_sequence=1,
                )
            ]
        )
    if case.repair is not None:
        waves.append(
            [
                RepairEvent(
                    event_id=f"{sid}/repair",
                    session_id=sid,
                    event_time_ms=now_ms + 20,
                    resolution=case.repair,
                    actor="demo-operator",
                    reason="checked the store by hand",
                    intent_id="w1",
                )
            ]
        )
        waves.append(
            [
                ResumeEvent(
                    event_id=f"{sid}/resume-after-repair",
                    session_id=sid,
                    event_time_ms=now_ms + 30,
                    runner_id="restored-1",
                    checkpoint_id="checkpoint-1",
                    binding=BINDING,
                    pending=record,
                    observed_tail=_digests(case.tail),
                    checkpoint_sequence=1,
                )
            ]
        )
    return waves


def _produce(settings: Settings, codec: Codec, events: list[Event]) -> None:
    producer = Producer(settings.client_config(partitioner="murmur2_random", acks="all"))
    for event in events:
        producer.produce(
            settings.topics.topic_for(event),
            key=event.session_id.encode(),
            value=codec.encode(event),
        )
    producer.flush(30)


def _answers(
    settings: Settings, codec: Codec, events: list[Event], timeout_s: float = 60
) -> dict[str, Decision]:
    wanted = {e.event_id for e in events}
    deadline = time.monotonic() + timeout_s
    found: dict[str, Decision] = {}
    while time.monotonic() < deadline:
        for sid in {e.session_id for e in events}:
            for d in session_decisions(settings, sid, codec):
                key = d.in_reply_to
                if key in wanted and (d.final or key not in found):
                    found[key] = d
        if wanted <= found.keys() and all(d.final for d in found.values()):
            return found
        time.sleep(0.3)
    raise TimeoutError("the engine did not decide in time: is `reconciler run` up?")


def run_demo(settings: Settings) -> str:
    codec = Codec()
    run = f"demo-{uuid.uuid4().hex[:6]}"
    now_ms = int(time.time() * 1000)
    rows = [("case", "what happened", "request", "verdict", "reason", "fence", "holder")]
    for case in CASES:
        for wave in case_events(case, run, now_ms):
            _produce(settings, codec, wave)
            answers = _answers(settings, codec, wave)
            for event in wave:
                if isinstance(event, ResumeEvent | RepairEvent):
                    d = answers[event.event_id]
                    rows.append(
                        (
                            case.name,
                            case.story,
                            event.event_id.split("/")[-1],
                            d.verdict,
                            d.reason,
                            str(d.fence_token or "-"),
                            d.holder or "-",
                        )
                    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


def run_embedded(settings: Settings) -> str:
    """Create fresh topics, run an engine in this process for the demo, stop it."""
    from engine.runtime.engine import Engine

    prefix = f"demo-{uuid.uuid4().hex[:6]}."
    with tempfile.TemporaryDirectory() as state_dir:
        local = settings.model_copy(
            update={
                "topic_prefix": prefix,
                "group_id": f"{prefix}engine",
                "state_dir": Path(state_dir),
                "metrics_port": 0,
                "commit_interval_ms": 50,
            }
        )
        create_topics(local)
        engine = Engine(local)
        thread = threading.Thread(target=engine.run, daemon=True)
        thread.start()
        try:
            return run_demo(local)
        finally:
            engine.stop()
            thread.join(60)
