"""Per-input CPU cost of the engine's input side, without Kafka (not a test).

``.venv/bin/python -m tools.bench_ingest [--sessions 20000] [--repeat 5]``

The input side is what the loop does with a consumed batch before the fold's answer:
`Intake.take` per record (accessors, `Ingest.accept` with the codec's decode and the placement
check, the order buffer's push), `InputOrder.ready`, `Intake.prefetch`, and `FoldStep.handle` up to
`task.fold`. Here the records are real `confluent_kafka.Message` objects carrying the mix of
tools/bench_fold.py, keyed and placed as the murmur2 partitioner places them, consumed in
batches as `Intake.consume` hands them over (partition by partition, topic by topic); the fold, the
store and the transaction are stubs that answer nothing, so what is timed is the input side
alone. It prints CPU microseconds per input by stage, and the codec's decode alone
(inside `take`).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Message

from engine.core.events import Event
from engine.runtime.engine import Engine
from engine.runtime.fold_step import FoldStep
from engine.runtime.intake.intake import CONSUME_BATCH, Intake
from engine.runtime.intake.ordering import Buffered
from engine.runtime.parts import Parts
from engine.runtime.process.memory import tune_gc
from engine.settings import load_settings
from engine.wire import RecordType
from engine.wire.partitioner import partition_for
from tools.bench_fold import build_log
from tools.bench_kafka import encode_inputs

PARTITIONS = 6
STAGES = ("take", "order", "prefetch", "handle")


class _Task:
    """What `prefetch` and `handle` call on a task: nothing is stored, nothing answered."""

    def __init__(self, partition: int) -> None:
        self.partition = partition

    def prefetch(self, ids: list[str]) -> None:
        pass

    def fold(self, event: Event, offset: int, encode: Callable[[Any], bytes]) -> Any:
        return None, (), ()

    def expire_overdue(self, encode: Callable[[Any], bytes]) -> list[Any]:
        return []


class _Txn:
    """The open commit and its producer in one stub: outputs are dropped."""

    open = True
    started = 0.0
    partitions: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.event_times: list[int] = []

    def for_outputs(self) -> _Txn:
        return self

    def produce(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def produce_all(self, *args: Any, **kwargs: Any) -> bool:
        return True


def consumed_batches(
    sessions: int, topics: dict[RecordType, str]
) -> tuple[list[list[Message]], dict[tuple[str, int], int]]:
    """The inputs as librdkafka hands them over: each topic partition's records in offset
    order, a batch of at most CONSUME_BATCH from one partition after another; and the end
    offset of each topic partition."""
    logs: dict[tuple[str, int], list[Message]] = {}
    for record in encode_inputs(build_log(sessions)):
        topic = topics[record.kind]
        partition = partition_for(record.key, PARTITIONS)
        log = logs.setdefault((topic, partition), [])
        message = Message(
            topic=topic,
            partition=partition,
            offset=len(log),
            key=record.key,
            value=record.value,
            timestamp=(1, 1_767_225_600_000),
        )
        log.append(message)
    batches: list[list[Message]] = []
    cursors = {key: 0 for key in logs}
    step = 250  # a fetch's worth of one partition, then the next
    while any(cursors[k] < len(v) for k, v in logs.items()):
        batch: list[Message] = []
        for key, log in logs.items():
            at = cursors[key]
            batch.extend(log[at : at + step])
            cursors[key] = at + step
            if len(batch) >= CONSUME_BATCH:
                break
        batches.append(batch[:CONSUME_BATCH])
        for message in batch[CONSUME_BATCH:]:  # not taken: next batch
            key = (message.topic() or "", message.partition() or 0)
            cursors[key] = min(cursors[key], message.offset() or 0)
    return batches, {key: len(log) for key, log in logs.items()}


def engine_loop(state_dir: Path) -> Parts:
    settings = load_settings(
        environ={}, bootstrap_servers="127.0.0.1:1", partitions=PARTITIONS, state_dir=state_dir
    )
    loop = Engine(settings).parts
    for p in range(PARTITIONS):
        loop.owned.ready(_Task(p))  # type: ignore[arg-type]
        for topic in loop.topics.inputs:
            loop.owned.next[(topic, p)] = 0
    return loop


def run_once(loop: Parts, batches: list[list[Message]]) -> tuple[int, list[float]]:
    """Inputs handled and CPU seconds spent in each stage (take, order, prefetch, handle),
    from a fresh order buffer and offsets."""
    for key in loop.owned.next:
        loop.owned.next[key] = 0
    loop.order.clear()
    txn: Any = _Txn()
    intake, fold_step = Intake(loop, None), FoldStep(loop)  # type: ignore[arg-type]
    handled = 0
    clock = time.process_time
    spent = [0.0] * 4
    for messages in batches:
        t0 = clock()
        intake.take(messages)
        spent[0] += clock() - t0
        while True:
            t1 = clock()
            batch: list[Buffered[Any]] = loop.order.ready(0.0, True, CONSUME_BATCH)
            t2 = clock()
            if not batch:
                spent[1] += t2 - t1
                break
            intake.prefetch(batch)
            t3 = clock()
            for record in batch:
                fold_step.handle(txn, record)
            t4 = clock()
            spent[1] += t2 - t1
            spent[2] += t3 - t2
            spent[3] += t4 - t3
            handled += len(batch)
    return handled, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    loop = engine_loop(Path(tempfile.mkdtemp(prefix="bench-ingest-")))
    topics = loop.topics
    kinds = {RecordType.INTENT: topics.intents, RecordType.ACK: topics.acks}
    kinds[RecordType.RESUME] = topics.resumes
    batches, ends = consumed_batches(args.sessions, kinds)
    tune_gc(loop.settings.gc_gen0_threshold)  # as `reconciler run` does
    gc.collect()
    gc.freeze()  # what the setup built, as the engine's collector freezes after each commit
    loop.order.caught_up = lambda topic, partition, after: after >= ends[(topic, partition)]
    best = [float("inf")] * 4
    handled = 0
    for _ in range(args.repeat):
        handled, spent = run_once(loop, batches)
        best = [min(b, s) for b, s in zip(best, spent, strict=True)]
    inputs = sum(len(b) for b in batches)
    assert handled == inputs, f"{handled} of {inputs} inputs handled"
    decode = loop.codec.decode
    records = [(message.topic(), message.value()) for b in batches for message in b]
    types = {v: k for k, v in kinds.items()}
    codec_s = float("inf")
    for _ in range(args.repeat):
        started = time.process_time()
        for topic, value in records:
            decode(types[topic or ""], value or b"")
        codec_s = min(codec_s, time.process_time() - started)
    us = [b / inputs * 1e6 for b in best]
    stages = ", ".join(f"{name} {u:.2f}" for name, u in zip(STAGES, us, strict=True))
    print(
        f"{inputs:,} inputs, CPU us/input (best of {args.repeat} per stage): input side "
        f"{sum(us):.2f} ({stages}); the codec's decode alone {codec_s / inputs * 1e6:.2f}"
    )


if __name__ == "__main__":
    main()
