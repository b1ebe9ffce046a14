"""The cycle collector, kept off the decision latency.

CPython's cycle collector stops the interpreter while it walks every tracked object of the
generation it collects. The oldest generation holds the read cache's decoded session states:
the structs are untracked (`gc=False`), but the lists inside them are not, so one gen-2
collection walked ~150,000 objects after 64,000 inputs and took 70-200 ms on an idle core and
324-410 ms in a latency run at 1,000 resumes/s (the trace's `.gc.csv`): every input that
arrived meanwhile waited that long, which is the p99.

The engine makes almost no cyclic garbage (99 objects over those 64,000 inputs): what dies is
freed by reference count. So after each commit everything alive is frozen (`gc.freeze`, a list
splice, no walk) and collections look only at what one batch allocated. Objects freed by
reference count leave the frozen set as usual; only cyclic garbage among them would stay, so
the whole heap is collected again once the frozen set has doubled since the last full
collection or since the first count (checked every `check_interval_s`: counting it is a walk)
or every `full_interval_s`, whichever comes first. The count is of objects, not bytes: a cycle
that dies holding a large untracked payload (bytes) keeps it until the next full collection, at
most `full_interval_s`. Collecting what a batch left before each freeze would free such cycles
at once, but it makes the p99 worse (docs/performance-history.md), so the engine's own
measured cyclic garbage decides the trade-off.

The process entry point installs it (`reconciler run`); an engine built in a test does not, so
no test's heap is frozen behind its back.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Protocol

log = logging.getLogger("reconciler.memory")

FULL_INTERVAL_S = 600.0
CHECK_INTERVAL_S = 10.0
MIN_FROZEN = 100_000
"""Below this many frozen objects a full collection is not worth a pause of its own: the
doubling rule starts from here (a heap this small is walked in tens of ms)."""


class GcApi(Protocol):
    """The part of the `gc` module used here (a fake in the unit tests)."""

    def freeze(self) -> None: ...
    def unfreeze(self) -> None: ...
    def get_freeze_count(self) -> int: ...
    def collect(self) -> int: ...


class Collector:
    def __init__(
        self,
        full_interval_s: float = FULL_INTERVAL_S,
        check_interval_s: float = CHECK_INTERVAL_S,
        api: GcApi = gc,
        now: float | None = None,
    ) -> None:
        self.full_interval_s = full_interval_s
        self.check_interval_s = check_interval_s
        self._gc = api
        start = time.monotonic() if now is None else now
        self._checked = start
        self._full_at = start
        self._after_full = 0
        self.full_collections = 0

    def committed(self, now: float) -> bool:
        """After a commit (and its local writes): freeze what is alive; True when this call
        collected the whole heap first."""
        self._gc.freeze()
        if now - self._checked < self.check_interval_s:
            return False
        self._checked = now
        frozen = self._gc.get_freeze_count()
        if not self._after_full:  # the first count: modules, clients, restored state
            self._after_full = frozen
            return False
        due = now - self._full_at >= self.full_interval_s
        if not due and frozen < max(2 * self._after_full, MIN_FROZEN):
            return False
        started = time.monotonic()
        self._gc.unfreeze()
        found = self._gc.collect()
        self._gc.freeze()
        self._after_full = self._gc.get_freeze_count()
        self._full_at = now
        self.full_collections += 1
        log.info(
            "full garbage collection: %d objects alive, %d cyclic garbage, %.0f ms",
            self._after_full,
            found,
            (time.monotonic() - started) * 1000,
        )
        return True

    def close(self) -> None:
        """Hand every object back to the collector (the process goes on without this)."""
        self._gc.unfreeze()
