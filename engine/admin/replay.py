"""`reconciler replay --verify`: fold recorded inputs again with the current core and compare.

A log of **steps** is what the engine did, in the order it did it: each step is one folded input
(its `topic/partition/offset`, the event, the decisions published for it) or one watermark
sweep of one session (`watermark:<partition>:<ms>`, the final answers it gave). The decisions
partition holds exactly that order: every decision carries the `source` header of what produced
it (SPEC.md §6), so `replay_topics` rebuilds the steps from the topics, and a frozen corpus
file (`tests/fixtures/replay/`) holds them as JSON lines.

`verify` folds the steps from empty states, at the input's offset as the fold's position (as the
engine does), runs `watermark.expire` for a sweep step, and compares the decisions with the
published ones field by field. It stops at the first difference and says where: source, session,
input event id, which decision and which fields. Same inputs, same core, same decisions
(engine/core/README.md, invariant 6); a difference is a change of the core's answers, or an
engine that published something the core does not give.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from engine.core.events import AckEvent, Decision, Event, IntentEvent, RepairEvent, ResumeEvent
from engine.core.fold import fold
from engine.core.state import SessionState
from engine.core.watermark import expire
from engine.errors import ConfigError, EngineError
from engine.wire.values import from_record, to_json_record

WATERMARK_PREFIX = "watermark:"
"""`source` of a watermark sweep's answers: `watermark:<partition>:<ms>`
(runtime/tasks/headers.py)."""

INPUT_TYPES: dict[str, type[Event]] = {
    "intent": IntentEvent,
    "ack": AckEvent,
    "resume": ResumeEvent,
    "repair": RepairEvent,
}
_TYPE_NAMES = {model: name for name, model in INPUT_TYPES.items()}


class ReplayLogError(ConfigError):
    """A corpus file or a recorded log that cannot be replayed (exit 2 from the command)."""


class ReplaySourceError(EngineError):
    """The topics do not hold what a replay needs (an input gone, a decision without source)."""


class ReplayDifferenceError(EngineError):
    """The current core answers a recorded input differently from the decisions published."""


@dataclass(frozen=True)
class Step:
    """One thing the engine folded: an input (``event`` set) or a watermark sweep of one
    session (``watermark_ms`` set), with the decisions it published for it, in order."""

    source: str
    session_id: str
    decisions: list[Decision]
    event: Event | None = None
    position: int = 0
    watermark_ms: int | None = None

    def describe(self) -> str:
        what = f"input {self.event.event_id}" if self.event is not None else "watermark sweep"
        return f"{self.source} (session {self.session_id}, {what})"


@dataclass
class Outcome:
    """What a replay covered."""

    steps: int = 0
    inputs: int = 0
    decisions: int = 0
    sessions: set[str] = field(default_factory=set)

    def summary(self) -> str:
        return (
            f"replayed {self.inputs} inputs and {self.steps - self.inputs} watermark sweeps of "
            f"{len(self.sessions)} sessions: {self.decisions} decisions, all identical"
        )


def source_of_input(topic: str, partition: int, offset: int) -> str:
    return f"{topic}/{partition}/{offset}"


def parse_watermark(source: str) -> int | None:
    """The watermark a sweep's `source` names, or None for an input's `topic/partition/offset`."""
    if not source.startswith(WATERMARK_PREFIX):
        return None
    text = source.rpartition(":")[2]
    try:
        return int(text)
    except ValueError:
        raise ReplayLogError(
            f"source {source!r} names no watermark.",
            "a sweep's source is watermark:<partition>:<ms>; regenerate the log.",
        ) from None


def verify(steps: Iterable[Step]) -> Outcome:
    """Fold every step from empty states and compare; `ReplayDifferenceError` at the first one."""
    states: dict[str, SessionState] = {}
    outcome = Outcome()
    for step in steps:
        state = states.get(step.session_id)
        if step.event is not None:
            result = fold(state, step.event, step.position)
            state, replayed = result.state, list(result.decisions)
            outcome.inputs += 1
        elif state is None or step.watermark_ms is None:
            raise ReplayDifferenceError(
                f"at {step.describe()}: {len(step.decisions)} decision(s) published by a "
                "watermark sweep of a session the replay has folded nothing of.",
                "replay from the first offset of every input partition (the whole history).",
            )
        else:
            state, replayed = expire(state, step.watermark_ms)
        states[step.session_id] = state
        _compare(step, step.decisions, replayed)
        outcome.steps += 1
        outcome.decisions += len(replayed)
        outcome.sessions.add(step.session_id)
    return outcome


def _compare(step: Step, published: Sequence[Decision], replayed: Sequence[Decision]) -> None:
    for index, (old, new) in enumerate(zip(published, replayed, strict=False)):
        if old != new:
            before, after = to_json_record(old), to_json_record(new)
            fields = [name for name in before if before[name] != after.get(name)]
            raise ReplayDifferenceError(
                f"at {step.describe()}: decision {index + 1} of {len(published)} differs in "
                f"{', '.join(fields)}: published {_brief(old, fields)}; the current core gives "
                f"{_brief(new, fields)}.",
                _FIX,
            )
    if len(published) != len(replayed):
        extra = replayed[len(published) :] or published[len(replayed) :]
        which = "the current core also gives" if len(replayed) > len(published) else "missing:"
        raise ReplayDifferenceError(
            f"at {step.describe()}: {len(published)} decision(s) published, the current core "
            f"gives {len(replayed)}; {which} {_brief(extra[0], [])}.",
            _FIX,
        )


_FIX = (
    "if the core's answers changed on purpose, say so and regenerate the corpus in the same "
    "commit (tests/fixtures/replay/README.md); otherwise the change is a regression."
)


def _brief(decision: Decision, fields: Sequence[str]) -> str:
    text = f"{decision.decision_id} {decision.verdict} {decision.reason}"
    record = to_json_record(decision)
    shown = [name for name in fields if name not in ("decision_id", "verdict", "reason")]
    details = ", ".join(f"{name}={json.dumps(record[name])}" for name in shown)
    return f"{text} ({details})" if details else text


# --- corpus files (JSON lines) -------------------------------------------------------------


def step_record(step: Step) -> dict[str, Any]:
    """One line of a corpus file."""
    record: dict[str, Any] = {"source": step.source, "session_id": step.session_id}
    if step.event is not None:
        record["position"] = step.position
        record["input"] = {
            "type": _TYPE_NAMES[type(step.event)],
            "value": to_json_record(step.event),
        }
    else:
        record["watermark_ms"] = step.watermark_ms
    record["decisions"] = [to_json_record(decision) for decision in step.decisions]
    return record


def write_steps(path: Path, steps: Iterable[Step]) -> int:
    lines = [json.dumps(step_record(step), sort_keys=True) for step in steps]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def read_steps(path: Path) -> Iterator[Step]:
    """The steps of a corpus file; `ReplayLogError` naming the line of the first bad one, and
    for a file that is not UTF-8 or holds no step (nothing replayed is not "identical")."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplayLogError(
            f"cannot read {path}: {exc.strerror or exc}.", "pass an existing corpus file."
        ) from exc
    except UnicodeDecodeError as exc:
        raise ReplayLogError(
            f"{path} is not UTF-8 text (byte {exc.start}): not a corpus file.",
            "pass a corpus file written by python -m tools.gen_replay_corpus (JSON lines).",
        ) from exc
    if not text.strip():
        raise ReplayLogError(
            f"{path} holds no replay step: there is nothing to verify.",
            "pass a corpus file written by python -m tools.gen_replay_corpus (JSON lines).",
        )
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield _step_of(json.loads(line))
        except (ValueError, KeyError, TypeError, msgspec.ValidationError) as exc:
            raise ReplayLogError(
                f"{path}, line {number}: not a replay step ({type(exc).__name__}: {exc}).",
                "regenerate the corpus (python -m tools.gen_replay_corpus) or fix the line.",
            ) from exc


def _step_of(record: dict[str, Any]) -> Step:
    decisions = [from_record(Decision, d) for d in record["decisions"]]
    source, session_id = str(record["source"]), str(record["session_id"])
    if "input" in record:
        kind = INPUT_TYPES[record["input"]["type"]]
        event = from_record(kind, record["input"]["value"])
        if event.session_id != session_id:
            raise ValueError(f"input of session {event.session_id}, step of {session_id}")
        return Step(source, session_id, decisions, event=event, position=int(record["position"]))
    watermark = parse_watermark(source)
    if watermark is None or watermark != record["watermark_ms"]:
        raise ValueError(f"a step without an input needs a watermark source, not {source!r}")
    return Step(source, session_id, decisions, watermark_ms=watermark)
