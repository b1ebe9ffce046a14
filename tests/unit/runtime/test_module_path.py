"""One input's path through the runtime visits each module once.

Run: `pytest tests/unit/runtime/test_module_path.py -q` (add `-s` to print each path). One
input (an intent; separately a resume, after its session's intent and ack were committed) goes
through the engine's real loop on the fault tests' fake clients (fakes.py), and a profiler
(`sys.setprofile`) follows it from the consume that returns its record until the commit that
holds its decision has persisted it (step 6).

What counts as the input's path:

- The loop (loop.py, and engine.py above it) is the driver: it hands the input from one module
  to the next, so every step returns to it by design. It is not a stop on the path.
- A *hand-off* is a call from the driver into another runtime module whose calls pass the input
  along: some call in it has the input, or what was made of it (the decoded event, its entry in
  the order buffer, the decisions and their payloads, the `Commit` those went into), among its
  arguments or its return value. The driver's other calls (the flags, the flow of the inputs,
  whether a commit is due, trimming memory) are its bookkeeping, not this input's path.
- Cross-cutting modules are left out by name, with everything they call: process/steps (the
  watchdog's guards and the stage timers around every step), process/metrics, process/trace
  (the latency trace's marks) and process/watchdog. They observe every step on purpose.

The path is the modules of the hand-offs in order, consecutive repeats collapsed. Checked:

1. each module appears in one run: the driver never hands the input back to a module it left;
2. nothing called inside a hand-off enters a module that an earlier hand-off was in: a module
   never hands the input back upstream behind the driver's back.

The modules a hand-off calls belong to it (the `-s` print lists them in brackets). Some serve
two hand-offs, which a flat list of every module entered would count as a return:
intake/ingest.py decodes the record for the intake and names the event's kind for step 2's
metrics; commit/commit.py takes step 2's outputs and then runs steps 3-6 for the committer.

The profiler sees only interpreted code, and `make setup` compiles some runtime modules (the
intake's decode and order buffer), which then call each other natively. The path is a property
of the sources, so each trace runs in a child process with `RECONCILER_PURE=1`:
`python -m tests.unit.runtime.test_module_path intent|resume [--mutate]` prints it as JSON.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from confluent_kafka import Message
from msgspec.structs import replace

from engine.core.events import AckOutcome, Decision, Event
from engine.core.state import PARK_MS
from engine.runtime.commit.commit import Commit
from engine.runtime.engine import Engine
from engine.runtime.fold_step import FoldStep
from engine.runtime.loop import Loop
from engine.settings import Settings, load_settings
from engine.wire import RecordType
from engine.wire.partitioner import partition_for
from tests.integration.engine_harness import CODEC
from tests.integration.exactly_once import OUT, C, U
from tests.unit.core.builders import ack, intent, record, resume
from tests.unit.runtime.fakes import FakeBroker, FakeClients

REPO = Path(__file__).resolve().parents[3]
RUNTIME = "engine.runtime."
DRIVER = frozenset({"engine.runtime.loop", "engine.runtime.engine"})
CROSS_CUTTING = frozenset(
    {
        "engine.runtime.process.steps",
        "engine.runtime.process.metrics",
        "engine.runtime.process.trace",
        "engine.runtime.process.watchdog",
    }
)
PARTITIONS = 2
SESSION = "session-path"
Position = tuple[str, int, int]


@dataclass
class _Call:
    """One frame on the profiler's own stack."""

    module: str
    function: str
    frame: FrameType
    role: str  # "driver", "runtime", "muted" (cross-cutting or below it), "other"
    root: _Call | None  # the hand-off this call is inside (itself if it is one)
    carrying: bool = False  # its arguments held the input
    carried: bool = False  # it or a call inside it passed the input along
    inside: list[str] = field(default_factory=list)  # of a hand-off: modules the input went to
    before_close: bool = True  # called before the input's commit persisted


