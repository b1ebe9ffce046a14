"""Resume an openai-agents run through the reconciler: ask first, then let the SDK continue.

`resume_from_checkpoint` reads the RunState's ``pending_session_write`` with the SDK's own
acceptance rules, rereads the Session tail exactly as the SDK will (``len(before) + N`` items),
asks the engine, and hands the answer to the `ReconciledSession`:

* `ContinueWithoutReplay`: the batch is in the Session; the SDK will classify it committed and
  not append it again;
* `AppendOnce`: the batch is absent; the SDK appends it once, under the granted fence (claimed
  in a fencing store before anything else can write);
* `Withheld`: stop; `restore_run_state` raises `ContinuationWithheldError` and the wrapper
  refuses every later append.

Fails closed with `CheckpointError` where the engine cannot be asked truthfully: a pending
write with no registered intent (a checkpoint not made by `ReconciledSession.checkpoint`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents import Agent
from agents.run_state import RunState
from msgspec.structs import replace

from consumers.agents.session import ReconciledSession
from consumers.checkpoint import Checkpoint
from consumers.errors import CheckpointError, ContinuationWithheldError, SdkCheckpointError
from consumers.messages import tail_limit
from consumers.outcomes import ResumeOutcome, Withheld
from consumers.sdk_checkpoint import pending_record, read_pending_session_write
from engine.core.events import Cause, PendingRecord

UNCOVERED_TAIL_ITEMS = 32
"""Tail items a resume without a pending record carries: enough for the engine to compare an
open write's ``before`` + batch with it when the checkpoint never covered that write."""


def pending_of(checkpoint: Checkpoint, *, ignore_ids: bool) -> PendingRecord | None:
    """The payload-free pending record of the checkpoint, or `CheckpointError`."""

    def refuse(detail: str) -> CheckpointError:
        return CheckpointError(
            detail, session_id=checkpoint.session_id, checkpoint_id=checkpoint.checkpoint_id
        )

    try:
        write = read_pending_session_write(checkpoint.run_state)
    except SdkCheckpointError as exc:
        raise refuse(exc.detail) from exc
    if write is None:
        return None
    if write.session_id != checkpoint.session_id:
        raise refuse(f"its pending write names session {write.session_id!r}")
    if checkpoint.pending_intent_id is None:
        raise refuse("its pending write was never registered with the reconciler")
    try:
        record = pending_record(
            write, intent_id=checkpoint.pending_intent_id, ignore_ids=ignore_ids
        )
    except SdkCheckpointError as exc:
        raise refuse(exc.detail) from exc
    # The real counter: the engine compares it with the intent's whenever the intent knew it.
    return record


def checkpoint_schema_version(checkpoint: Checkpoint) -> str:
    """The RunState schema label the checkpoint was written under (part of the binding)."""
    label = checkpoint.run_state.get("$schemaVersion")
    if not isinstance(label, str):
        raise CheckpointError(
            "its RunState carries no $schemaVersion label",
            session_id=checkpoint.session_id,
            checkpoint_id=checkpoint.checkpoint_id,
        )
    return label


async def resume_from_checkpoint(
    session: ReconciledSession, checkpoint: Checkpoint, *, timeout_s: float = 15.0
) -> ResumeOutcome:
    """Ask the engine whether ``checkpoint`` may continue on ``session``; adopt the answer."""
    if checkpoint.session_id != session.session_id:
        raise CheckpointError(
            f"it belongs to session {checkpoint.session_id!r}, not {session.session_id!r}",
            session_id=session.session_id,
            checkpoint_id=checkpoint.checkpoint_id,
        )
    pending = pending_of(checkpoint, ignore_ids=session.binding.ignore_ids)
    # With no record the SDK rereads nothing; the engine gets a window anyway, so that a write
    # the checkpoint never covered (an uncovered append) is judged on the tail at once.
    limit = tail_limit(pending) if pending is not None else UNCOVERED_TAIL_ITEMS
    tail = await session.inner.get_items(limit=limit) if limit else []
    binding = replace(
        session.binding, checkpoint_schema_version=checkpoint_schema_version(checkpoint)
    )
    outcome = await asyncio.to_thread(
        lambda: session.client.resume(
            session_id=session.session_id,
            binding=binding,
            checkpoint_id=checkpoint.checkpoint_id,
            checkpoint_sequence=checkpoint.sequence,
            pending=pending,
            observed_tail=tail,
            timeout_s=timeout_s,
            checkpoint_session_id=checkpoint.session_id,
            after=[Cause(producer=c.producer, seq=c.seq) for c in checkpoint.after],
        )
    )
    await asyncio.to_thread(session.adopt, outcome, checkpoint)
    return outcome


async def restore_run_state(
    agent: Agent[Any],
    checkpoint: Checkpoint,
    session: ReconciledSession,
    *,
    timeout_s: float = 15.0,
) -> tuple[RunState[Any, Any], ResumeOutcome]:
    """The RunState to pass to ``Runner.run(agent, state, session=session)``, if granted.

    Raises `ContinuationWithheldError` when withheld, `ResumeTimeoutError` when the engine did
    not answer: in both cases the run must not continue.
    """
    outcome = await resume_from_checkpoint(session, checkpoint, timeout_s=timeout_s)
    if isinstance(outcome, Withheld):
        raise ContinuationWithheldError(
            session_id=session.session_id,
            request_id=outcome.decision.in_reply_to,
            reason=outcome.reason,
            holder=outcome.holder,
            operator_action=outcome.operator_action,
        )
    state = await RunState.from_json(agent, checkpoint.run_state)
    return state, outcome
