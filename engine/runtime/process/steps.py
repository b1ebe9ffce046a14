"""What wraps a protocol step without being part of it: the watchdog guard, the stage timer
and the latency trace's marks. The loop writes `with steps.guard(...)` or `with
steps.stage(...)` around a step, so the step's own lines read as the protocol."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager

from engine.runtime.process.metrics import EngineMetrics
from engine.runtime.process.trace import LatencyTrace
from engine.runtime.process.watchdog import Watchdog


class Steps:
    """Guards, timers and trace marks for the steps of one engine process."""

    def __init__(
        self,
        watchdog: Watchdog,
        budget_s: float,
        metrics: EngineMetrics,
        trace: LatencyTrace | None,
        partitions: Callable[[], Iterable[int]],
    ) -> None:
        self.watchdog = watchdog
        self.budget_s = budget_s  # the watchdog's bound on any one guarded step
        self.metrics = metrics
        self.trace = trace
        self.partitions = partitions  # the ready tasks, for the watchdog's report

    def guard(
        self, step: str, budget_s: float | None = None, partitions: Iterable[int] | None = None
    ) -> AbstractContextManager[None]:
        """The watchdog's guard: a step that outlives its budget ends the process."""
        where = self.partitions() if partitions is None else partitions
        return self.watchdog.guard(step, budget_s or self.budget_s, where)

    @contextmanager
    def stage(self, name: str, *, observe: Callable[[], bool] = lambda: True) -> Iterator[None]:
        """Times the block into `reconciler_stage_seconds{stage=name}` (when `observe()`)."""
        started = time.monotonic()
        yield
        if observe():
            self.metrics.stage_seconds.labels(stage=name).observe(time.monotonic() - started)

    def mark(self, point: str) -> None:
        """The latency trace's time of `point` (poll, consumed, released, commit)."""
        if self.trace is not None:
            setattr(self.trace, f"{point}_ms", self.trace.now())

    def progress(self) -> None:
        """A loop iteration completed: liveness (`/healthz`) stays up."""
        self.watchdog.progress()
        self.metrics.last_progress.set(self.watchdog.last_progress_wall)

    def renew(self) -> None:
        """A long step made progress (a restore batch): its guard's clock starts again."""
        self.watchdog.renew()
        self.progress()