@dataclass
class PathTracer:
    """Follows one input (its record's position) through the runtime: see the module docstring."""

    position: Position
    stack: list[_Call] = field(default_factory=list)
    tracked: dict[int, object] = field(default_factory=dict)  # id -> object (kept alive)
    state: str = "before"  # "before" the record is consumed, "open", "closed" once persisted
    handoffs: list[tuple[str, str, list[str]]] = field(default_factory=list)
    upstream: list[tuple[str, str, str]] = field(default_factory=list)  # (inside, into, function)

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self._call(frame)
        elif event == "return":
            self._return(frame, arg)

    def _call(self, frame: FrameType) -> None:
        module = str(frame.f_globals.get("__name__", ""))
        parent = self.stack[-1] if self.stack else None
        if (parent is not None and parent.role == "muted") or module in CROSS_CUTTING:
            role = "muted"
        elif module in DRIVER:
            role = "driver"
        elif module.startswith(RUNTIME):
            role = "runtime"
        else:
            role = "other"
        root = parent.root if parent is not None else None
        call = _Call(module, frame.f_code.co_name, frame, role, root)
        call.before_close = self.state != "closed"
        if role == "runtime":
            if root is None:
                call.root = call
            elif self.state == "open" and module != root.module:
                earlier = {m for m, _, _ in self.handoffs} - {root.module}
                if module in earlier:
                    self.upstream.append((root.module, module, call.function))
            receiver = frame.f_locals.get("self")
            call.carrying = (
                self.state == "open"
                and not _is_property(receiver, call.function)
                and any(self._carries(v) for v in frame.f_locals.values())
            )
            if call.carrying and (call.function == "__init__" or isinstance(receiver, Commit)):
                # what is built from the input carries it (an order buffer entry), and so does
                # the commit its decisions went into, to step 6
                self._track(receiver)
        self.stack.append(call)

    def _return(self, frame: FrameType, value: Any) -> None:
        if not any(c.frame is frame for c in self.stack):
            return  # began before the profiler
        call = self.stack.pop()
        while call.frame is not frame:
            call = self.stack.pop()
        if call.role == "muted":
            return
        if self.state == "before" and self._is_record(value, 2):
            self.state = "open"  # the consume that returns the record
        if self.state == "before":
            return
        if call.carrying:
            self._taint(value, 2)
        call.carried = call.carried or call.carrying or self._carries(value)
        if self.stack and call.carried:
            self.stack[-1].carried = True
        root = call.root
        if call.role == "runtime" and call.carried and root is not None and root.before_close:
            if root is call:
                self.handoffs.append((call.module, call.function, call.inside))
            elif call.module not in (root.module, *root.inside):
                root.inside.append(call.module)
        receiver = frame.f_locals.get("self")
        if call.function == "persist" and isinstance(receiver, Commit) and call.carrying:
            self.state = "closed"  # step 6 of the commit that holds the input's decision

    def _is_record(self, value: Any, depth: int) -> bool:
        if isinstance(value, Message):
            at = (value.topic(), value.partition(), value.offset())
            if value.error() is None and at == self.position:
                self._track(value)
                return True
            return False
        if isinstance(value, list | tuple) and depth:
            return any(self._is_record(v, depth - 1) for v in value)
        return False

    def _carries(self, value: Any, depth: int = 2) -> bool:
        if id(value) in self.tracked or self._is_record(value, 0):
            return True
        if isinstance(value, list | tuple) and depth:
            return any(self._carries(v, depth - 1) for v in value)
        return False

    def _track(self, value: object) -> None:
        self.tracked[id(value)] = value

    def _taint(self, value: Any, depth: int) -> None:
        """What a call made of the input carries it on (not shared constants: True, a str)."""
        if value is None or isinstance(value, bool | int | float | str):
            return
        self._track(value)
        if isinstance(value, list | tuple) and depth:
            for v in value:
                self._taint(v, depth - 1)


def _is_property(receiver: object, name: str) -> bool:
    """Reading a property asks (is a commit open?); it hands nothing over."""
    return receiver is not None and isinstance(
        inspect.getattr_static(type(receiver), name, None), property
    )


def path(handoffs: list[Any]) -> list[str]:
    """The modules of the hand-offs (module, function, ...), consecutive repeats collapsed."""
    out: list[str] = []
    for module, *_ in handoffs:
        if not out or out[-1] != module:
            out.append(module)
    return out


def revisited(modules: list[str]) -> list[str]:
    return sorted({m for m in modules if modules.count(m) > 1})


# The child process: one engine over one input


def _settings(state_dir: Path) -> Settings:
    return load_settings(
        environ={},
        commit_overlap=False,
        partitions=PARTITIONS,
        state_dir=state_dir,
        metrics_port=0,
        commit_max_events=5,
        commit_interval_ms=60_000,  # the commit comes from the drained queue: no clock
        transaction_timeout_ms=65_000,
    )


def _events(kind: str) -> tuple[list[Event], Event]:
    """What is committed before the input, and the input."""
    t = PARK_MS + 1_000
    first = intent("e1", [OUT], [U, C], t=t)
    acked = ack("e2", AckOutcome.COMMITTED, t=t + 100)
    later = resume("e3", record([OUT], [U, C]), [U, C, OUT], runner="copy-a", t=t + 1_000)
    named: list[Event] = [
        replace(e, session_id=SESSION, event_id=f"{SESSION}/{e.event_id}")
        for e in (first, acked, later)
    ]
    return ([], named[0]) if kind == "intent" else (named[:2], named[2])


