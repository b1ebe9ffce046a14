"""Figures for the runner side: latency the wrapper adds to an SDK append, and the resume round
trip. Starts the engine in a thread on fresh topics of the given broker; prints p50/p99.

    B=$(.venv/bin/python tools/kafka_local.py bootstrap --instance dev)
    .venv/bin/python examples/bench_runner_latency.py --bootstrap $B
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from consumers import ReconcilerClient
from consumers.agents import FencedSQLiteSession, ReconciledSession
from engine.admin.topics import create_topics
from engine.core.events import Binding
from engine.runtime.engine import Engine
from engine.settings import load_settings

BINDING = Binding(backend_id="bench", namespace="bench")


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def report(name: str, samples: list[float]) -> None:
    print(
        f"{name:<44} n={len(samples):<4} p50={pct(samples, 0.5):7.2f} ms "
        f"p99={pct(samples, 0.99):7.2f} ms mean={statistics.mean(samples) * 1000:7.2f} ms"
    )


async def appends(session: Any, n: int) -> list[float]:
    times = []
    for i in range(n):
        item = {"role": "user", "content": f"turn {i}"}
        started = time.perf_counter()
        await session.add_items([item])
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--resumes", type=int, default=50)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    prefix = f"bench-{uuid.uuid4().hex[:6]}."
    settings = load_settings(
        environ={},
        bootstrap_servers=args.bootstrap,
        topic_prefix=prefix,
        partitions=3,
        group_id=f"{prefix}engine",
        state_dir=tmp / "state",
        commit_interval_ms=100,
        metrics_port=0,
    )
    create_topics(settings)
    engine = Engine(settings)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    client = ReconcilerClient(args.bootstrap, runner_id="bench", topic_prefix=prefix)
    try:
        plain = FencedSQLiteSession("plain", tmp / "plain.db")
        wrapped = ReconciledSession(
            FencedSQLiteSession("wrapped", tmp / "wrapped.db"), client, backend_id="bench"
        )
        asyncio.run(appends(wrapped, 20))  # warm-up: connections, metadata
        base = asyncio.run(appends(plain, args.appends))
        with_intents = asyncio.run(appends(wrapped, args.appends))
        report("SQLite add_items alone", base)
        report("ReconciledSession.add_items (intent+append+ack)", with_intents)
        added = [w - statistics.median(base) for w in with_intents]
        report("added by the wrapper (minus median append)", added)

        trips = []
        for i in range(args.resumes + 3):
            sid = f"r-{i}"
            started = time.perf_counter()
            client.resume(
                session_id=sid,
                binding=BINDING,
                checkpoint_id=f"cp-{i}",
                checkpoint_sequence=0,
                pending=None,
                observed_tail=[],
                timeout_s=30,
            )
            if i >= 3:  # the first ones wait for the engine's partition assignment
                trips.append(time.perf_counter() - started)
        report("resume round trip (produce -> final decision)", trips)
    finally:
        client.close()
        engine.stop()
        thread.join(60)


if __name__ == "__main__":
    main()
