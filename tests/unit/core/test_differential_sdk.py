"""Differential test against the real openai-agents 0.24.0 SDK.

The SDK itself produces and settles pending writes: an approval-gated tool parks a run, the
approved resume's Session append hits an injected fault (fail before writing, write then fail,
write a prefix then fail), optionally another writer touches the history, and a resume restored
from the SDK's own checkpoint JSON settles it. The same facts (the checkpoint's
``pending_session_write`` and the Session tail) are folded by the engine; wherever the SDK decides
(already committed, appended once, or its ambiguity error) the engine must decide the same.
Histories, batches, faults, foreign writes and the ids policy are generated from a seeded RNG.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pytest

from engine.core.digest import digests, item_facts
from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Binding,
    Event,
    IntentEvent,
    IntentKind,
    PendingRecord,
    ResumeEvent,
    Verdict,
)
from engine.core.fold import replay

agents = pytest.importorskip("agents")
from agents import Agent, Runner, RunState, function_tool  # noqa: E402
from agents.exceptions import UserError  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

CASES = 300
SEED = 20260825


class FaultySession:
    """An in-memory Session whose next append can fail before, after or halfway."""

    def __init__(self, store: list[dict[str, Any]], *, ignore_ids: bool) -> None:
        self.session_id = "s1"
        self.session_settings = None
        self.store = store
        self.fault: str | None = None
        self.appends: list[list[dict[str, Any]]] = []
        self._ignore_ids_for_matching = ignore_ids

    async def get_items(self, limit: int | None = None) -> list[dict[str, Any]]:
        items = copy.deepcopy(self.store)
        return items[-limit:] if limit else items

    async def add_items(self, items: list[dict[str, Any]]) -> None:
        fault, self.fault = self.fault, None
        self.appends.append(copy.deepcopy(items))
        if fault == "before":
            raise RuntimeError("injected: nothing written")
        if fault == "partial":
            self.store.extend(copy.deepcopy(items[:1]))
            raise RuntimeError("injected: prefix written")
        self.store.extend(copy.deepcopy(items))
        if fault == "after":
            raise RuntimeError("injected: written, acknowledgement lost")

    async def pop_item(self) -> dict[str, Any] | None:
        return self.store.pop() if self.store else None

    async def clear_session(self) -> None:
        self.store.clear()


@dataclass(frozen=True)
class Case:
    history: tuple[str, ...]
    amounts: tuple[int, ...]
    fault: str
    interference: str
    ignore_ids: bool


def generate(rng: random.Random) -> Case:
    amounts = tuple(rng.randint(1, 3) for _ in range(rng.randint(1, 3)))
    faults = ["before", "after"] + (["partial"] if len(amounts) > 1 else [])
    return Case(
        history=tuple(rng.choice(["hi", "yo"]) for _ in range(rng.randint(0, 3))),
        amounts=amounts,
        fault=rng.choice(faults),
        interference=rng.choice(["none", "none", "foreign", "copy", "pop", "copy-prefix"]),
        ignore_ids=rng.random() < 0.3,
    )


async def run_sdk(case: Case) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """Returns the SDK's outcome, the checkpoint's pending record and the store before resume."""

    @function_tool(needs_approval=True)
    def charge(amount: int) -> str:
        return f"receipt-{amount}"

    calls = [
        function_call("charge", {"amount": a}, call_id=f"call-{i}")
        for i, a in enumerate(case.amounts)
    ]
    model = ScriptedModel([calls, *([[assistant_message("done")]] * 3)])
    agent = Agent(name="a", model=model, tools=[charge])
    store: list[dict[str, Any]] = [{"role": "user", "content": h} for h in case.history]
    session = FaultySession(store, ignore_ids=case.ignore_ids)
    parked = await Runner.run(agent, "charge", session=session)  # type: ignore[arg-type]
    state = parked.to_state()
    for interruption in parked.interruptions:
        state.approve(interruption)
    session.fault = case.fault
    with pytest.raises(RuntimeError):
        await Runner.run(agent, state, session=session)  # type: ignore[arg-type]
    checkpoint = state.to_string()
    pending = json.loads(checkpoint)["pending_session_write"]
    batch = pending["items"]
    if case.interference == "foreign":
        store.append({"role": "user", "content": "someone else"})
    elif case.interference == "copy":
        store.extend(copy.deepcopy(batch))
    elif case.interference == "copy-prefix":
        store.extend(copy.deepcopy(batch[:1]))
    elif case.interference == "pop" and store:
        store.pop()
    seen = copy.deepcopy(store)
    restored = await RunState.from_string(agent, checkpoint)
    already = len(session.appends)
    try:
        await Runner.run(agent, restored, session=session)  # type: ignore[arg-type]
    except UserError as exc:
        if "Cannot reconcile" not in str(exc):
            raise
        return "ambiguous", pending, seen
    new = session.appends[already:]
    return ("appended" if new and new[0] == batch else "committed"), pending, seen


class Profile(StrEnum):
    """Which acks the engine folds besides the intent and the resume."""

    RUNNER = "runner"  # the runner's own view only: the failed call is UNKNOWN
    STORE = "store"  # plus the store's own ack (outbox / CDC) of what it really did


def store_ack(case: Case, batch_size: int) -> AckEvent:
    """What the store itself knows about the failed append."""
    outcome, count = {
        "before": (AckOutcome.NOT_WRITTEN, 0),
        "partial": (AckOutcome.COMMITTED, 1),
        "after": (AckOutcome.COMMITTED, batch_size),
    }[case.fault]
    return AckEvent(
        event_id="store-ack",
        session_id="s1",
        event_time_ms=1_002,
        intent_id="i1",
        outcome=outcome,
        source=AckSource.STORE,
        committed_count=count,
    )


def run_engine(
    case: Case,
    pending: dict[str, Any],
    store: list[dict[str, Any]],
    profile: Profile = Profile.RUNNER,
) -> Verdict:
    binding = Binding(backend_id="faulty-memory", namespace="diff", ignore_ids=case.ignore_ids)
    facts = [item_facts(i, ignore_ids=case.ignore_ids) for i in pending["items"]]
    before = pending["before"]
    window = len(before or []) + len(facts)
    tail = digests(store[-window:] if window else [], ignore_ids=case.ignore_ids)
    record = PendingRecord(
        intent_id="i1",
        items=facts,
        before=before,
        persisted_count=pending["persisted_count"],
        append_acknowledged=pending.get("append_acknowledged", False),
    )
    events: list[Event] = [
        IntentEvent(
            event_id="intent",
            session_id="s1",
            event_time_ms=1_000,
            kind=IntentKind.REGISTER,
            intent_id="i1",
            runner_id="runner-1",
            binding=binding,
            before=before,
            items=facts,
            persisted_count=pending["persisted_count"],
            sequence=1,
        ),
        AckEvent(
            event_id="ack",
            session_id="s1",
            event_time_ms=1_001,
            intent_id="i1",
            runner_id="runner-1",
            outcome=AckOutcome.UNKNOWN,
            source=AckSource.RUNNER,
        ),
        *([store_ack(case, len(facts))] if profile is Profile.STORE else []),
        ResumeEvent(
            event_id="resume",
            session_id="s1",
            event_time_ms=10_000_000,
            runner_id="runner-2",
            checkpoint_id="cp",
            binding=binding,
            pending=record,
            observed_tail=tail,
            checkpoint_sequence=1,
        ),
    ]
    return replay(events)[-1].verdict


EXPECTED = {
    "committed": Verdict.CONTINUE,
    "appended": Verdict.APPEND_ONCE,
    "ambiguous": Verdict.WITHHELD,
}


def divergence(case: Case, sdk: str, engine: Verdict, profile: Profile) -> str | None:
    """Why the engine may withhold where the SDK decided, with the store's ack in hand; None
    when it may not (then it must agree with the SDK)."""
    if profile is Profile.RUNNER or engine is not Verdict.WITHHELD:
        return None
    if sdk == "appended" and case.fault == "after":
        return "sdk re-appends a batch the store says landed"  # a duplicate
    if sdk == "committed" and case.fault == "before":
        return "sdk keeps a copy the store says it never wrote"  # not our authorship
    if sdk == "appended" and case.fault == "partial":
        # Not an SDK error when the prefix was popped again: the engine turned the session
        # AMBIGUOUS on the store's partial-commit ack, and only a repair clears that.
        return "the store reported a partial commit"
    return None


@pytest.fixture(scope="module")
def sdk_runs() -> list[tuple[Case, str, dict[str, Any], list[dict[str, Any]]]]:
    """The SDK's own outcome for every generated case (run once, folded in both profiles)."""
    rng = random.Random(SEED)
    runs = []
    for _ in range(CASES):
        case = generate(rng)
        sdk, pending, store = asyncio.run(run_sdk(case))
        runs.append((case, sdk, pending, store))
    return runs


@pytest.mark.parametrize("profile", list(Profile))
def test_engine_agrees_with_the_sdk_on_generated_cases(
    sdk_runs: list[tuple[Case, str, dict[str, Any], list[dict[str, Any]]]], profile: Profile
) -> None:
    outcomes: Counter[str] = Counter()
    disagreements: list[str] = []
    withheld: Counter[str] = Counter()
    for case, sdk, pending, store in sdk_runs:
        outcomes[sdk] += 1
        engine = run_engine(case, pending, store, profile)
        if EXPECTED[sdk] == engine:
            continue
        why = divergence(case, sdk, engine, profile)
        if why is None:
            disagreements.append(f"{case}: sdk={sdk} engine={engine.value}")
        else:
            withheld[why] += 1
    agreed = CASES - len(disagreements) - sum(withheld.values())
    print(
        f"differential ({profile.value} acks): {CASES} cases, outcomes {dict(outcomes)}, "
        f"agreement {agreed}/{CASES}, withheld instead: {dict(withheld)}"
    )
    assert disagreements == []
    # The generator must exercise all three SDK outcomes, or the test proves little.
    assert set(EXPECTED) == set(outcomes)
    if profile is Profile.STORE:  # the store's evidence must change some answers
        assert withheld
