"""A backend whose stored items digest differently, a foreign rewrite of the appended batch, and
the store's own COMMITTED ack: its tail is the only evidence of the rewrite, and it is read."""

from __future__ import annotations

import asyncio
from pathlib import Path

from consumers.agents.resume import resume_from_checkpoint
from consumers.agents.session import ReconciledSession
from consumers.client import wall_clock_ms
from consumers.outcomes import ContinueWithoutReplay, ResumeOutcome, Withheld
from engine.core.events import Decision, Reason, RunnerAction, Verdict
from tests.unit.consumers.rewriting_store import RewritingStore
from tests.unit.consumers.sdk_world import (
    AFTER_LEASE_MS,
    Effects,
    crash_on_resumed_append,
    fold_world,
    park_for_approval,
)


def _resume_after_store_ack(
    tmp_path: Path, *, rewrite: bool, next_batch: bool = False
) -> tuple[Decision, ResumeOutcome]:
    world = fold_world(tmp_path)
    engine = world.fold_engine
    assert engine is not None
    sid = "rewritten" if rewrite else "intact"

    async def scenario() -> tuple[Decision, ResumeOutcome]:
        store = RewritingStore(sid, tmp_path / f"{sid}.db")
        session = ReconciledSession(
            store, world.client("runner-a"), backend_id="rewriting", namespace="tests"
        )
        assert session.binding.items_digest_stable is False
        agent, state = await park_for_approval(session, Effects(), 7)
        if rewrite:  # another writer's trigger rewrites the batch's last row in its transaction
            store.rewrite_in_append = {"role": "assistant", "content": "rewritten by someone else"}
        # The batch lands, the runner's own ack is lost (UNKNOWN): only the store knows.
        checkpoint = await crash_on_resumed_append(session, agent, state, "after")
        intent_id = session.open_intent_id
        assert intent_id is not None
        appends = len(store.appends)
        if next_batch:  # the runner's next batch lands before the outbox publishes the ack
            await store.add_items([{"role": "user", "content": "the next batch"}])
        ack = store.commit_ack(intent_id, wall_clock_ms(), append=appends - 1)
        (ack_answer,) = engine.feed(ack)
        restored = ReconciledSession(
            RewritingStore(sid, tmp_path / f"{sid}.db"),
            world.client("runner-b", shift_ms=AFTER_LEASE_MS),
            backend_id="rewriting",
            namespace="tests",
            restored=True,
        )
        outcome = await resume_from_checkpoint(restored, checkpoint)
        return ack_answer, outcome

    return asyncio.run(scenario())


def test_a_rewrite_the_store_ack_saw_is_withheld_not_do_not_replay(tmp_path: Path) -> None:
    ack_answer, outcome = _resume_after_store_ack(tmp_path, rewrite=True)
    # The resume's tail can only be checked by `before` and length on this backend: without
    # the store's tail it was CONTINUE COMMITTED_BY_STORE (do not replay) over a rewrite.
    assert isinstance(outcome, Withheld), outcome
    assert outcome.decision.runner_action is RunnerAction.STOP
    assert outcome.reason is Reason.SESSION_AMBIGUOUS
    assert (ack_answer.verdict, ack_answer.reason, ack_answer.alert) == (
        Verdict.RECORDED,
        Reason.HISTORY_CHANGED,
        True,
    )


def test_an_intact_batch_on_the_rewriting_backend_is_still_do_not_replay(tmp_path: Path) -> None:
    ack_answer, outcome = _resume_after_store_ack(tmp_path, rewrite=False)
    assert (ack_answer.reason, ack_answer.alert) == (Reason.ACCEPTED, False)
    assert isinstance(outcome, ContinueWithoutReplay)
    assert outcome.reason is Reason.COMMITTED_BY_STORE


def test_the_store_acks_tail_is_the_appends_not_the_sessions_when_published(
    tmp_path: Path,
) -> None:
    """An honest store whose outbox publishes after the runner appended its next batch: the
    ack's tail ends at the acked batch (as of its transaction), so it is not HISTORY_CHANGED."""
    ack_answer, _ = _resume_after_store_ack(tmp_path, rewrite=False, next_batch=True)
    assert (ack_answer.verdict, ack_answer.reason, ack_answer.alert) == (
        Verdict.RECORDED,
        Reason.ACCEPTED,
        False,
    )
