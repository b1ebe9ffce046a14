"""Write the frozen replay corpus: inputs and the decisions the current core gives them.

    python -m tools.gen_replay_corpus            # rewrites tests/fixtures/replay/corpus.jsonl
    python -m tools.gen_replay_corpus --check    # exit 1 if the file differs from a fresh one

The inputs come from the core's lifecycle model (`tests/unit/core/lifecycle_model.py`: runners
with every fault, foreign writers, restores, held batches, late copies), run for a fixed list of
programs drawn from a seeded generator, each folded in four interleavings of its three topics
(time order, intents ahead, acks ahead, resumes ahead), plus a few hand-built sessions whose
inputs wait (an ack ahead of its intent, an intent under a fence not granted yet, a resume ahead
of its intent), a store ack that saw the batch rewritten, and a repair. Every session gets its
own id and its own stretch of event time, and all of them are folded as one partition the way
the engine folds one: each input at its topic offset, and after each input a watermark sweep
of every session whose waiting inputs are due (`engine.core.watermark`), then a last sweep
`PARK_MS` past the last input, so every waiting input has its final answer.

`reconciler replay --verify --inputs tests/fixtures/replay/corpus.jsonl` (and
`tests/unit/test_replay.py`) replays it with the current core.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from msgspec.structs import replace

from engine.admin.replay import Step, source_of_input, write_steps
from engine.core.events import (
    AckOutcome,
    AckSource,
    Event,
    IntentKind,
    RepairResolution,
    ResumeEvent,
)
from engine.core.fold import fold
from engine.core.state import PARK_MS, SessionState
from engine.core.watermark import advance, expire, park_deadline
from engine.wire.topics import TopicNames
from tests.unit.core import builders as b
from tests.unit.core.lifecycle_model import (
    Fault,
    Foreign,
    ForeignWrite,
    Hold,
    LateCopy,
    Op,
    Restore,
    Settle,
    Topic,
    World,
    Write,
)

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "replay" / "corpus.jsonl"
SEED = 20261204
PROGRAMS = 20
SPAN_MS = 10_000_000
"""Event time given to each session: far more than any program takes, so that sessions do not
overlap in event time (a session's waits are bounded by its own inputs and the sweep)."""

TOPICS = TopicNames()
PARTITION = 0


def _op(rng: random.Random) -> Op:
    pick = rng.randrange(7)
    if pick <= 1:
        return Write(rng.choice(list(Fault)))
    if pick == 2:
        return ForeignWrite(rng.choice(list(Foreign)))
    if pick == 3:
        granted = [f for f in Fault if f is not Fault.RETRY_IN_PLACE]
        return Restore(rng.choice([1, 2]), rng.choice(granted))
    if pick == 4:
        return Hold()
    if pick == 5:
        return Settle(rng.random() < 0.5)
    return LateCopy(rng.randrange(40))


def _lifecycle_sessions(rng: random.Random) -> Iterator[list[tuple[Topic, Event]]]:
    """Per program and interleaving, the session's inputs as (topic, event)."""
    for _ in range(PROGRAMS):
        world = World(store_acks=rng.random() < 0.5)
        world.run([_op(rng) for _ in range(rng.randint(1, 10))])
        log = [(item.topic, item.event) for item in world.log]
        yield log
        for ahead in (Topic.INTENTS, Topic.ACKS, Topic.RESUMES):
            yield [*(i for i in log if i[0] is ahead), *(i for i in log if i[0] is not ahead)]


def _waiting_session() -> list[tuple[Topic, Event]]:
    a, c, x = b.msg("a"), b.msg("c"), b.msg("x")
    return [
        (Topic.ACKS, b.ack("k1", AckOutcome.COMMITTED, t=1_100)),  # ahead of its intent
        (Topic.INTENTS, b.intent("e1", [x], [a], t=1_000)),
        (Topic.RESUMES, b.resume("q1", b.record([c], [a, x], intent_id="i2"), [a, x], seq=2)),
        (Topic.INTENTS, b.intent("e3", [c], [a, x], intent_id="i3", fence=9, seq=3, t=100_500)),
        (Topic.INTENTS, b.intent("e2", [c], [a, x], intent_id="i2", seq=2, t=99_000)),
    ]


def _rewritten_session() -> list[tuple[Topic, Event]]:
    before, batch = [b.msg("hello")], [b.msg("a"), b.msg("b")]
    store = b.ack("k1", AckOutcome.COMMITTED, source=AckSource.STORE, runner="")
    rewritten = [*before, batch[0], b.msg("b, rewritten")]
    return [
        (Topic.INTENTS, b.intent("e1", batch, before)),
        (Topic.ACKS, replace(store, observed_tail=b.d(rewritten))),
        (Topic.RESUMES, b.resume("q1", b.record(batch, before), [*before, *batch])),
        (Topic.INTENTS, b.repair("p1", RepairResolution.ACCEPT_COMMITTED, t=110_000)),
        (Topic.RESUMES, b.resume("q2", b.record(batch, before), [*before, *batch], t=120_000)),
    ]


def _table_sessions() -> Iterator[list[tuple[Topic, Event]]]:
    """One write, the evidence about it, a resume: every tail against every kind of evidence,
    on a digest-stable and on a rewriting backend (the SDK's conformance table and beyond)."""
    u, c, out = b.msg("charge 7"), b.call("charge-1"), b.out("charge-1")
    before, batch = [u, c], [out, b.msg("done")]
    tails = [
        before,
        [*before, *batch],
        [*before, b.msg("extra")],
        [*before, *batch, b.msg("x")],
        [*before, out],
        [out, b.msg("done, as stored")],
    ]
    store, runner = AckSource.STORE, AckSource.RUNNER
    evidence: list[list[tuple[AckOutcome, AckSource, int | None]]] = [
        [],
        [(AckOutcome.UNKNOWN, runner, None)],
        [(AckOutcome.NOT_WRITTEN, runner, None)],
        [(AckOutcome.COMMITTED, store, None)],
        [(AckOutcome.COMMITTED, store, 1)],
        [(AckOutcome.COMMITTED, runner, None), (AckOutcome.NOT_WRITTEN, store, None)],
    ]
    unstable = replace(b.BINDING, items_digest_stable=False)
    for binding in (b.BINDING, unstable):
        for tail in tails:
            for acks in evidence:
                log: list[tuple[Topic, Event]] = [
                    (Topic.INTENTS, b.intent("e1", batch, before, binding=binding))
                ]
                for n, (outcome, source, count) in enumerate(acks):
                    runner_id = "r1" if source is runner else ""
                    ack = b.ack(f"k{n}", outcome, source=source, runner=runner_id, count=count)
                    log.append((Topic.ACKS, ack))
                pending = b.record(batch, before)
                log.append((Topic.RESUMES, b.resume("q1", pending, tail, binding=binding)))
                yield log


def _edge_sessions() -> Iterator[list[tuple[Topic, Event]]]:
    """Answers the lifecycle model rarely gives: claims, bindings, stale and repeated
    checkpoints, repairs, held batches."""
    u, c, out = b.msg("charge 7"), b.call("charge-1"), b.out("charge-1")
    before, batch = [u, c], [out]
    first = (Topic.INTENTS, b.intent("e1", batch, before))
    other = replace(b.BINDING, namespace="elsewhere")
    yield [
        (Topic.INTENTS, b.intent("e1", batch, None)),
        (Topic.RESUMES, b.resume("q1", b.record(batch, None), before)),
    ]
    yield [first, (Topic.RESUMES, b.resume("q1", b.record(batch, before), before, binding=other))]
    yield [
        first,
        (Topic.RESUMES, b.resume("q1", b.record(batch, before, acknowledged=True), before)),
    ]
    yield [first, (Topic.RESUMES, b.resume("q1", b.record(batch, before), before, seq=0))]
    yield [
        first,
        (Topic.RESUMES, b.resume("q1", b.record(batch, before), before)),
        (Topic.RESUMES, b.resume("q2", b.record(batch, before), before, runner="r3", t=100_100)),
        (Topic.RESUMES, b.resume("q3", b.record(batch, before), before, t=300_000)),
    ]
    yield [
        first,
        (Topic.ACKS, b.ack("k1", AckOutcome.UNKNOWN)),
        (Topic.RESUMES, b.resume("q1", b.record(batch, before), [*before, b.msg("x")])),
        (Topic.INTENTS, b.repair("p1", RepairResolution.ACCEPT_ABSENT)),
        (Topic.INTENTS, b.repair("p2", RepairResolution.ABANDON, t=200_001)),
        (Topic.RESUMES, b.resume("q2", b.record(batch, before), before, t=300_000)),
    ]
    yield [first, (Topic.INTENTS, b.repair("p1", RepairResolution.ACCEPT_COMMITTED))]
    held = b.intent("h1", [c], None, kind=IntentKind.HELD, intent_id="h")
    release = b.intent("h2", [c, out], before, kind=IntentKind.RELEASE, intent_id="h", seq=2)
    discard = b.intent("h3", [], None, kind=IntentKind.DISCARD, intent_id="h", seq=2)
    pending = b.record([c], None, intent_id="h", held=True)
    yield [(Topic.INTENTS, held), (Topic.RESUMES, b.resume("q1", pending, before))]
    yield [(Topic.INTENTS, held), (Topic.INTENTS, release)]
    yield [(Topic.INTENTS, held), (Topic.INTENTS, replace(discard, tools_ran=True))]
    yield [(Topic.INTENTS, held), (Topic.RESUMES, b.resume("q1", pending, [*before, c]))]


def _as_session(event: Event, session_id: str, shift_ms: int) -> Event:
    moved = replace(event, session_id=session_id, event_time_ms=event.event_time_ms + shift_ms)
    if isinstance(moved, ResumeEvent) and moved.checkpoint_session_id is not None:
        moved = replace(moved, checkpoint_session_id=session_id)
    return moved


def sessions() -> list[tuple[str, list[tuple[Topic, Event]]]]:
    rng = random.Random(SEED)
    built = [("waiting", _waiting_session()), ("rewritten", _rewritten_session())]
    built += [(f"table-{n:03d}", log) for n, log in enumerate(_table_sessions())]
    built += [(f"edge-{n:03d}", log) for n, log in enumerate(_edge_sessions())]
    built += [(f"life-{n:03d}", log) for n, log in enumerate(_lifecycle_sessions(rng))]
    return built


def generate() -> list[Step]:
    """Every step, folded as one partition by the current core."""
    topic_names = {Topic.INTENTS: TOPICS.intents, Topic.ACKS: TOPICS.acks}
    topic_names[Topic.RESUMES] = TOPICS.resumes
    offsets = dict.fromkeys(topic_names.values(), 0)
    states: dict[str, SessionState] = {}
    watermark = -1
    steps: list[Step] = []
    for n, (session_id, log) in enumerate(sessions()):
        for topic, original in log:
            event = _as_session(original, session_id, n * SPAN_MS)
            name = topic_names[topic]
            offset = offsets[name]
            offsets[name] += 1
            result = fold(states.get(session_id), event, offset)
            states[session_id] = result.state
            source = source_of_input(name, PARTITION, offset)
            steps.append(Step(source, session_id, list(result.decisions), event, offset))
            watermark = advance(watermark, event)
            steps.extend(_sweep(states, watermark))
    steps.extend(_sweep(states, watermark + PARK_MS + SPAN_MS))
    return steps


def _sweep(states: dict[str, SessionState], watermark: int) -> list[Step]:
    """What the engine's watermark sweep answers after an input: sessions in id order."""
    steps: list[Step] = []
    for session_id in sorted(states):
        deadline = park_deadline(states[session_id])
        if deadline is None or deadline > watermark:
            continue
        states[session_id], answers = expire(states[session_id], watermark)
        if answers:
            source = f"watermark:{PARTITION}:{watermark}"
            steps.append(Step(source, session_id, answers, watermark_ms=watermark))
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the file, write nothing")
    parser.add_argument("--out", type=Path, default=CORPUS, help="where to write the corpus")
    args = parser.parse_args(argv)
    steps = generate()
    if not args.check:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        count = write_steps(args.out, steps)
        print(f"wrote {count} steps to {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "corpus.jsonl"
        write_steps(fresh, steps)
        same = fresh.read_bytes() == args.out.read_bytes()
    print(f"{args.out}: {'up to date' if same else 'differs from a fresh generation'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
