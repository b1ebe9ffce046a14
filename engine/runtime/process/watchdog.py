"""The watchdog: every call that can block runs under a named step with a budget.

librdkafka can block past its own timeouts (`send_offsets_to_transaction` waits forever when
the group coordinator goes away: https://github.com/confluentinc/librdkafka/issues/5456).
No call of ours can cut it, so a thread watches
the step the loop is in: when a step outlives its budget it logs the step, the partitions and
every thread's stack, and ends the process with `WATCHDOG_EXIT_CODE`. Exactly-once makes that
safe (COMMIT_PROTOCOL.md, "Deadlines"); the supervisor or the pod restarts the process.

The same object records loop progress, which is what `/healthz` reports.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger("reconciler.watchdog")

WATCHDOG_EXIT_CODE = 75
"""A step outlived its budget (EX_TEMPFAIL): restart and retry, nothing is lost."""

CHECK_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Expired:
    """What the watchdog reports when a step outlives its budget."""

    step: str
    partitions: tuple[int, ...]
    elapsed_s: float
    budget_s: float

    def describe(self) -> str:
        return (
            f"step {self.step} blocked for {self.elapsed_s:.1f}s (budget {self.budget_s:.1f}s) "
            f"on partitions {list(self.partitions)}"
        )


@dataclass
class _Guard:
    step: str
    partitions: tuple[int, ...]
    budget_s: float
    since: float


def thread_stacks() -> str:
    """Every thread's stack, as text for one log record."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"--- thread {names.get(ident, '?')} ({ident}) ---\n{stack}")
    return "\n".join(parts)


def exit_process(expired: Expired) -> None:
    """The production reaction: log, then end at once (no cleanup can be trusted to return)."""
    log.critical(
        "watchdog: %s; exiting with %d so that the process is restarted.\n%s",
        expired.describe(),
        WATCHDOG_EXIT_CODE,
        thread_stacks(),
    )
    logging.shutdown()
    sys.stderr.flush()
    os._exit(WATCHDOG_EXIT_CODE)


class Watchdog:
    """Guards nest (a rebalance callback runs inside `consume`): only the innermost one is
    timed, and an outer guard's clock restarts when an inner one ends (the inner one was
    progress). `clock` and `on_expired` are replaceable so tests drive it without sleeping."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_expired: Callable[[Expired], None] = exit_process,
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._on_expired = on_expired
        self._lock = threading.Lock()
        self._guards: list[_Guard] = []
        self._last_progress = clock()
        self.last_progress_wall = wall()
        self.fired: Expired | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @contextmanager
    def guard(self, step: str, budget_s: float, partitions: Iterable[int] = ()) -> Iterator[None]:
        entry = _Guard(step, tuple(sorted(partitions)), budget_s, self._clock())
        with self._lock:
            self._guards.append(entry)
        try:
            yield
        finally:
            with self._lock:
                self._guards.remove(entry)
                if self._guards:
                    self._guards[-1].since = self._clock()

    def renew(self) -> None:
        """The innermost step made progress (a restore batch): its clock starts again."""
        with self._lock:
            if self._guards:
                self._guards[-1].since = self._clock()

    def progress(self) -> None:
        """One loop iteration completed (poll, fold, commit or an idle poll)."""
        self._last_progress = self._clock()
        self.last_progress_wall = self._wall()

    def since_progress_s(self) -> float:
        return self._clock() - self._last_progress

    def current_step(self) -> str | None:
        with self._lock:
            return self._guards[-1].step if self._guards else None

    def check(self) -> Expired | None:
        """One look: the innermost step, if it outlived its budget (then `on_expired` runs)."""
        with self._lock:
            if not self._guards or self.fired is not None:
                return None
            top = self._guards[-1]
            elapsed = self._clock() - top.since
            if elapsed <= top.budget_s:
                return None
            self.fired = Expired(top.step, top.partitions, elapsed, top.budget_s)
        self._on_expired(self.fired)
        return self.fired

    def start(self, orphan_check: Callable[[], bool] | None = None) -> None:
        """Check every second in a daemon thread; `orphan_check` returning True (the
        supervisor is gone) also ends the process, so no engine outlives its parent."""

        def run() -> None:
            while not self._stop.wait(CHECK_INTERVAL_S):
                self.check()
                if orphan_check is not None and orphan_check():
                    log.critical("the supervising process is gone; exiting")
                    logging.shutdown()
                    os._exit(WATCHDOG_EXIT_CODE)

        self._thread = threading.Thread(target=run, name="watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
