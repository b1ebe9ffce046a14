"""Throughput of several commits of the engine, paired round by round on one broker.

    python -m tools.bench_paired --commit 226971f --commit a62843d --commit HEAD [--rounds 5]
    python -m tools.bench_paired --commit A --commit B --build-only   # the builds, no broker

Each commit gets its own compiled build (`make setup`'s: an install of `.[dev]` into a venv,
then `tools/build_compiled.py` in place), made once from `git archive` into the tool cache
(tools/cache.py) and reused; the builds pin every dependency to the versions of the venv that
runs this tool, so the commits differ by their own code alone. Builds run at nice 15.

Then one broker (tools/kafka_local.py, instance `bench-paired`, fresh, stopped at the end),
one uncounted warm-up round and N rounds; round r runs the commits in rotating order (round 2
starts with the second commit), so none always runs first or after the same neighbour. Each
run is `make bench`'s throughput run of `reconciler run` with 1 process (`run_system` of
tools/bench_engine.py) on fresh topics, driven by that commit's OWN bench code: its
tools/bench_fold.py mix encoded by its own codec (tools/bench_paired_worker.py), so each build
reads the schema versions it knows. The table of workloads printed first says what differs.

Per round: inputs/s once answers flow and the engine's CPU us/input, and each commit's ratio to
the first commit in the same round; then min / median / max of those ratios. Every
broker-facing step has a wall-clock deadline (`--run-timeout` per run, `--deadline` for all).
Exit status: 0 when every counted run answered, 1 when a run failed or timed out, 2 on a bad
argument or a failed build.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from tools.cache import tool_dir
from tools.previous_release import (
    REPO,
    ReleaseBuildError,
    build_once,
    commit_of,
    extract,
    run_step,
)

INSTANCE = "bench-paired"
NICE = 15
STEP_TIMEOUT_S = 1800.0
"""The install of `.[dev]` and mypyc's build, each 3-4 min of CPU: at nice 15 on a loaded
machine (load 15-25 on 2 cores) either took over 10 min of wall-clock time."""
READY_TIMEOUT_S = 300.0
"""A worker's start: imports, and building and encoding the input (~6 s at 20,000 sessions)."""
WORKER = Path(__file__).with_name("bench_paired_worker.py")


class UsageError(Exception):
    """A bad argument; the message says which and why."""


@dataclass(frozen=True)
class Commit:
    label: str  # as given (`HEAD`, `226971f`)
    sha: str

    @property
    def short(self) -> str:
        return self.sha[:7]


@dataclass(frozen=True)
class Result:
    rate: float  # inputs/s once answers flow
    cpu_us: float  # the engine's CPU per input, us


# -- arguments ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_paired", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--commit",
        action="append",
        default=[],
        dest="commits",
        metavar="REF",
        help="a commit, tag or branch of this clone; at least two; the first is the baseline",
    )
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted rounds first")
    parser.add_argument("--sessions", type=int, default=20_000, help="64,000 inputs at 20,000")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--commit-ms", type=int, default=100)
    parser.add_argument(
        "--run-timeout", type=float, default=300, help="wall-clock seconds for one run"
    )
    parser.add_argument(
        "--deadline", type=float, default=3600, help="wall-clock seconds for every run together"
    )
    parser.add_argument("--build-only", action="store_true", help="make the builds and stop")
    args = parser.parse_args(argv)
    checks = (
        (len(args.commits) >= 2, "give at least two --commit (the first is the baseline)"),
        (
            len(set(args.commits)) == len(args.commits),
            f"each --commit once (got {', '.join(args.commits)})",
        ),
        (args.rounds >= 1, f"--rounds must be at least 1 (got {args.rounds})"),
        (args.warmup >= 0, f"--warmup must be 0 or more (got {args.warmup})"),
        (args.sessions >= 1, f"--sessions must be at least 1 (got {args.sessions})"),
        (args.partitions >= 1, f"--partitions must be at least 1 (got {args.partitions})"),
        (args.commit_ms >= 1, f"--commit-ms must be at least 1 (got {args.commit_ms})"),
        (args.run_timeout >= 60, f"--run-timeout must be at least 60 s (got {args.run_timeout})"),
        (args.deadline > 0, f"--deadline must be positive (got {args.deadline})"),
    )
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    return args


def resolve_commits(refs: Sequence[str]) -> list[Commit]:
    commits = []
    for ref in refs:
        sha = commit_of(ref)
        if sha is None:
            raise UsageError(
                f"unknown commit {ref!r}: not a commit of this clone ({REPO}); "
                "`git log --oneline` lists them"
            )
        commits.append(Commit(ref, sha))
    return commits


