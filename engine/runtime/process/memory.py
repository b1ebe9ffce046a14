"""Giving freed memory back to the operating system (glibc), so RSS follows what is live.

Two things keep RSS above the live heap of this process. glibc gives every thread that
allocates an arena of its own (up to eight per core), and librdkafka runs a thread per broker
plus its own: records fetched or produced in one thread and freed in another leave free chunks
spread over many arenas. And glibc returns free memory at the top of an arena only; a page in
the middle stays resident until `malloc_trim` hands it back. So the supervisor starts the engine
with `MALLOC_ARENA_MAX` (unless the environment sets it) and the loop trims now and then.
Elsewhere than glibc both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("reconciler.memory")

ARENA_ENV = "MALLOC_ARENA_MAX"


def tune_gc(gen0_threshold: int) -> None:
    """Python's cyclic collector runs every `gen0_threshold` net allocations (0 keeps 700). The
    loop's garbage is almost all freed by refcount, so a frequent scan finds nothing and costs
    CPU per input; a rarer one bounds the same few cycles."""
    if gen0_threshold > 0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0_threshold, gen1, gen2)


def child_env(env: Mapping[str, str], arena_max: int) -> dict[str, str]:
    """The engine child's environment: `MALLOC_ARENA_MAX` from the settings (0: glibc's own
    default), unless the operator set it in the environment already."""
    out = dict(env)
    if arena_max > 0:
        out.setdefault(ARENA_ENV, str(arena_max))
    return out


def _malloc_trim() -> Callable[[int], Any] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc (musl, macOS): nothing to trim
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    fn: Callable[[int], Any] = trim
    return fn


class Trimmer:
    """Calls `malloc_trim(0)` at most once per `interval_s` (0 disables); a trim of a few
    hundred MB takes ~10-25 ms here, so every 10 s costs well under 1% of the loop."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._trim = _malloc_trim() if interval_s > 0 else None
        self._last = time.monotonic()
        self.trims = 0

    def maybe_trim(self, now: float) -> bool:
        if self._trim is None or now - self._last < self.interval_s:
            return False
        self._last = now
        self._trim(0)
        self.trims += 1
        return True
