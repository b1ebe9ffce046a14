"""Per-event CPU cost of the engine's hot path, without Kafka: decode, fold, encode.

Run from the repository root: ``.venv/bin/python -m tools.bench_fold [--sessions 2000]``.
Not a test: it prints microseconds per event for each stage and events/s for the whole
pipeline (the work `PartitionTask` does per record, minus the broker and the local store).

The log, per session: a REGISTER intent (2 before digests, a 2-item batch), a runner ack
UNKNOWN, a resume whose pending record names the intent (4-digest tail: before + batch). Every
fifth session also gets a second copy of the resume from another runner (withheld), and every
tenth has its ack and resume arrive before the intent (parked, answered when it lands).
Sessions are interleaved in blocks, as a partition sees them; a "commit" every
``--commit-every`` events encodes each changed session's state once.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TypeVar

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
    ItemFacts,
    PendingRecord,
    ResumeEvent,
)
from engine.core.fold import fold
from engine.core.state import SessionState
from engine.wire import Codec, RecordType

CODEC = Codec()
BINDING = Binding(backend_id="sqlite:bench", namespace="bench")
FACTS = [
    item_facts({"role": "user", "content": f"message {i}"}, ignore_ids=False) for i in range(4)
]
BLOCK = 50  # sessions interleaved at a time
T0 = 1_767_225_600_000

T = TypeVar("T")


def distinct_facts(n: int) -> list[ItemFacts]:
    """Items of session ``n`` alone, as in a real partition (`FACTS` is one set for all)."""
    return [
        item_facts({"role": "user", "content": f"session {n} message {i}"}, ignore_ids=False)
        for i in range(4)
    ]


def session_events(n: int, distinct: bool = False) -> list[Event]:
    sid, t = f"conv-{n:06d}", T0 + n
    facts = distinct_facts(n) if distinct else FACTS
    before, batch = [f.digest for f in facts[:2]], facts[2:4]
    record = PendingRecord(intent_id="w1", items=batch, before=before, persisted_count=2)
    intent = IntentEvent(
        event_id=f"{sid}/i",
        session_id=sid,
        event_time_ms=t,
        kind=IntentKind.REGISTER,
        intent_id="w1",
        runner_id="r1",
        binding=BINDING,
        before=before,
        items=batch,
        persisted_count=2,
        sequence=1,
    )
    ack = AckEvent(
        event_id=f"{sid}/a",
        session_id=sid,
        event_time_ms=t + 1,
        intent_id="w1",
        runner_id="r1",
        outcome=AckOutcome.UNKNOWN,
        source=AckSource.RUNNER,
    )

    def resume(copy: int) -> ResumeEvent:
        return ResumeEvent(
            event_id=f"{sid}/r{copy}",
            session_id=sid,
            event_time_ms=t + 70_000 + copy,
            runner_id=f"r{2 + copy}",
            checkpoint_id="c1",
            binding=BINDING,
            pending=record,
            observed_tail=[f.digest for f in facts[:4]],
            checkpoint_sequence=1,
        )

    events: list[Event] = [intent, ack, resume(0)]
    if n % 10 == 9:
        events = [ack, resume(0), intent]
    if n % 5 == 0:
        events.append(resume(1))
    return events


def build_log(sessions: int, distinct: bool = False) -> list[Event]:
    log: list[Event] = []
    for start in range(0, sessions, BLOCK):
        ids = range(start, min(start + BLOCK, sessions))
        per_session = [session_events(n, distinct) for n in ids]
        for step in range(max(len(events) for events in per_session)):
            log.extend(events[step] for events in per_session if step < len(events))
    return log


RECORD_TYPE = {
    IntentEvent: RecordType.INTENT,
    AckEvent: RecordType.ACK,
    ResumeEvent: RecordType.RESUME,
}


def encoded_log(log: list[Event]) -> list[tuple[RecordType, bytes]]:
    return [(RECORD_TYPE[type(event)], CODEC.encode(event)) for event in log]


def timed(run: Callable[[], T], repeat: int) -> tuple[float, T]:
    """Best wall time of ``repeat`` runs, and the last run's result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def decode_all(records: list[tuple[RecordType, bytes]]) -> list[Event]:
    decoded: list[Event] = []
    for record_type, data in records:
        event = CODEC.decode(record_type, data)
        assert isinstance(event, IntentEvent | AckEvent | ResumeEvent)
        decoded.append(event)
    return decoded