def uncommitted_note(commits: Sequence[Commit]) -> str | None:
    """A warning when a commit given as HEAD leaves this work tree's edits out."""
    if not any(c.label == "HEAD" for c in commits):
        return None
    status = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if not status.stdout.strip():
        return None
    return "note: HEAD is the last commit; this work tree's uncommitted changes are not measured"


# -- rounds and ratios (no broker) -------------------------------------------------------


def rotation(items: Sequence[str], round_no: int) -> list[str]:
    """The order of round `round_no` (0-based): each round starts one item later."""
    shift = round_no % len(items)
    return [*items[shift:], *items[:shift]]


def ratios(
    rounds: Sequence[dict[str, Result | None]], base: str, other: str, cpu: bool = False
) -> list[float | None]:
    """`other` ÷ `base` in each round (rates, or CPU per input with `cpu`); None where either
    run failed."""
    found: list[float | None] = []
    for runs in rounds:
        a, b = runs.get(base), runs.get(other)
        if a is None or b is None:
            found.append(None)
            continue
        top, bottom = (b.cpu_us, a.cpu_us) if cpu else (b.rate, a.rate)
        found.append(top / bottom if bottom else None)
    return found


def spread(values: Sequence[float | None]) -> str:
    """min / median / max of the values that exist."""
    present = [v for v in values if v is not None]
    if not present:
        return "n/a"
    return f"{min(present):.2f} / {statistics.median(present):.2f} / {max(present):.2f}"


def _cell(value: float | None, fmt: str) -> str:
    return "failed" if value is None else format(value, fmt)


def table(commits: Sequence[Commit], rounds: Sequence[dict[str, Result | None]]) -> list[str]:
    """The Markdown tables: rates with their ratios, CPU per input with its ratios."""
    base, others = commits[0], commits[1:]
    lines = []
    for what, cpu in (("inputs/s", False), ("engine CPU us/input", True)):
        head = [c.label for c in commits] + [f"{c.label} / {base.label}" for c in others]
        lines.append(f"| {what}: round | " + " | ".join(head) + " |")
        lines.append("|---" * (len(head) + 1) + "|")
        ratio_columns = [ratios(rounds, base.label, c.label, cpu) for c in others]
        for r, runs in enumerate(rounds):
            values = [runs.get(c.label) for c in commits]
            cells = [
                _cell(None if v is None else (v.cpu_us if cpu else v.rate), ",.0f") for v in values
            ]
            cells += [_cell(column[r], ".2f") for column in ratio_columns]
            lines.append(f"| {r + 1} | " + " | ".join(cells) + " |")
        mins = ["" for _ in commits] + [spread(column) for column in ratio_columns]
        lines.append("| min / median / max | " + " | ".join(mins) + " |")
        lines.append("")
    return lines


# -- builds --------------------------------------------------------------------------------


