"""An example runner service: a real openai-agents agent behind the reconciler.

The agent (driven by `agents.testing.ScriptedModel`) calls a ``charge`` tool that needs approval
and has a side effect. The service:

1. runs until the approval park and saves a checkpoint envelope;
2. resumes the approved run with the Session append failing at the chosen point (``--crash``),
   then "dies" after saving the checkpoint the SDK left (it carries the pending write);
3. is restored TWICE from that same checkpoint, as two processes would be, concurrently;
   each asks the engine, and only a granted copy lets the SDK continue.

It prints each decision, the charges made and the final Session history. Needs the broker and
the engine (``make run``), e.g.:

    .venv/bin/python examples/runner_service.py --bootstrap 127.0.0.1:9092 --crash before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

from agents import Agent, Runner, function_tool
from agents.testing import ScriptedModel
from agents.testing.model import assistant_message, function_call

from consumers import (
    Checkpoint,
    ContinuationWithheldError,
    ReconcilerClient,
)
from consumers.agents import (
    FencedSQLiteSession,
    ReconciledSession,
    restore_run_state,
)
from consumers.client import wall_clock_ms

LEASE_LAPSED_MS = 61_000  # the restored copies start after the dead runner's lease ran out
CHARGES: list[int] = []


@function_tool(needs_approval=True)
def charge(amount: int) -> str:
    """Charge the customer (a side effect that must happen once)."""
    CHARGES.append(amount)
    return f"receipt-{amount}"


def agent(steps: list[Any]) -> Agent[Any]:
    return Agent(name="billing", model=ScriptedModel(steps), tools=[charge])


class CrashingStore(FencedSQLiteSession):
    """The fenced SQLite store; the next append fails the way ``crash`` says."""

    crash: str | None = None

    async def add_items(self, items: list[Any]) -> None:
        crash, self.crash = self.crash, None
        if crash == "before":
            raise RuntimeError("crash before the append committed")
        await super().add_items(items)
        if crash == "after":
            raise RuntimeError("crash after the append committed (ack lost)")


def session(
    args: argparse.Namespace, runner: str, db: Path, *, shift_ms: int = 0
) -> tuple[ReconciledSession, CrashingStore, ReconcilerClient]:
    client = ReconcilerClient(
        args.bootstrap,
        runner_id=runner,
        topic_prefix=args.prefix,
        clock=lambda: wall_clock_ms() + shift_ms,
    )
    store = CrashingStore(args.session, db)
    wrapped = ReconciledSession(
        store, client, backend_id="sqlite", namespace=str(db), restored=bool(shift_ms)
    )
    return wrapped, store, client


async def first_process(args: argparse.Namespace, db: Path) -> Checkpoint:
    wrapped, store, client = session(args, "runner-1", db)
    billing = agent(
        [[function_call("charge", {"amount": 7}, call_id="charge-7")], [assistant_message("done")]]
    )
    result = await Runner.run(billing, "charge 7", session=wrapped)
    state = result.to_state()
    state.approve(result.interruptions[0])
    store.crash = args.crash
    try:
        await Runner.run(billing, state, session=wrapped)
        print("process 1: finished without a crash")
    except RuntimeError as exc:
        print(f"process 1: {exc}; charges so far {CHARGES}")
    checkpoint = wrapped.checkpoint(state)
    client.close()
    return checkpoint


async def restored_process(args: argparse.Namespace, db: Path, name: str, saved: str) -> None:
    wrapped, _store, client = session(args, name, db, shift_ms=LEASE_LAPSED_MS)
    billing = agent([[assistant_message("done")]])
    try:
        state, outcome = await restore_run_state(billing, Checkpoint.from_json(saved), wrapped)
    except ContinuationWithheldError as exc:
        print(f"{name}: WITHHELD {exc.reason.value}, holder {exc.holder}: {exc.fix}")
        client.close()
        return
    decision = outcome.decision
    print(
        f"{name}: {type(outcome).__name__} ({decision.reason.value}), fence {decision.fence_token}"
    )
    result = await Runner.run(billing, state, session=wrapped)
    print(f"{name}: final output {result.final_output!r}")
    client.close()


async def main(args: argparse.Namespace) -> None:
    db = Path(tempfile.mkdtemp()) / "sessions.db"
    saved = (await first_process(args, db)).to_json()
    await asyncio.gather(*(restored_process(args, db, n, saved) for n in ("copy-a", "copy-b")))
    history = await FencedSQLiteSession(args.session, db).get_items()
    print(f"charges: {CHARGES} (the tool ran {len(CHARGES)} time(s))")
    print("history:", json.dumps([i.get("type", i.get("role")) for i in history]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--prefix", default="reconciler.")
    parser.add_argument("--session", default=f"example-{uuid.uuid4().hex[:6]}")
    parser.add_argument("--crash", choices=("before", "after"), default="before")
    asyncio.run(main(parser.parse_args()))