def fold_all(
    events: list[Event], commit_every: int
) -> tuple[list[Decision], list[list[SessionState]]]:
    """Decisions, and per commit the states that changed in it (what the changelog gets)."""
    states: dict[str, SessionState] = {}
    changed: dict[str, SessionState] = {}
    commits: list[list[SessionState]] = []
    decisions: list[Decision] = []
    for offset, event in enumerate(events):
        result = fold(states.get(event.session_id), event, offset)
        states[event.session_id] = changed[event.session_id] = result.state
        decisions.extend(result.decisions)
        if (offset + 1) % commit_every == 0:
            commits.append(list(changed.values()))
            changed = {}
    commits.append(list(changed.values()))
    return decisions, commits


def encode_decisions(decisions: list[Decision]) -> int:
    return sum(len(CODEC.encode(decision)) for decision in decisions)


def encode_states(commits: list[list[SessionState]]) -> int:
    return sum(len(CODEC.encode(state)) for states in commits for state in states)


def pipeline(records: list[tuple[RecordType, bytes]], commit_every: int) -> int:
    """Everything per record, in the engine's order; returns the bytes produced."""
    states: dict[str, SessionState] = {}
    changed: dict[str, SessionState] = {}
    produced = 0
    for offset, (record_type, data) in enumerate(records):
        event = CODEC.decode(record_type, data)
        assert isinstance(event, IntentEvent | AckEvent | ResumeEvent)
        result = fold(states.get(event.session_id), event, offset)
        states[event.session_id] = changed[event.session_id] = result.state
        produced += sum(len(CODEC.encode(decision)) for decision in result.decisions)
        if (offset + 1) % commit_every == 0:
            produced += sum(len(CODEC.encode(state)) for state in changed.values())
            changed = {}
    return produced + sum(len(CODEC.encode(state)) for state in changed.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--commit-every", type=int, default=500, help="events per commit")
    parser.add_argument("--repeat", type=int, default=3, help="runs per stage (best is kept)")
    parser.add_argument(
        "--distinct-digests",
        action="store_true",
        help="each session its own item digests (default: one set shared by all sessions, "
        "which flatters anything that remembers digests)",
    )
    args = parser.parse_args()

    log = build_log(args.sessions, args.distinct_digests)
    records = encoded_log(log)
    n = len(records)
    decode_s, events = timed(lambda: decode_all(records), args.repeat)
    if events != log:
        raise SystemExit("decode did not round-trip the log")
    fold_s, (decisions, commits) = timed(lambda: fold_all(events, args.commit_every), args.repeat)
    decision_s, _ = timed(lambda: encode_decisions(decisions), args.repeat)
    state_s, _ = timed(lambda: encode_states(commits), args.repeat)
    whole_s, _ = timed(lambda: pipeline(records, args.commit_every), args.repeat)
    states = sum(len(c) for c in commits)

    print(f"{args.sessions} sessions, {n} events, {len(decisions)} decisions, {states} states")
    print(f"  {'stage':<18}{'us/event':>10}{'us/unit':>10}  unit")
    rows = [
        ("decode", decode_s, n, "event"),
        ("fold", fold_s, n, "event"),
        ("decision encode", decision_s, len(decisions), "decision"),
        ("state encode", state_s, states, "state"),
    ]
    for label, seconds, units, unit in rows:
        print(f"  {label:<18}{seconds / n * 1e6:>10.1f}{seconds / units * 1e6:>10.1f}  {unit}")
    staged = sum(seconds for _, seconds, _, _ in rows)
    print(f"  {'sum of stages':<18}{staged / n * 1e6:>10.1f}")
    print(f"  {'pipeline':<18}{whole_s / n * 1e6:>10.1f}   -> {n / whole_s:,.0f} events/s")


if __name__ == "__main__":
    main()