def constraints() -> str:
    """Every package of the venv running this tool at its version, the project itself left
    out: the builds install exactly these."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    keep = [line for line in frozen.splitlines() if line and not line.startswith("reconciler")]
    return "\n".join(sorted(keep)) + "\n"


def build_dir(commit: str, pins: str) -> Path:
    pins_key = hashlib.sha256(pins.encode()).hexdigest()[:8]
    return tool_dir("reconciler-bench", f"{commit[:12]}-{pins_key}")


def _nice() -> None:
    os.nice(NICE)


def _build_into(folder: Path, commit: str, pins: str) -> None:
    source, venv = folder / "src", folder / "venv"
    extract(commit, source)
    (folder / "constraints.txt").write_text(pins)
    python = str(venv / "bin" / "python")
    run_step([sys.executable, "-m", "venv", str(venv)], "creating the venv")
    pip = [python, "-m", "pip", "install", "--quiet", "-c", str(folder / "constraints.txt")]
    run_step(
        [*pip, "-e", ".[dev]"],
        f"installing {commit[:12]} (editable, with .[dev])",
        STEP_TIMEOUT_S,
        preexec_fn=_nice,
        cwd=source,
    )
    pure_build = os.environ | {"RECONCILER_PURE": "1"}
    run_step(
        [python, "-m", "tools.build_compiled"],
        f"the compiled build of {commit[:12]}",
        STEP_TIMEOUT_S,
        env=pure_build,
        preexec_fn=_nice,
        cwd=source,
    )
    mode = subprocess.run(
        [python, "-c", "from engine import compiled; print(compiled.mode())"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=source,
        env=_run_env(),
    )
    if mode.stdout.strip() != "compiled":
        raise ReleaseBuildError(
            f"the build of {commit[:12]} does not load compiled ({mode.stdout.strip()!r}); "
            f"{mode.stderr[-1000:]}"
        )
    (folder / "build.json").write_text(json.dumps({"commit": commit}) + "\n")


def build(commit: Commit, pins: str) -> Path:
    """The source folder of `commit`'s compiled build (its venv is `../venv`); made now unless
    cached."""
    folder = build_dir(commit.sha, pins)
    if not (folder / ".complete").exists():
        print(
            f"building {commit.label} ({commit.short}) into {folder} at nice {NICE} ...", flush=True
        )
        started = time.monotonic()
        build_once(folder, lambda into: _build_into(into, commit.sha, pins))
        print(f"  built in {time.monotonic() - started:.0f} s", flush=True)
    return folder / "src"


def _run_env() -> dict[str, str]:
    """This environment without what would change the build a run loads."""
    drop = {"RECONCILER_PURE", "PYTHONPATH", "VIRTUAL_ENV"}
    return {k: v for k, v in os.environ.items() if k not in drop}


# -- workers -------------------------------------------------------------------------------


class WorkerError(Exception):
    """A worker did not answer in time or ended; the message says which and where its log is."""


class Worker:
    """One commit's tools/bench_paired_worker.py, started in that commit's build."""

    def __init__(self, commit: Commit, source: Path, settings: dict[str, Any], logs: Path) -> None:
        self.commit = commit
        self.source = source
        self.settings = settings
        self.log = logs / f"{commit.short}-{commit.label.replace('/', '_')}.log"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        python = self.source.parent / "venv" / "bin" / "python"
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [str(python), "-c", WORKER.read_text(), json.dumps(self.settings)],
                cwd=self.source,
                env=_run_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,  # its own group: kill() reaches what it started
            )

    def ready(self, deadline: float) -> dict[str, Any]:
        reply = self._reply(deadline)
        if "ready" not in reply:
            raise WorkerError(f"{self.commit.label}: unexpected start reply {reply}")
        workload: dict[str, Any] = reply["ready"]
        return workload

    def run(self, bootstrap: str, deadline: float) -> Result | str:
        """One run; a Result, or why it failed."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
            self.ready(deadline)
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"bootstrap": bootstrap}) + "\n")
        self.proc.stdin.flush()
        reply = self._reply(deadline)
        if "run" in reply:
            return Result(rate=reply["run"]["rate"], cpu_us=reply["run"]["cpu_us"])
        return str(reply.get("failed", reply))

    def _reply(self, deadline: float) -> dict[str, Any]:
        assert self.proc is not None
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(max(0.0, deadline - time.monotonic())):
                self.kill()
                raise WorkerError(
                    f"{self.commit.label}: no answer before the deadline; killed (log: {self.log})"
                )
        line = self.proc.stdout.readline()
        if not line:
            self.kill()
            raise WorkerError(f"{self.commit.label}: the worker ended (log: {self.log})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the worker and everything it started (the engine runs in its own group)."""
        if self.proc is None:
            return
        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(OSError):
                group = os.getpgid(pid)
                if group != os.getpgrp():
                    os.killpg(group, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        self.proc = None


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc."""
    found: list[int] = []
    tasks = Path(f"/proc/{pid}/task")
    with contextlib.suppress(OSError):
        for task in list(tasks.iterdir()):
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    found += [int(child), *descendants(int(child))]
    return found


# -- the run ---------------------------------------------------------------------------------


def _utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def workloads(commits: Sequence[Commit], described: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "workloads: each commit's OWN generator and codec (its tools/bench_fold.py mix, encoded "
        "by its tools/bench_kafka.py), so each build reads the schema versions it writes:",
        "| commit | build | inputs by kind | schema versions | bytes/input by kind | event ids |",
        "|---|---|---|---|---|---|",
    ]
    for c in commits:
        d = described[c.label]
        kinds = ", ".join(f"{k} {n:,}" for k, n in d["kinds"].items())
        versions = ", ".join(f"{k} {v}" for k, v in d["versions"].items())
        sizes = ", ".join(f"{k} {b:.0f}" for k, b in d["bytes"].items())
        lines.append(
            f"| {c.label} ({c.short}) | {d['mode']} | {kinds} | {versions} | {sizes} | "
            f"sha256 {d['events_sha256']} |"
        )
    first = described[commits[0].label]
    same = [described[c.label]["events_sha256"] == first["events_sha256"] for c in commits]
    fields = ("versions", "bytes")
    differs = [f for f in fields if any(described[c.label][f] != first[f] for c in commits)]
    lines.append(
        "same events in the same order in every workload: "
        + ("yes" if all(same) else "NO (the generators differ; the ratios compare workloads too)")
        + "; differs: "
        + (
            ", ".join({"versions": "schema versions", "bytes": "encoded sizes"}[f] for f in differs)
            or "nothing"
        )
    )
    return lines


@contextlib.contextmanager
def broker() -> Iterator[str]:
    """A fresh broker of its own, stopped at the end; its start and its stop have deadlines of
    their own (RECONCILER_KAFKA_START_TIMEOUT, 90 s unless set; 30 s, then SIGKILL)."""
    from tools import kafka_local

    try:
        info = kafka_local.start(INSTANCE, fresh=True)
    except kafka_local.SetupError as exc:
        raise WorkerError(f"the broker did not start: {exc}") from exc
    try:
        yield info.bootstrap
    finally:
        kafka_local.stop(INSTANCE)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # the finally blocks stop the broker and the workers


def measure(args: argparse.Namespace, commits: list[Commit], sources: dict[str, Path]) -> int:
    labels = [c.label for c in commits]
    logs = Path(tempfile.mkdtemp(prefix="bench-paired-"))
    settings = {
        "sessions": args.sessions,
        "partitions": args.partitions,
        "commit_ms": args.commit_ms,
        "timeout": max(30.0, args.run_timeout - 120),  # produce, start and stop inside the rest
    }
    workers = {c.label: Worker(c, sources[c.label], settings, logs) for c in commits}
    end = time.monotonic() + args.deadline
    rounds: list[dict[str, Result | None]] = []
    failures: list[str] = []
    try:
        for worker in workers.values():
            worker.start()  # they build their input side by side
        described = {
            label: w.ready(min(end, time.monotonic() + READY_TIMEOUT_S))
            for label, w in workers.items()
        }
        print("\n".join(workloads(commits, described)), flush=True)
        pure = [label for label in labels if described[label]["mode"] != "compiled"]
        if pure:
            print(f"bench_paired: {', '.join(pure)} would run uncompiled; not measuring")
            return 2
        with broker() as bootstrap:
            total = args.warmup + args.rounds
            for n in range(total):
                counted = n >= args.warmup
                name = f"round {n - args.warmup + 1}" if counted else f"warm-up {n + 1}"
                runs: dict[str, Result | None] = {}
                for label in rotation(labels, n - args.warmup if counted else n):
                    if time.monotonic() >= end:
                        raise WorkerError(f"--deadline of {args.deadline:.0f} s passed")
                    started = time.monotonic()
                    try:
                        got = workers[label].run(bootstrap, min(end, started + args.run_timeout))
                    except WorkerError as exc:
                        got = str(exc)
                    if isinstance(got, Result):
                        runs[label] = got
                        shown = f"{got.rate:,.0f} inputs/s, engine CPU {got.cpu_us:,.0f} us/input"
                    else:
                        runs[label] = None
                        shown = f"FAILED: {got}"
                        if counted:
                            failures.append(f"{name} {label}: {got}")
                    print(
                        f"  {name}: {label}: {shown} ({time.monotonic() - started:.0f} s, "
                        f"load {_load()})",
                        flush=True,
                    )
                if counted:
                    rounds.append(runs)
    except WorkerError as exc:
        failures.append(str(exc))
    except BaseException:  # interrupted (Ctrl-C, SIGTERM): nothing of it may outlive this
        for worker in workers.values():
            worker.kill()
        raise
    finally:
        for worker in workers.values():
            worker.close()  # a killed worker: nothing left to close
    print()
    print("\n".join(table(commits, rounds)))
    print(f"logs: {logs}; load average at the end {_load()}")
    if failures:
        print("bench_paired: FAILED runs:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    try:
        args = parse_args(argv)
        commits = resolve_commits(args.commits)
    except UsageError as exc:
        print(f"bench_paired: error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    plan = (
        "the builds only"
        if args.build_only
        else f"{args.sessions:,} sessions, {args.partitions} partitions, commit every "
        f"{args.commit_ms} ms, `reconciler run` with 1 process; {args.warmup} warm-up + "
        f"{args.rounds} rounds, rotating order; ratios to {commits[0].label}"
    )
    print(
        f"bench_paired: {_utc()}: {', '.join(f'{c.label} = {c.short}' for c in commits)}; "
        f"{plan}; load average {_load()}",
        flush=True,
    )
    note = uncommitted_note(commits)
    if note:
        print(note)
    pins = constraints()
    try:
        sources = {c.label: build(c, pins) for c in commits}
    except ReleaseBuildError as exc:
        print(f"bench_paired: build failed: {exc}", file=sys.stderr)
        return 2
    if args.build_only:
        for c in commits:
            print(f"  {c.label}: {sources[c.label]}")
        return 0
    code = measure(args, commits, sources)
    print(f"bench_paired: {_utc()}: {time.monotonic() - started:.0f} s in all")
    return code


if __name__ == "__main__":
    sys.exit(main())
