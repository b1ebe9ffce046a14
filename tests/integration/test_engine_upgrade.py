"""A rolling upgrade of the engine, and a rollback, under live traffic on a real broker.

The previous release (tools/previous_release.py: the commit of the last release, built from
git into its own venv) and the current sources run side by side in one consumer group, each
instance with its own static member id, transactional id and state folder, as the pods of a
StatefulSet do. A replaced instance keeps its id and its state folder: the new version starts
on the local store and changelog the old one wrote, and the rolled-back one on the new one's.

What crosses versions, and what this checks of it:
* session state (changelog values and the local store's copies): the previous release must
  read what the current one writes exactly, or refuse it with `StateFormatError`; a silent
  misread is a bug. `test_the_previous_release_reads_or_refuses_current_state` finds out which
  it is for the release under test (for v3 against v4: refused), on samples that set every
  field of the state (tests/integration/state_samples.py); the rollout test then holds the
  engine to that answer. The other way, the current build must read every state the previous
  release writes, field by field:
  `test_the_current_build_reads_the_previous_releases_state_field_by_field`;
* the consumer group protocol (assignor, static membership) and the transactional ids: both
  versions must share partitions and fence each other;
* the committed offsets and their owner mark (engine/runtime/commit/fencing.py).

The runners are not upgraded meanwhile: their inputs are written in the schema versions the
previous release writes (a release that adds an input version must be rolled out to the
engines before the runners use it; the older engine dead-letters what it cannot read).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from msgspec.structs import replace

from engine.core.events import (
    AckEvent,
    Decision,
    Event,
    IntentEvent,
    Reason,
    RepairEvent,
    ResumeEvent,
    Verdict,
)
from engine.core.state import SessionState
from engine.runtime.tasks.state_codec import decode_state, encode_state
from engine.settings import Settings, settings_env
from engine.wire import RecordType
from tests.integration import state_samples
from tests.integration.engine_harness import (
    CODEC,
    EngineProcess,
    engine_settings,
    read_decisions,
)
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload
from tests.integration.group_probes import (
    Encode,
    end_offsets,
    every_partition_answers,
    member_ids,
    runner_traffic,
    sessions_carried,
    wait_for_holders,
)
from tools import previous_release
from tools.kafka_cluster import Cluster

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]


def _across_releases(decision: Decision) -> Decision:
    """The previous release answers RECORDED PARKED with final=true, this one with final=false
    (SPEC §7, answers changed without a schema change); every other field must agree."""
    if decision.verdict is Verdict.RECORDED and decision.reason is Reason.PARKED:
        return replace(decision, final=True)
    return decision


READ = "read"
REFUSED = "refused"

# Run by the previous release's python: each line of stdin is a state the current engine
# wrote (hex); the answer is that state as the previous release writes it back after reading
# it, or the error it refused it with.
ROUND_TRIP = """
import sys
from engine.runtime.state_codec import StateFormatError, decode_state, encode_state
for line in sys.stdin:
    try:
        print("read", encode_state(decode_state(bytes.fromhex(line.strip()))).hex())
    except StateFormatError as exc:
        print("refused", str(exc).replace("\\n", " "))
"""

# Run by the previous release's python: each line of stdin is `run record_type offset hex`,
# one input of a session (run) in the schema version its runners write; the previous release
# folds it and answers the state it then writes (hex) and that state's record (JSON).
FOLD = """
import sys
import msgspec
from engine.core.fold import fold
from engine.runtime.state_codec import encode_state
from engine.wire import Codec, RecordType
codec, states = Codec(), {}
for line in sys.stdin:
    run, kind, offset, data = line.split()
    event = codec.decode(RecordType(kind), bytes.fromhex(data))
    state = states[run] = fold(states.get(run), event, int(offset)).state
    print(encode_state(state).hex(), msgspec.json.encode(state.to_record()).decode())
