"""Per-input timestamps through the loop, for finding where a slow decision's time goes.

Off by default (`latency_trace_path`); a diagnostic for `tools/bench_latency.py`, which joins
these lines with the time its own read_committed consumer saw each decision. The per-stage
histograms say which batch was slow; this says, for one slow input, whether it waited for
the loop (a long previous batch), in the order buffer, behind the rest of its batch, or in
produce and commit.

One CSV line per folded input, written when its transaction commits (an aborted one writes
nothing), all times wall clock in ms (the bench compares them with the producer's):
session, topic, created (the record's timestamp), poll (the consume call that returned it
began), consumed, released (its batch began to fold), folded (its own fold ended), ahead (1:
folded while an overlapped commit ran, its outputs held), commit (steps 3-5 began), flushed,
committed.

Beside it, `<path>.gc.csv`: every cyclic garbage collection of the process (start, ms taken,
generation, objects collected), since a pause of the interpreter shows up in the trace only as
a slow step of whatever ran at the time.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any, TextIO

Key = tuple[str, int, int]  # topic, partition, offset
HEADER = "session,topic,created,poll,consumed,released,folded,ahead,commit,flushed,committed\n"
GC_HEADER = "start,ms,generation,collected\n"


class LatencyTrace:
    def __init__(self, path: Path) -> None:
        self._out: TextIO = path.open("a", encoding="utf-8")
        if self._out.tell() == 0:
            self._out.write(HEADER)
        self._arrived: dict[Key, tuple[float, float, float]] = {}
        self._folded: list[str] = []
        # An overlapped commit's lines (`seal`): what is folded ahead while it runs belongs to
        # the next transaction, and must not be stamped with this one's commit.
        self._sealed: list[str] = []
        self._sealed_commit_ms = 0.0
        self._in_flight = False
        self.poll_ms = 0.0
        self.consumed_ms = 0.0
        self.released_ms = 0.0
        self.commit_ms = 0.0
        self._gc_out: TextIO = path.with_name(path.name + ".gc.csv").open("a", encoding="utf-8")
        if self._gc_out.tell() == 0:
            self._gc_out.write(GC_HEADER)
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = self.now()
            return
        took = self.now() - self._gc_started
        self._gc_out.write(
            f"{self._gc_started:.1f},{took:.2f},{info['generation']},{info['collected']}\n"
        )

    @staticmethod
    def now() -> float:
        return time.time() * 1000

    def arrived(self, key: Key, created_ms: float) -> None:
        self._arrived[key] = (created_ms, self.poll_ms, self.consumed_ms)

    def folded(self, key: Key, session: str) -> None:
        created, poll, consumed = self._arrived.pop(key, (0.0, 0.0, 0.0))
        self._folded.append(
            f"{session},{key[0]},{created:.1f},{poll:.1f},{consumed:.1f},"
            f"{self.released_ms:.1f},{self.now():.1f},{int(self._in_flight)}"
        )

    def seal(self) -> None:
        """Steps 4-5 of the open transaction go to the worker (overlap): its lines so far are
        the ones `committed(sealed=True)` writes."""
        self._sealed, self._folded = self._folded, []
        self._sealed_commit_ms = self.commit_ms
        self._in_flight = True

    def committed(
        self, flushed_ms: float, committed_ms: float | None = None, *, sealed: bool = False
    ) -> None:
        """A transaction committed (at `committed_ms`, default now); `flushed_ms`: when its
        flush returned. `sealed`: the overlapped one, else the open one."""
        done = self.now() if committed_ms is None else committed_ms
        lines = self._sealed if sealed else self._folded
        began = self._sealed_commit_ms if sealed else self.commit_ms
        tail = f",{began:.1f},{flushed_ms:.1f},{done:.1f}\n"
        self._out.writelines(line + tail for line in lines)
        self._out.flush()
        self._gc_out.flush()
        lines.clear()
        if sealed:
            self._in_flight = False

    def aborted(self) -> None:
        self._folded.clear()
        self._sealed.clear()
        self._in_flight = False
        self._arrived.clear()

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._out.close()
        self._gc_out.close()
