"""CPU per input of the engine's whole loop without Kafka: consume, decode, order, fold, encode,
commit and persist, over the in-memory clients of the fault tests (not a test).

Run from the repository root: ``.venv/bin/python -m tools.bench_loop [--sessions 20000]``.
The input is tools/bench_fold.py's mix (the throughput bench's), appended to an in-memory broker
of `--partitions` partitions; one `Engine` runs until every input is committed. It prints the
engine's CPU per input (the process's CPU while `Engine.run` runs: no librdkafka, so this is the
Python side of the engine alone), decisions per input, the inputs answered more than once and
the records the order buffer released by its bounded wait (`InputOrder.waited`: released before
every input of their task had a record buffered, so an ack may be folded ahead of its intent);
`--profile N` prints the N largest cProfile entries by own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from engine.core.events import Decision
from engine.runtime.clients import ProducerLike
from engine.runtime.engine import Engine
from engine.runtime.process.collector import Collector
from engine.settings import Settings, load_settings
from engine.wire import Codec, RecordType
from tests.unit.runtime.fakes import FakeBroker, FakeClients, FakeProducer, Record
from tools.bench_fold import build_log

CODEC = Codec()


def _settings(state_dir: Path, partitions: int, commit_max_events: int) -> Settings:
    return load_settings(
        environ={},
        partitions=partitions,
        state_dir=state_dir,
        metrics_port=0,
        commit_max_events=commit_max_events,
    )


def _broker(settings: Settings, sessions: int, partitions: int) -> tuple[FakeBroker, int]:
    broker = FakeBroker(partitions)
    log = build_log(sessions, distinct=True)
    for event in log:
        topic = settings.topics.topic_for(event)
        broker.append(topic, event.session_id.encode(), CODEC.encode(event))
    return broker, len(log)


class _Producer(FakeProducer):
    """The fault tests' producer without what the bench would time instead of the engine:
    no pure-Python murmur2 per record (every record of a topic goes to partition 0 unless the
    engine names one) and no size check."""

    def produce(
        self,
        topic: str,
        *,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: Any = None,
        headers: Any = None,
    ) -> None:
        record = Record(key, value or b"", headers or [])
        self.queued.append((topic, max(partition, 0), record, on_delivery))


class _Clients(FakeClients):
    def producer(self, settings: Settings) -> ProducerLike:
        return _Producer(self.broker)


def _done(broker: FakeBroker, settings: Settings) -> bool:
    return all(
        broker.offsets.get((t, p), 0) == len(broker.log(t, p))
        for t in settings.topics.inputs
        for p in range(broker.partitions)
    )


def run_once(
    sessions: int, partitions: int, commit_max_events: int, batch: int, profile: int
) -> tuple[float, int, FakeBroker, Settings, str, int]:
    """One engine over the whole input: (CPU seconds in `Engine.run`, inputs, broker,
    settings, the profile's text or "", records released by the order buffer's bounded
    wait)."""
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        settings = _settings(Path(tmp) / "state", partitions, commit_max_events)
        broker, inputs = _broker(settings, sessions, partitions)
        clients = _Clients(broker, batch=batch)
        # The process's collector policy and gen-0 threshold, as `reconciler run` sets them.
        engine = Engine(settings, clients=clients, collector=Collector())
        engine.tune_gc()

        def on_idle() -> None:
            txn = engine.transactions
            if _done(broker, settings) and (txn is None or not txn.open):
                engine.stop()

        clients.on_idle = on_idle
        profiler = cProfile.Profile(time.process_time) if profile else None
        started = time.process_time()
        if profiler is not None:
            profiler.enable()
        engine.run()
        if profiler is not None:
            profiler.disable()
        cpu = time.process_time() - started
        text = ""
        if profiler is not None:
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("tottime").print_stats(profile)
            stats.sort_stats("cumulative").print_stats(profile)
            text = out.getvalue()
        assert _done(broker, settings), "the engine stopped before every input was committed"
        return cpu, inputs, broker, settings, text, engine.order.waited


def answered_twice(
    broker: FakeBroker, settings: Settings
) -> tuple[int, Counter[str], Counter[str]]:
    """Decisions committed; the inputs that got more than one (by the event they answer:
    its kind, then each decision's verdict/reason/final); and the records whose fold
    produced more than one decision (by the answered events' kinds)."""
    by_event: dict[str, list[Decision]] = {}
    by_source: dict[str, list[Decision]] = {}
    total = 0
    for p in range(broker.partitions):
        for record in broker.log(settings.topics.decisions, p):
            decision = CODEC.decode(RecordType.DECISION, record.value)
            assert isinstance(decision, Decision)
            source = dict(record.headers)["source"].decode()
            by_event.setdefault(decision.in_reply_to, []).append(decision)
            by_source.setdefault(source, []).append(decision)
            total += 1
    twice: Counter[str] = Counter()
    for event_id, decisions in by_event.items():
        if len(decisions) > 1:
            answers = " then ".join(
                f"{d.verdict}/{d.reason}{'' if d.final else ' (deferred)'}" for d in decisions
            )
            twice[f"{_kind(event_id)}: {answers}"] += 1
    shared: Counter[str] = Counter()
    for source, decisions in by_source.items():
        if len(decisions) > 1:
            kinds = " + ".join(_kind(d.in_reply_to) for d in decisions)
            shared[f"{source.split('/')[0].rpartition('.')[2]} record: {kinds}"] += 1
    return total, twice, shared


def _kind(event_id: str) -> str:
    """The bench mix's event ids end in /i, /a, /r0, /r1."""
    return {"i": "intent", "a": "ack", "r": "resume"}.get(event_id.rpartition("/")[2][:1], "?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--commit-max-events", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=1_000, help="records per consume()")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0, help="print the N largest entries")
    args = parser.parse_args()
    if args.sessions < 1 or args.partitions < 1 or args.runs < 1 or args.batch < 1:
        parser.error("--sessions, --partitions, --runs and --batch must be at least 1")
    figures = []
    for _ in range(args.runs):
        cpu, inputs, broker, settings, text, waited = run_once(
            args.sessions, args.partitions, args.commit_max_events, args.batch, args.profile
        )
        figures.append(cpu * 1e6 / inputs)
        print(f"{inputs} inputs, {cpu:.2f} s CPU: {cpu * 1e6 / inputs:.1f} us per input")
        if text:
            print(text)
    decisions, twice, shared = answered_twice(broker, settings)
    print(f"median {sorted(figures)[len(figures) // 2]:.1f} us per input over {args.runs} runs")
    print(f"decisions per input {decisions / inputs:.4f} ({decisions} / {inputs})")
    print(f"  {waited} records released by the order buffer's bounded wait (last run)")
    for what, count in twice.most_common():
        print(f"  {count} inputs answered more than once: {what}")
    for what, count in shared.most_common():
        print(f"  {count} folds with more than one decision: {what}")


if __name__ == "__main__":
    main()