"""

# Run by the previous release's python: the schema version it writes of each record type.
CURRENT_VERSIONS = """
import json
from engine.wire.policy import POLICY
print(json.dumps({record_type.value: policy.current for record_type, policy in POLICY.items()}))
"""

RECORD_TYPES = {
    IntentEvent: RecordType.INTENT,
    AckEvent: RecordType.ACK,
    ResumeEvent: RecordType.RESUME,
    RepairEvent: RecordType.REPAIR,
}


@pytest.fixture(scope="module")
def previous_python() -> Path:
    """The previous release's interpreter. A release that cannot be built fails the test with
    the reason (a shallow clone, no network for a cold pip cache): never a silent skip."""
    try:
        return previous_release.build()
    except previous_release.ReleaseBuildError as exc:
        pytest.fail(f"the previous release could not be built, so no upgrade was tested: {exc}")


def _release_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a previous-release process: nothing that would import this clone."""
    return {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _run_previous(python: Path, script: str, lines: list[str], what: str) -> list[str]:
    """The previous release's python runs ``script`` on ``lines``: its output lines."""
    done = subprocess.run(
        [str(python), "-c", script],
        input="".join(f"{line}\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=python.parents[2],
        env=_release_env(dict(os.environ)),
        check=False,
    )
    assert done.returncode == 0, f"the previous release crashed on {what}:\n{done.stderr}"
    answers = done.stdout.splitlines()
    assert len(answers) == len(lines), f"{len(answers)} answers to {len(lines)} {what}"
    return answers


def _previous_versions(python: Path) -> dict[RecordType, int]:
    """The schema version of each record type the previous release (and its runners) write."""
    done = subprocess.run(
        [str(python), "-c", CURRENT_VERSIONS],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=python.parents[2],
        env=_release_env(dict(os.environ)),
        check=True,
    )
    return {RecordType(name): version for name, version in json.loads(done.stdout).items()}


def _as_previous_runners_write(python: Path) -> Encode:
    """Inputs in the schema versions the previous release's runners write (and its engine
    reads): during an engine upgrade the runners are not upgraded yet."""
    versions = _previous_versions(python)
    return lambda event: CODEC.encode(event, version=versions[RECORD_TYPES[type(event)]])


def _sample_states() -> list[SessionState]:
    """Every state the sample runs pass through (tests/integration/state_samples.py), checked
    to exercise every field of the state, nested ones included."""
    states = state_samples.sample_states(state_samples.runs())
    assert state_samples.unexercised(states) == [], "the samples leave these fields unexercised"
    return states


def _assert_reads_back(state: SessionState, written: bytes, who: str) -> None:
    """``written`` (what ``who`` wrote after reading ``state``) reads as ``state``, field by
    field."""
    differing = state_samples.differing_fields(decode_state(written), state)
    assert not differing, (
        f"{who} loses or changes these fields of session {state.session_id}: {differing}"
    )


def _rollback_outcome(python: Path) -> tuple[str, str]:
    """Whether the previous release reads the current state format (READ: every sample comes
    back through its decode and encode equal field by field) or refuses it (REFUSED: every
    sample, each with the operator's fix; then the current build, which takes over again, must
    read back every sample it wrote, field by field). Anything else, a sample read
    differently or some read and some refused, fails here."""
    states = _sample_states()
    written = [encode_state(s) for s in states]
    answers = [
        line.split(" ", 1)
        for line in _run_previous(python, ROUND_TRIP, [w.hex() for w in written], "current state")
    ]
    kinds = {kind for kind, _ in answers}
    if kinds == {REFUSED}:
        for state, data in zip(states, written, strict=True):
            _assert_reads_back(state, data, "the current build, reading back its own state,")
        for _, message in answers:
            assert "Fix:" in message, message
            assert "upgrade the engine" in message, message
        return REFUSED, answers[0][1]
    assert kinds == {READ}, f"the previous release read some states and refused others: {kinds}"
    for state, (_, written_back) in zip(states, answers, strict=True):
        _assert_reads_back(
            state,
            bytes.fromhex(written_back),
            "the previous release misreads current state (a rollback would decide on wrong "
            "state; make the new format refused by the old release, a new schema version whose "
            "fingerprint is unknown there, or keep it readable):",
        )
    return READ, ""


@pytest.mark.timeout(900)  # a cold build of the previous release installs its dependencies
def test_the_previous_release_reads_or_refuses_current_state(previous_python: Path) -> None:
    """New writes, old reads. Catches a state format change that the previous release would
    silently misread on a rollback (same schema fingerprint, different meaning or layout), a
    build that keeps the old format readable by dropping what it cannot hold (the causal
    order), and a refusal without the operator's fix in it. The samples: every state (2,144)
    on the way of 360 sessions of the lifecycle model's runners (open writes, parked intents,
    acks and resumes, inputs waiting for their causes, producer marks, grants, AMBIGUOUS and
    VIOLATED health, repairs), checked to set every field of the state.

    For the release under test (it writes session_state v3, this build v4) the answer is
    REFUSED, so the rollback is the refused one: the old instance answers nothing and the
    current build takes over again, reading back what it wrote.

    Seen to fail (5 December 2026) on: `encode_state` dropping `causal_waiting`
    (`_CODEC.encode(replace(state, causal_waiting=[]))` in engine/runtime/tasks/state_codec.py):
    "the current build, reading back its own state, loses or changes these fields of session
    sample-...: ['causal_waiting']"; and on `encode_state` writing the previous release's
    version (`_CODEC.encode(state, version=3)`, the causal fields dropped as a v3 writer
    would): the previous release then reads every sample, and "the previous release misreads
    current state ...: ['causal_waiting', 'producers']"."""
    _rollback_outcome(previous_python)


@pytest.mark.timeout(900)
def test_the_current_build_reads_the_previous_releases_state_field_by_field(
    previous_python: Path,
) -> None:
    """Old writes, new reads. The previous release folds the sample sessions' inputs (in the
    schema versions its runners write) and writes every state on the way; the current build
    reads each of them as the previous release held it (its JSON record): every field it knows
    equal, the causal ones (new in v4) at their defaults. Then it writes each back in its own
    version and reads it again without loss. The states the previous release wrote must set
    every field its version holds.

    Seen to fail (5 December 2026) on: `decode_state` dropping `parked_acks` of a state
    written in an older version (`replace(state, parked_acks=[])` unless the value starts
    with the current schema's header): "the current build reads the previous release's state
    of session sample-... with these fields changed: ['parked_acks']"."""
    versions = _previous_versions(previous_python)
    runs = state_samples.runs()
    lines = [
        f"{n} {RECORD_TYPES[type(event)].value} {offset} "
        + CODEC.encode(event, version=versions[RECORD_TYPES[type(event)]]).hex()
        for n, run in enumerate(runs)
        for event, offset in run
    ]
    written: dict[str, str] = {}  # state (hex) -> its record (JSON), once per distinct state
    for line in _run_previous(previous_python, FOLD, lines, "the sample inputs"):
        data, record = line.split(" ", 1)
        written.setdefault(data, record)
    read: list[SessionState] = []
    for data, record in written.items():
        held = SessionState.from_record(msgspec.json.decode(record))
        got = decode_state(bytes.fromhex(data))
        differing = state_samples.differing_fields(got, held)
        assert not differing, (
            f"the current build reads the previous release's state of session "
            f"{held.session_id} with these fields changed: {differing}"
        )
        _assert_reads_back(got, encode_state(got), "the current build, writing it back,")
        read.append(got)
    older = state_samples.causal_fields()
    assert state_samples.unexercised(read, skip=older) == [], "unexercised in the old release"


@dataclass
class ReleaseProcess(EngineProcess):
    """`reconciler run` of the previous release: its venv's python, started outside the clone
    (so the clone's `engine/` cannot be imported instead of the installed one)."""

    python: Path = field(default=Path("python"))

    def start(self) -> ReleaseProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(
            [str(self.python), "-m", "engine.cli", "run"],
            env=_release_env(settings_env(self.settings) | self.extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.python.parents[2],
            start_new_session=True,
        )
        return self


@dataclass
class Rollout:
    """The instances by static member id (engines on `base`'s bootstrap, checks on `checks`),
    the probes sent and what each step observed."""

    base: Settings
    checks: str
    tmp: Path
    encode: Encode
    procs: dict[str, EngineProcess] = field(default_factory=dict)
    probes: list[Event] = field(default_factory=list)
    owners: dict[str, set[int]] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    stopped: dict[str, str] = field(default_factory=dict)  # name -> its stopped member's id

    def slot(self, name: str) -> Settings:
        return self.base.model_copy(update={"instance_id": name, "state_dir": self.tmp / name})

    def start(self, name: str, version: str, python: Path | None) -> None:
        log = self.tmp / f"{name}-{len(self.steps)}-{version}.log"
        if python is None:
            self.procs[name] = EngineProcess(self.slot(name), log).start()
        else:
            self.procs[name] = ReleaseProcess(self.slot(name), log, python=python).start()
        self.steps.append(f"{name}:{version}")

    def replace(self, name: str, version: str, python: Path | None) -> None:
        """SIGTERM (drain, commit, exit 0) and the other version in its place, same id and
        state folder, then wait until both instances answer on their partitions."""
        self.replace_without_waiting(name, version, python)
        self.serving()

    def replace_without_waiting(self, name: str, version: str, python: Path | None) -> None:
        assert self.procs[name].terminate() == 0, f"{name} did not drain and exit 0"
        # The stopped process's static membership outlives it by a session timeout (partitions
        # included): note its member id, so only the replacement's own join counts.
        stopped = member_ids(self.checks, self.base).get(name)
        if stopped is not None:
            self.stopped[name] = stopped
        self.start(name, version, python)

    def serving(self, timeout_s: float = 90) -> None:
        """Both members hold partitions, each replaced one under its replacement's own join
        (not the stopped process's lingering membership), and every partition answers a
        fresh probe."""
        try:
            _, self.owners = wait_for_holders(
                self.checks, self.base, set(self.procs), timeout_s, replaced=self.stopped
            )
        except AssertionError as exc:
            raise AssertionError(
                f"after {self.steps[-1]}: the versions do not share the group: {exc}"
            ) from exc
        self.stopped.clear()
        sent, _ = every_partition_answers(
            self.checks, self.base, f"probe-{len(self.steps)}", timeout_s, self.encode
        )
        self.probes += sent

    def refused_rollback(self, name: str, python: Path, timeout_s: float = 60) -> None:
        """The previous release in `name`'s place refuses the state the current one wrote
        (it logs why and answers nothing from it); then the current build comes back."""
        self.replace_without_waiting(name, "refusing", python)
        log = self.procs[name].log_path
        deadline = time.monotonic() + timeout_s
        while "unreadable session state" not in log.read_text():
            assert time.monotonic() < deadline, f"the rolled-back {name} never refused the state"
            time.sleep(0.2)
        self.replace(name, "current-again", None)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.alive():
                proc.kill_all()


@pytest.mark.timeout(900)  # a cold build of the previous release installs its dependencies
def test_rolling_upgrade_and_rollback_under_traffic_keep_exactly_once(
    cluster: Cluster, unique_name: str, tmp_path: Path, previous_python: Path
) -> None:
    """Two instances of the previous release serve runner traffic; each is replaced by the
    current build in turn; then one is rolled back. Every input is answered exactly once and
    every answer equals the pure fold's on the same inputs (tests/integration/exactly_once.py).

    Would catch: a group protocol the versions cannot share (an assignor or membership
    change: the new instance never gets partitions); transactional or owner-mark ids that
    change across versions (a replaced instance's transaction not fenced: duplicates); state
    the other version loses or misreads from the changelog or the local store it inherits
    (answers that differ from the replay); a rolled-back instance that decides on state it
    refused instead of stopping (if the previous release refuses the current state format,
    the rolled-back instance must say so in its log and answer nothing from it).

    Seen to fail (5 December 2026) with the current build's `partition.assignment.strategy`
    changed from range to roundrobin in `consumer_config` (an assignor the previous release
    does not share): its JoinGroup was refused with INCONSISTENT_GROUP_PROTOCOL while a
    previous-release instance was in the group, and after the second replacement the test
    failed with "no final answer within 90 s to ['probe-4-0', 'probe-4-2', 'probe-4-3']".
    Seen to fail (5 December 2026) on: the current build never subscribing (`consumer.subscribe`
    removed from `Engine._create_clients`): the first replacement (a:current) never joins, and
    the step fails after its 90 s wait; before the wait required the replacement's own join,
    the stopped instance's lingering static membership let that step pass."""
    outcome, _ = _rollback_outcome(previous_python)
    checks = cluster.direct_bootstrap
    base = engine_settings(cluster.bootstrap, unique_name, tmp_path / "state")
    # More than the rollout needs at runner_traffic's 150 inputs/s (~50 s): traffic until the
    # last step is done, and sessions spread wide enough that many span each step.
    events = workload(3_000, seed=6)
    runners_write = _as_previous_runners_write(previous_python)
    rollout = Rollout(base, checks, tmp_path, runners_write)
    started = time.monotonic()
    try:
        rollout.start("a", "previous", previous_python)
        rollout.start("b", "previous", previous_python)
        rollout.serving()
        with runner_traffic(checks, base, events, encode=runners_write) as sent:
            time.sleep(3)
            rollout.replace("a", "current", None)
            time.sleep(3)
            rollout.replace("b", "current", None)
            time.sleep(2)
            newer_b = end_offsets(checks, base)  # inputs from here on on b's partitions: new b's
            time.sleep(3)
            if outcome == READ:
                rollout.replace("b", "rolled-back", previous_python)
            else:
                rollout.refused_rollback("b", previous_python)
            rolled_back = end_offsets(checks, base)  # from here on on b's partitions: old b's
            time.sleep(5)
        produced = read_inputs(checks, base)
        seen = read_decisions(checks, base, until=len(produced), timeout_s=120, inputs=True)
        for name, proc in rollout.procs.items():
            assert proc.terminate() == 0, f"{name} did not drain and exit 0"
    finally:
        rollout.stop_all()
    took = time.monotonic() - started
    print(f"rollout {' -> '.join(rollout.steps)}: {len(produced)} inputs in {took:.0f} s")
    assert len(produced) == len(sent) + len(rollout.probes)
    assert_exactly_once(sent + rollout.probes, seen, produced, same=_across_releases)
    if outcome == READ:
        crossed = sessions_carried(
            produced, rollout.owners["b"], (newer_b, rolled_back), rolled_back
        )
        print(f"sessions carried from the current build into the rolled-back one: {len(crossed)}")
        assert crossed, "no session's state crossed from the current build to the rolled-back one"
