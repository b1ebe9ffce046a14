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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consumers import messages
from consumers.client import ReconcilerClient
from engine.admin.brokers import quiet_config
from engine.admin.topics import create_topics, delete_topics
from engine.core.digest import digests, item_facts
from engine.core.events import (
    AckOutcome,
    Binding,
    Decision,
    Event,
    PendingRecord,
    RepairEvent,
    RepairResolution,
)
from engine.core.state import LEASE_MS
from engine.errors import EngineError
from engine.settings import Settings

USER = {"role": "user", "content": "refund order 7"}
CALL = {"type": "function_call", "call_id": "refund-1", "name": "refund", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "refund-1", "output": "refunded"}
OTHER = {"role": "assistant", "content": "written by someone else"}
BINDING = Binding(backend_id="sqlite:demo", namespace="demo")
ANSWER_TIMEOUT_S = 60.0


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


class _Runners:
    """One `ReconcilerClient` per runner identity, all on the demo's event-time clock."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.now_ms = int(time.time() * 1000)
        self._clients: dict[str, ReconcilerClient] = {}

    def client(self, runner_id: str) -> ReconcilerClient:
        if runner_id not in self._clients:
            config = quiet_config(self.settings)
            self._clients[runner_id] = ReconcilerClient(
                str(config.pop("bootstrap.servers")),
                runner_id=runner_id,
                topic_prefix=self.settings.topic_prefix,
                kafka_config=config,
                clock=lambda: self.now_ms,
            )
        return self._clients[runner_id]

    def ask(self, runner_id: str, event: Event) -> Decision:
        """Produce through the runner client and wait for the engine's final answer by id."""
        decision = self.client(runner_id).submit(event, timeout_s=ANSWER_TIMEOUT_S)
        if decision is None:
            raise EngineError(
                f"the engine did not answer {event.event_id} within {ANSWER_TIMEOUT_S:g} s.",
                "check that `reconciler run` is up (or use --embedded-engine).",
            )
        return decision

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


def _play(case: Case, sid: str, runners: _Runners) -> list[tuple[str, Decision]]:
    """The case through the runner client; returns (request, decision) of resumes and repairs."""
    record = PendingRecord(
        intent_id="w1",
        items=[item_facts(OUTPUT, ignore_ids=False)],
        before=digests([USER, CALL], ignore_ids=False),
        persisted_count=1,
    )
    runners.ask(
        "runner-1",
        messages.intent_event(
            event_id=f"{sid}/intent",
            session_id=sid,
            at_ms=runners.now_ms,
            intent_id="w1",
            runner_id="runner-1",
            binding=BINDING,
            items=[OUTPUT],
            before_tail=[USER, CALL],
            sequence=1,
            persisted_count=1,
        ),
    )
    runners.ask(
        "runner-1",
        messages.ack_event(
            event_id=f"{sid}/ack",
            session_id=sid,
            at_ms=runners.now_ms + 1,
            intent_id="w1",
            runner_id="runner-1",
            outcome=case.ack,
        ),
    )
    at = runners.now_ms + LEASE_MS + 1_000  # the restored runners start after the crashed lease

    def resume(name: str, runner: str, offset_ms: int) -> tuple[str, Decision]:
        event = messages.resume_event(
            request_id=f"{sid}/{name}",
            session_id=sid,
            at_ms=at + offset_ms,
            runner_id=runner,
            checkpoint_id="checkpoint-1",
            binding=BINDING,
            pending=record,
            observed_tail=case.tail,
            checkpoint_sequence=1,
        )
        return name, runners.ask(runner, event)

    rows = [
        resume(f"resume-{copy + 1}", f"restored-{copy + 1}", 10 + copy)
        for copy in range(case.copies)
    ]
    if case.repair is not None:
        command = RepairEvent(
            event_id=f"{sid}/repair",
            session_id=sid,
            event_time_ms=at + 20,
            resolution=case.repair,
            actor="demo-operator",
            reason="checked the store by hand",
            intent_id="w1",
        )
        rows.append(("repair", runners.ask("demo-operator", command)))
        rows.append(resume("resume-after-repair", "restored-1", 30))
    return rows


def run_demo(settings: Settings) -> str:
    """Play every case against a running engine; the decisions as a table."""
    run = f"demo-{uuid.uuid4().hex[:6]}"
    rows = [("case", "what happened", "request", "verdict", "reason", "fence", "holder")]
    runners = _Runners(settings)
    try:
        for case in CASES:
            for request, d in _play(case, f"{run}-{case.name}", runners):
                fence = str(d.fence_token or "-")
                rows.append(
                    (case.name, case.story, request, d.verdict, d.reason, fence, d.holder or "-")
                )
    finally:
        runners.close()
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


@contextmanager
def _demo_topics(settings: Settings) -> Iterator[None]:
    """Fresh topics for one demo run, deleted afterwards (a demo leaves nothing behind)."""
    create_topics(settings)
    try:
        yield
    finally:
        delete_topics(settings)


def run_embedded(settings: Settings) -> str:
    """Create fresh topics, run an engine in this process for the demo, stop it, delete them."""
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
        with _demo_topics(local):
            engine = Engine(local)
            thread = threading.Thread(target=engine.run, daemon=True)
            thread.start()
            try:
                return run_demo(local)
            finally:
                engine.stop()
                thread.join(60)
