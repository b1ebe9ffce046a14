"""`reconciler run` killed -9 and started again at once: its engine child dies with it, so at no
moment do two engines with one instance id run, and the new process's first child binds the
metrics port (an orphan would hold it and fence with the new child until it noticed).

"The kill settles" when the killed supervisor is reaped: by then the kernel has queued the
parent-death SIGKILL, so the old child runs no more code; a process with SIGKILL pending or in
its exit counts as gone (`running`). The census runs across three kill-restart cycles."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from engine.settings import Settings, settings_env
from tests.integration.engine_harness import REPO, engine_settings
from tools.kafka_local import free_port

pytestmark = pytest.mark.kafka

CYCLES = 3
SAMPLE_EVERY_S = 0.02

# `reconciler run` with its imports done before the kill and started by one line on stdin: a
# restart as quick as a process manager's. The engine's own orphan poll runs once a second, so
# a restart slower than that would not show an orphan.
WARM_RUN = """
import sys
from pathlib import Path
import engine.cli
Path(sys.argv[1]).touch()
sys.stdin.readline()
sys.exit(engine.cli.main(["run"]))
"""


class EngineCensus:
    """Scans /proc every 20 ms for running engine children of one test (command line with
    `--child`, environment naming its topic prefix); `most` is the largest count seen at once."""

    def __init__(self, settings: Settings) -> None:
        self.marker = f"RECONCILER_TOPIC_PREFIX={settings.topic_prefix}\0".encode()
        self.most = 0
        self.samples = 0
        self.crowded: list[list[int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="census", daemon=True)

    def engines(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
                if b"engine.cli\0run\0--child" not in command:
                    continue
                if self.marker in Path(f"/proc/{entry}/environ").read_bytes() and running(
                    int(entry)
                ):
                    found.append(int(entry))
            except OSError:  # it ended while we looked
                continue
        return found

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            found = self.engines()
            self.samples += 1
            self.most = max(self.most, len(found))
            if len(found) > 1:
                self.crowded.append(found)

    def __enter__(self) -> EngineCensus:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


PF_EXITING = 0x4  # <linux/sched.h>: the task is in do_exit
SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def running(pid: int) -> bool:
    """Alive and not on its way out. A zombie, an exiting process and one with SIGKILL pending
    run no more code of theirs: the kernel queues the parent-death SIGKILL before the killed
    supervisor can be reaped, and the tear-down of a large process can take a few ms after."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone
        return False
    fields = stat.rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, tty, tpgid, flags
    if fields[0] in ("Z", "X") or int(fields[6]) & PF_EXITING:
        return False
    pending = [
        int(line.split()[1], 16)
        for line in status.splitlines()
        if line.startswith(("SigPnd:", "ShdPnd:"))
    ]
    return not any(mask & SIGKILL_BIT for mask in pending)


def warm_run(settings: Settings, folder: Path, n: int) -> subprocess.Popen[bytes]:
    ready = folder / f"ready-{n}"
    proc = subprocess.Popen(
        [sys.executable, "-c", WARM_RUN, str(ready)],
        env=os.environ | settings_env(settings),
        stdin=subprocess.PIPE,
        stdout=(folder / f"run-{n}.log").open("ab"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, f"run {n} exited with {proc.returncode} before it was ready"
        assert time.monotonic() < deadline, f"run {n} did not import within 60 s"
        time.sleep(0.02)
    return proc


def go(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def listener_inode(port: int) -> str | None:
    """The inode of the socket listening on `port` (IPv4 any address), from /proc/net/tcp."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
            return fields[9]
    return None


def holds_socket(pid: int, inode: str) -> bool:
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == f"socket:[{inode}]":
                    return True
    return False


def first_child_serves(proc: subprocess.Popen[bytes], port: int, census: EngineCensus) -> int:
    """Waits for the supervisor's first child and for /metrics to answer on `port`; asserts that
    this first child holds the listening socket and is still the only child (never restarted)."""
    deadline = time.monotonic() + 60
    while not (started := children(proc.pid)):
        assert proc.poll() is None, f"reconciler run exited with {proc.returncode}"
        assert time.monotonic() < deadline, "reconciler run started no engine within 60 s"
        time.sleep(0.01)
    first = started[0]
    while True:
        url = f"http://127.0.0.1:{port}/metrics"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as answer:
            if answer.status == 200:
                break
        assert time.monotonic() < deadline, f"nothing answered on port {port} within 60 s"
        time.sleep(0.05)
    inode = listener_inode(port)
    assert inode is not None, f"nothing listens on port {port}"
    holder = next((pid for pid in [first, *census.engines()] if holds_socket(pid, inode)), None)
    assert holder == first, f"port {port} is held by {holder}, not the first child {first}"
    assert children(proc.pid) == [first], "the first engine child died and was replaced"
    return first


@pytest.mark.timeout(240)
def test_run_killed_9_and_started_at_once_never_has_two_engines(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    port = free_port()
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state", metrics_port=port)
    runs: list[subprocess.Popen[bytes]] = []
    census = EngineCensus(settings)
    try:
        runs.append(warm_run(settings, tmp_path, 0))
        go(runs[0])
        served = [first_child_serves(runs[0], port, census)]
        with census:
            for cycle in range(1, CYCLES + 1):
                runs.append(warm_run(settings, tmp_path, cycle))
                os.kill(runs[-2].pid, signal.SIGKILL)
                runs[-2].wait(timeout=10)  # the kill has settled: the supervisor is reaped
                go(runs[-1])
                served.append(first_child_serves(runs[-1], port, census))
            time.sleep(1.5)  # longer than the engine's orphan poll, so a late one would show
        assert census.samples >= 50, f"only {census.samples} samples of /proc"
        assert census.most == 1, f"engines running at once (pids per sample): {census.crowded[:5]}"
        assert len(set(served)) == CYCLES + 1
        assert [pid for pid in served[:-1] if running(pid)] == []
    finally:
        for run in runs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=30)
        for pid in census.engines():  # orphans of this test's runs, if the fix is broken
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
