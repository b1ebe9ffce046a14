"""The smallest runner service integration (the README's dozen lines, type-checked here).

``save``/``load`` stand for the application's own checkpoint store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents import Agent, Runner

from consumers import Checkpoint, ReconcilerClient
from consumers.agents import (
    FencedSQLiteSession,
    ReconciledSession,
    restore_run_state,
)

client = ReconcilerClient("127.0.0.1:9092", runner_id="billing-pod-0")


def session_for(sid: str, *, restored: bool = False) -> ReconciledSession:
    store = FencedSQLiteSession(sid, "sessions.db")  # keeps the fence token with the history
    return ReconciledSession(store, client, backend_id="sqlite-main", restored=restored)


async def run(agent: Agent[Any], sid: str, text: str, save: Callable[[str], None]) -> None:
    session = session_for(sid)  # every append: durable intent -> append -> ack
    result = await Runner.run(agent, text, session=session)
    save(session.checkpoint(result.to_state()).to_json())  # instead of state.to_json()


async def after_restart(agent: Agent[Any], sid: str, load: Callable[[], str]) -> None:
    session = session_for(sid, restored=True)  # may not append until the engine grants it
    state, _outcome = await restore_run_state(agent, Checkpoint.from_json(load()), session)
    await Runner.run(agent, state, session=session)  # raised above if withheld or unanswered
