"""`reconciler run` is a small parent that restarts the engine child whenever it dies.

Crash-only recovery: the engine exits on anything it cannot handle in place (the watchdog's
exit 75, a crash, kill -9) and the next process resumes from what Kafka and its local store hold
(COMMIT_PROTOCOL.md). In Kubernetes the pod would restart too, but slower and with a rebalance;
locally nothing else would. The child learns how many restarts came before it from
`RECONCILER_ENGINE_RESTARTS` (exported as `reconciler_engine_restarts_total`) and dies with
this parent: on Linux the kernel kills it the moment the parent dies (`die_with_supervisor`);
elsewhere the watchdog polls for the parent (`RECONCILER_SUPERVISOR_PID`, `parent_gone`). A
child that outlived its parent would keep the metrics port and the instance id, so a
`reconciler run` started again at once would fail its first child on the port and fence with
the orphan until the poll ended it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import FrameType

log = logging.getLogger("reconciler.supervisor")

RESTARTS_ENV = "RECONCILER_ENGINE_RESTARTS"
SUPERVISOR_ENV = "RECONCILER_SUPERVISOR_PID"
CONFIG_ERROR_EXIT = 2  # bad settings: a restart would fail the same way
HEALTHY_AFTER_S = 60.0  # a child that ran this long resets the backoff
ORPHANED_EXIT = 75  # EX_TEMPFAIL, as the watchdog's exit when it finds the parent gone
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    max_s: float = 30.0

    def delay(self, quick_failures: int) -> float:
        """Doubles with every consecutive failure of a child that did not run long."""
        if quick_failures <= 0:
            return 0.0
        return float(min(self.max_s, self.initial_s * 2 ** (quick_failures - 1)))


def supervise(
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    backoff: Backoff | None = None,
) -> int:
    """Run `command` until it exits 0 (a drained stop) or 2 (bad settings), or until this
    process gets SIGTERM/SIGINT, which is forwarded; returns the last child's exit status."""
    return supervise_all([command], env, backoff)


def supervise_all(
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str] | None = None,
    backoff: Backoff | None = None,
) -> int:
    """`supervise` for several children at once (`reconciler run --processes N`): each is
    restarted on its own, SIGTERM/SIGINT go to all; returns the first nonzero final status,
    else 0. One thread per child waits on it, so a restart never waits on a sibling."""
    backoff = backoff or Backoff()
    stopping = threading.Event()
    children: dict[int, subprocess.Popen[bytes]] = {}
    codes: dict[int, int] = {}

    def forward(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        for child in list(children.values()):
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}

    def run(index: int, command: Sequence[str]) -> None:
        codes[index] = _keep_running(command, env, backoff, stopping, children, index)

    threads = [
        threading.Thread(target=run, args=(i, c), name=f"supervise-{i}", daemon=True)
        for i, c in enumerate(commands)
    ]
    try:
        if len(commands) == 1:  # in this thread, so the child shows in /proc/<pid>/children
            run(0, commands[0])
            threads = []
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # a timed join lets the main thread run signal handlers
                thread.join(0.2)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return next((code for _, code in sorted(codes.items()) if code != 0), 0)


def _keep_running(
    command: Sequence[str],
    env: Mapping[str, str] | None,
    backoff: Backoff,
    stopping: threading.Event,
    children: dict[int, subprocess.Popen[bytes]],
    index: int,
) -> int:
    restarts = quick_failures = 0
    while True:
        child_env = dict(os.environ if env is None else env)
        child_env[RESTARTS_ENV] = str(restarts)
        child_env[SUPERVISOR_ENV] = str(os.getpid())
        started = time.monotonic()
        if stopping.is_set():  # a signal came during the backoff: start nothing new
            return 0
        child = children[index] = subprocess.Popen(list(command), env=child_env)
        if stopping.is_set():  # the signal came while it started: forward() missed it
            child.terminate()
        log.info("engine pid %d started (restarts so far: %d)", child.pid, restarts)
        code = child.wait()
        lived = time.monotonic() - started
        if stopping.is_set() or code in (0, CONFIG_ERROR_EXIT):
            log.info("engine pid %d exited with %d; supervisor done", child.pid, code)
            return code
        quick_failures = 1 if lived >= HEALTHY_AFTER_S else quick_failures + 1
        restarts += 1
        delay = backoff.delay(quick_failures)
        log.error(
            "engine pid %d exited with %d after %.1fs; restart #%d in %.1fs",
            child.pid,
            code,
            lived,
            restarts,
            delay,
        )
        if stopping.wait(delay):
            return code


def die_with_supervisor() -> None:
    """In the child, first thing: have Linux SIGKILL this process the moment the supervisor
    that started it dies. SIGKILL, not SIGTERM: a drain would keep the metrics port and the
    instance id while a new supervisor starts, and crash-only recovery makes a kill safe.

    A parent that died before the prctl call sends nothing, so the parent is checked after it:
    re-parented already means orphaned, and the process exits at once. Without the variable
    (not started by `reconciler run`) nothing is done; off Linux, or if prctl fails, the
    watchdog's poll of `parent_gone` is what ends an orphan."""
    expected = os.environ.get(SUPERVISOR_ENV)
    if expected is None:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
        prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        prctl.restype = ctypes.c_int
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            log.warning(
                "prctl(PR_SET_PDEATHSIG) failed (%s); an orphaned engine ends at the "
                "watchdog's next check instead",
                os.strerror(errno),
            )
    if parent_gone():
        log.critical(
            "the supervising process %s died before this engine started; exiting", expected
        )
        logging.shutdown()
        os._exit(ORPHANED_EXIT)


def parent_gone() -> bool:
    """In the child: True once the supervisor that started it has died (we were re-parented)."""
    expected = os.environ.get(SUPERVISOR_ENV)
    return expected is not None and os.getppid() != int(expected)


def restarts_before() -> int:
    try:
        return max(0, int(os.environ.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0
