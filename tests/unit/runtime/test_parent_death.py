"""An engine child dies with its supervisor at once (Linux parent-death signal), and one whose
supervisor died before it could ask for that signal exits by itself as it starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.runtime.process.supervisor import ORPHANED_EXIT, SUPERVISOR_ENV

REPO = Path(__file__).resolve().parents[3]

# The child as `_run_engine` starts: the parent-death request first, then work (a long sleep).
CHILD = """
import os, sys, time
from engine.runtime.process.supervisor import die_with_supervisor
die_with_supervisor()
print(os.getpid(), flush=True)
time.sleep(120)
"""

# A stand-in supervisor: starts CHILD with the variable `reconciler run` sets, prints its pid.
PARENT = f"""
import os, subprocess, sys
env = dict(os.environ, {SUPERVISOR_ENV}=str(os.getpid()))
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], env=env, stdout=subprocess.PIPE)
print(child.stdout.readline().decode().strip(), flush=True)
child.wait()
"""


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, not yet reaped by its new parent) is not alive."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_the_child_dies_the_moment_its_supervisor_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 2.0  # the kernel signals at the parent's exit; ms here
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not alive(child), "the child outlived its supervisor"
    finally:
        # The child too, whatever happened; when the fix works and init has reaped the child,
        # the group is empty and there is nothing to kill.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)


def test_a_child_whose_supervisor_already_died_exits_at_start() -> None:
    # Its parent is this test, not the pid it was told: what a child sees when the supervisor
    # died between the fork and the prctl call (it was re-parented).
    env = dict(os.environ, **{SUPERVISOR_ENV: str(os.getppid())})
    child = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, timeout=30
    )
    assert child.returncode == ORPHANED_EXIT
    assert child.stdout == b""
    assert b"died before this engine started" in child.stderr


def test_without_the_variable_nothing_is_asked() -> None:
    env = {k: v for k, v in os.environ.items() if k != SUPERVISOR_ENV}
    code = (
        "from engine.runtime.process.supervisor import die_with_supervisor; die_with_supervisor()"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, timeout=30
    )
    assert child.returncode == 0, child.stderr
