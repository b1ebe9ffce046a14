"""Where the engine's resident memory goes (a diagnostic, not a test).

Runs one engine in this process against a broker, feeds it N sessions (the realistic mix of
`tools/bench_fold.py`) and then M malformed records, and prints after each phase: RSS, the
Python heap (pymalloc arenas from `sys._debugmallocstats`), glibc malloc (`mallinfo2`: in use,
free but held), the read cache's estimated bytes, records waiting in the event-time buffers,
and the largest Python object types. RSS minus Python heap minus malloc is mostly librdkafka's
and SQLite's mmaps plus the interpreter's code.

    .venv/bin/python -m tools.mem_profile --bootstrap-servers HOST:PORT --sessions 200000
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import random
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Producer

from engine.runtime.engine import Engine
from engine.runtime.process.metrics import EngineMetrics
from engine.settings import Settings
from tools.bench_fold import build_log
from tools.bench_kafka import encode_inputs, fresh_settings, produce_inputs

MB = 2**20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def smaps_mb() -> dict[str, float]:
    """RSS by kind of mapping: the main malloc heap (brk), maps starting on a 64 MB boundary
    (glibc's per-thread arenas: librdkafka's threads), other anonymous maps (pymalloc arenas,
    large allocations), and files (code, SQLite if mapped)."""
    kinds: dict[str, float] = {}
    name, start = "", 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            start = int(head[0].split("-")[0], 16)
            name = head[5] if len(head) > 5 else ""
        elif head and head[0] == "Rss:":
            if name == "[heap]":
                kind = "heap"
            elif name.startswith("/"):
                kind = "files"
            elif name:
                kind = "other"
            elif start % (64 * MB) == 0:
                kind = "thread arenas"
            else:
                kind = "anon"
            kinds[kind] = kinds.get(kind, 0.0) + int(head[1]) / 1024
    return kinds


def malloc_mb() -> tuple[float, float, float]:
    """glibc: bytes in use (arenas), free but held by the arenas, and in mmapped chunks."""
    libc = _libc()
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return info.uordblks / MB, info.fordblks / MB, info.hblkhd / MB


def pymalloc_mb() -> tuple[float, float]:
    """pymalloc: arenas allocated (RSS it holds) and bytes in used blocks."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    arenas = re.search(r"# arenas allocated current\s*=\s*([\d,]+)", text)
    arena_size = re.search(r"(\d+) arenas \* (\d+) bytes/arena", text)
    used = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    size = int(arena_size.group(2)) if arena_size else 1 << 20
    count = int(arenas.group(1).replace(",", "")) if arenas else 0
    in_use = int(used.group(1).replace(",", "")) if used else 0
    return count * size / MB, in_use / MB


def report(label: str, engine: Engine) -> None:
    gc.collect()
    held, used = pymalloc_mb()
    in_use, free, mapped = malloc_mb()
    cache = sum(task.read_cache_used for task in engine.tasks.values()) / MB
    types = Counter(type(o).__name__ for o in gc.get_objects())
    print(
        f"{label}: RSS {rss_mb():.0f} MB | pymalloc arenas {held:.0f} MB ({used:.0f} used) | "
        f"malloc in use {in_use:.0f} MB, free held {free:.0f} MB, mmapped {mapped:.0f} MB | "
        f"read cache (estimated) {cache:.0f} MB | buffered inputs {len(engine.order)}",
        flush=True,
    )
    print("  RSS by mapping:", ", ".join(f"{k} {v:.0f} MB" for k, v in sorted(smaps_mb().items())))
    print("  top gc-tracked types:", ", ".join(f"{n} {c}" for n, c in types.most_common(6)))


def wait_idle(engine: Engine, settings: Settings, idle_s: float = 5.0) -> None:
    """Until the engine folded nothing new for `idle_s`."""
    last, since = -1.0, time.monotonic()
    while time.monotonic() - since < idle_s:
        folded = sum(
            sample.value
            for metric in engine.metrics.events.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        ) + sum(
            sample.value
            for metric in engine.metrics.dead_letters.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        )
        if folded != last:
            last, since = folded, time.monotonic()
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--sessions", type=int, default=200_000)
    parser.add_argument("--malformed", type=int, default=100_000)
    parser.add_argument("--read-cache-mb", type=int, default=64)
    args = parser.parse_args()
    base = fresh_settings(args.bootstrap_servers, partitions=3, commit_ms=200)
    settings = base.model_copy(update={"metrics_port": 0, "read_cache_mb": args.read_cache_mb})
    engine = Engine(settings, metrics=EngineMetrics())
    thread = threading.Thread(target=engine.run, name="engine", daemon=True)
    thread.start()
    while not engine.metrics.is_ready:
        time.sleep(0.2)
    report("ready", engine)
    produce_inputs(settings, encode_inputs(build_log(args.sessions)))
    wait_idle(engine, settings)
    report(f"{args.sessions} sessions", engine)
    rng = random.Random(5)
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    for _ in range(args.malformed):
        while True:
            try:
                producer.produce(
                    settings.topics.intents,
                    key=f"bad-{rng.random()}".encode(),
                    value=rng.randbytes(rng.randint(200, 4_000)),
                )
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)
    wait_idle(engine, settings)
    report(f"+{args.malformed} malformed", engine)
    engine.stop()
    thread.join(60)


if __name__ == "__main__":
    main()
