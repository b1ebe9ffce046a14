"""Shared pieces of the runner-side SDK tests: a world that hands out clients (over Kafka, or
folding in-process), a faulty fenced SQLite store, and the approval-gated agent."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents import Agent, GuardrailFunctionOutput, Runner, function_tool, output_guardrail
from agents.agent import StopAtTools
from agents.items import TResponseInputItem
from agents.testing import ScriptedModel
from agents.testing.model import assistant_message, function_call

from consumers.agents.fenced_sqlite import FencedSQLiteSession
from consumers.agents.session import ReconciledSession
from consumers.checkpoint import Checkpoint
from consumers.client import Clock, ReconcilerApi, wall_clock_ms
from consumers.errors import AppendNotWrittenError
from engine.core.state import LEASE_MS
from tests.unit.consumers.fold_client import FoldClient, FoldEngine

AFTER_LEASE_MS = LEASE_MS + 1_000
"""A restored runner starts after the crashed runner's lease lapsed (its clock is shifted)."""


class FaultySession(FencedSQLiteSession):
    """The fenced store with one injectable fault on the next append."""

    fault: str | None = None  # before | after | partial | rollback

    def _insert_items(self, conn: sqlite3.Connection, items: list[TResponseInputItem]) -> None:
        super()._insert_items(conn, items)
        if self.fault == "rollback":  # inside the store's transaction, after the rows went in
            raise sqlite3.OperationalError("disk I/O error")

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if self.fault == "rollback":
            try:
                await super().add_items(items)
            finally:
                self.fault = None
            return
        fault, self.fault = self.fault, None
        if fault == "before":
            raise RuntimeError("store unavailable: nothing written")
        if fault == "partial":
            await super().add_items(items[:1])
            raise RuntimeError("connection dropped after the first item")
        await super().add_items(items)
        if fault == "after":
            raise RuntimeError("acknowledgement lost after commit")


ClientFactory = Callable[[str, Clock], ReconcilerApi]


@dataclass
class World:
    """Hands out runner clients and stores; ``make_client`` decides where events go."""

    make_client: ClientFactory
    tmp: Path
    clients: list[ReconcilerApi] = field(default_factory=list)
    fold_engine: FoldEngine | None = None  # set when events are folded in-process

    def client(self, runner_id: str, *, shift_ms: int = 0) -> ReconcilerApi:
        client = self.make_client(runner_id, lambda: wall_clock_ms() + shift_ms)
        self.clients.append(client)
        return client

    def session(
        self,
        sid: str,
        client: ReconcilerApi,
        *,
        restored: bool = False,
        ignore_ids: bool | None = None,
    ) -> ReconciledSession:
        store = FaultySession(sid, self.tmp / f"{sid}.db")
        return ReconciledSession(
            store,
            client,
            backend_id="sqlite",
            namespace="runner-tests",
            restored=restored,
            ignore_ids=ignore_ids,
        )


def fold_world(tmp: Path) -> World:
    """A world whose clients fold their events in-process with the engine's pure core."""
    engine = FoldEngine()
    return World(lambda runner, clock: FoldClient(engine, runner, clock), tmp, fold_engine=engine)


@dataclass
class Effects:
    """The outside world a tool touches: each charge is one side effect."""

    charges: list[int] = field(default_factory=list)


@output_guardrail
async def always_fine(_ctx: Any, _agent: Any, _output: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered=False)


def make_agent(effects: Effects, steps: list[Any], *, held: bool = False) -> Agent[Any]:
    """The billing agent. ``held=True`` makes the SDK hold the parked response in the RunState
    instead of the Session (output guardrails with a non-default tool_use_behavior)."""

    @function_tool(needs_approval=True)
    def charge(amount: int) -> str:
        """Charge the customer."""
        effects.charges.append(amount)
        return f"receipt-{amount}"

    if not held:
        return Agent(name="billing", model=ScriptedModel(steps), tools=[charge])
    return Agent(
        name="billing",
        model=ScriptedModel(steps),
        tools=[charge],
        output_guardrails=[always_fine],
        tool_use_behavior=StopAtTools(stop_at_tool_names=["finish"]),
    )


def first_steps(*amounts: int) -> list[Any]:
    calls = [function_call("charge", {"amount": a}, call_id=f"charge-{a}") for a in amounts]
    return [calls, [assistant_message("done")]]


def resumed_steps() -> list[Any]:
    return [[assistant_message("done")]]


async def park_for_approval(
    session: ReconciledSession, effects: Effects, *amounts: int, held: bool = False
) -> tuple[Agent[Any], Any]:
    """A fresh run up to the approval park; returns the agent and the approved RunState."""
    agent = make_agent(effects, first_steps(*amounts), held=held)
    result = await Runner.run(agent, f"charge {amounts}", session=session)
    state = result.to_state()
    for interruption in result.interruptions:
        state.approve(interruption)
    return agent, state


async def crash_on_resumed_append(
    session: ReconciledSession, agent: Agent[Any], state: Any, fault: str
) -> Checkpoint:
    """Resume the approved run, fail its append with ``fault``, checkpoint like an app would."""
    store = session.inner
    assert isinstance(store, FaultySession)
    store.fault = fault
    try:
        await Runner.run(agent, state, session=session)
    except (RuntimeError, AppendNotWrittenError):
        pass
    else:
        raise AssertionError("the fault did not fire")
    # What the application stores, round-tripped through text like a real checkpoint store.
    return Checkpoint.from_json(session.checkpoint(state).to_json())


async def history(sid: str, tmp: Path) -> list[dict[str, Any]]:
    plain = FencedSQLiteSession(sid, tmp / f"{sid}.db")
    try:
        return [json.loads(json.dumps(i)) for i in await plain.get_items()]
    finally:
        plain.close()


def kinds(items: list[dict[str, Any]]) -> list[str]:
    return [f"{i.get('type', 'message')}:{i.get('call_id', i.get('role', ''))}" for i in items]


def assert_pairs_once(items: list[dict[str, Any]]) -> None:
    """Every call once, its output once, after it: no duplicate and no lost history."""
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert sorted(calls) == sorted(set(calls)), f"duplicated call: {kinds(items)}"
    assert sorted(outputs) == sorted(calls), f"lost or duplicated output: {kinds(items)}"