def _fold_step_calls_back_into_intake() -> None:
    """The mutation `--mutate` makes: after producing an input's outputs, step 2 asks the
    intake to apply its flow (a module calling back upstream)."""
    intakes: dict[int, Any] = {}
    init, answer = Loop.__init__, FoldStep._answer_overdue

    def loop_init(self: Loop, *args: Any) -> None:
        init(self, *args)
        intakes[id(self.fold_step)] = self.intake

    def answer_then_flow(self: FoldStep, commit: Commit, task: Any) -> None:
        answer(self, commit, task)
        intakes[id(self)].apply_flow()

    setattr(Loop, "__init__", loop_init)  # noqa: B010  (a mutation, on purpose)
    setattr(FoldStep, "_answer_overdue", answer_then_flow)  # noqa: B010


def trace(kind: str, state_dir: Path) -> dict[str, Any]:
    """Runs the engine until `kind`'s input is answered and committed; its path."""
    settings = _settings(state_dir)
    before, the_input = _events(kind)
    broker = FakeBroker(PARTITIONS)
    topic = settings.topics.topic_for(the_input)

    def append(event: Event) -> None:
        key = event.session_id.encode()
        broker.append(settings.topics.topic_for(event), key, CODEC.encode(event))

    for event in before:
        append(event)
    # the input's position: appended now, or once what comes before it is committed
    partition = partition_for(the_input.session_id.encode(), PARTITIONS)
    offset = len(broker.log(topic, partition)) if before else 0
    if not before:
        append(the_input)
    clients = FakeClients(broker)
    engine = Engine(settings, clients=clients)
    appended = [not before]

    def on_idle() -> None:
        txn = engine.transactions
        if len(engine.order) or (txn is not None and txn.open):
            return
        if not appended[0]:
            appended[0] = True
            append(the_input)
        else:
            engine.stop()

    clients.on_idle = on_idle
    tracer = PathTracer((topic, partition, offset))
    sys.setprofile(tracer.profile)
    try:
        engine.run()
    finally:
        sys.setprofile(None)
    answered = [
        decision.decision_id
        for p in range(PARTITIONS)
        for r in broker.log(settings.topics.decisions, p)
        if isinstance(decision := CODEC.decode(RecordType.DECISION, r.value), Decision)
    ]
    return {
        "handoffs": tracer.handoffs,
        "upstream": tracer.upstream,
        "persisted": tracer.state == "closed",
        "answered": the_input.event_id in answered,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one input's path through the runtime")
    parser.add_argument("kind", choices=["intent", "resume"])
    parser.add_argument("--mutate", action="store_true", help="step 2 calls back into intake")
    args = parser.parse_args(argv)
    if args.mutate:
        _fold_step_calls_back_into_intake()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(trace(args.kind, Path(tmp) / "state")))


# The tests


def _run(kind: str, *, mutate: bool = False) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.unit.runtime.test_module_path", kind]
    done = subprocess.run(
        [*command, *(["--mutate"] if mutate else [])],
        cwd=REPO,
        env=dict(os.environ, RECONCILER_PURE="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _show(kind: str, result: dict[str, Any]) -> None:
    modules = [m.removeprefix(RUNTIME) for m in path(result["handoffs"])]
    print(f"\n{kind}: {' -> '.join(modules) or '(no path)'}")
    for module, function, inside in result["handoffs"]:
        within = ", ".join(m.removeprefix(RUNTIME) for m in inside)
        print(f"  {module.removeprefix(RUNTIME)}.{function}" + (f"  [{within}]" if within else ""))


@pytest.mark.parametrize("kind", ["intent", "resume"])
def test_one_input_visits_each_runtime_module_once(kind: str) -> None:
    result = _run(kind)
    _show(kind, result)
    assert result["answered"], "the input got no committed decision"
    assert result["persisted"], "the trace never saw the input's commit persisted"
    modules = path(result["handoffs"])
    assert modules[0] == "engine.runtime.intake.intake"
    assert modules[-1] == "engine.runtime.commit.committer"
    assert revisited(modules) == []
    assert result["upstream"] == []


def test_a_module_calling_back_upstream_is_caught() -> None:
    """The check can fail: step 2 calling into the intake after producing is reported."""
    result = _run("intent", mutate=True)
    assert result["answered"]
    assert ["engine.runtime.fold_step", "engine.runtime.intake.intake", "apply_flow"] in result[
        "upstream"
    ]


def test_a_revisit_is_found() -> None:
    modules = path([("a", "f"), ("a", "g"), ("b", "h"), ("a", "i")])
    assert modules == ["a", "b", "a"]
    assert revisited(modules) == ["a"]


if __name__ == "__main__":
    main()
