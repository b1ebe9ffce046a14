"""The compiled runtime modules (engine.runtime.intake.ingest and ordering after `make setup`)
do what their sources do: the same release order and flow for any program of buffer operations, the
same events and byte-identical dead letters for intact, damaged and misplaced records."""

from __future__ import annotations

import random
from pathlib import Path
from types import ModuleType
from typing import Any

from confluent_kafka import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.runtime.intake.ingest as running_ingest
import engine.runtime.intake.ordering as running_ordering
from engine import compiled
from engine.settings import load_settings
from engine.wire import Codec, DecodeError, RecordType
from engine.wire.partitioner import partition_for

PURE = compiled.load_pure("engine.runtime.intake.ingest", "engine.runtime.intake.ordering")
TOPICS = load_settings(environ={}, bootstrap_servers="127.0.0.1:1").topics
INPUTS = ("intents", "acks", "resumes")
PARTITIONS = 6
CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "wire"

# one operation of a program: (what, topic index, partition, a number, a flag)
Op = tuple[str, int, int, int, bool]
OPS = st.tuples(
    st.sampled_from(
        ["push", "push", "push", "refetch", "end", "ready", "put_back", "flow", "drop"]
    ),
    st.integers(0, 2),
    st.integers(0, 2),
    st.integers(-1, 60),
    st.booleans(),
)


def _run_order(module: ModuleType, program: list[Op]) -> list[Any]:
    ended: set[tuple[str, int]] = set()
    order = module.InputOrder(INPUTS, 0.05, 4, lambda t, p, _after: (t, p) in ended)
    next_offset: dict[tuple[str, int], int] = {}
    now, seen = 0.0, list[Any]()
    for what, t, p, number, flag in program:
        topic = INPUTS[t]
        now += 0.03 if flag else 0.0
        if what in ("push", "refetch"):
            offset = next_offset.get((topic, p), 0)
            offset = max(0, offset - 1) if what == "refetch" else offset
            next_offset[(topic, p)] = offset + 1
            record = module.Buffered(topic, p, offset, number, (topic, p, offset))
            seen.append(("push", order.push(record)))
        elif what == "end":
            ended.add((topic, p))
            order.at_end(topic, p)
        elif what in ("ready", "put_back"):
            out = order.ready(now, flag, None if number < 0 else number % 5 + 1)
            seen.append(("ready", [r.item for r in out], order.waited))
            if what == "put_back" and out:
                order.put_back(out[len(out) // 2 :])
        elif what == "flow":
            flow = order.flow()
            seen.append(("flow", flow.pause, flow.resume))
        else:
            seen.append(("drop", order.drop({p})))
            ended = {e for e in ended if e[1] != p}
        seen.append(len(order))
    return seen


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(OPS, max_size=80))
def test_the_order_buffer_releases_what_its_sources_release(program: list[Op]) -> None:
    pure = PURE["engine.runtime.intake.ordering"]
    assert _run_order(running_ordering, program) == _run_order(pure, program)


def _values() -> list[bytes]:
    """The wire corpus, and each file damaged: a byte flipped, cut short, one byte longer."""
    intact = [path.read_bytes() for path in sorted(CORPUS.rglob("*.avro"))]
    draw = random.Random(5)
    damaged = []
    for value in intact:
        flipped = bytearray(value)
        flipped[draw.randrange(len(flipped))] ^= 1 + draw.randrange(255)
        damaged += [bytes(flipped), value[:-1], value + b"\x00"]
    return intact + damaged + [b"", b"\x00", b"junk"]


CODEC = Codec()


def _accept(module: ModuleType, topic: str, key: bytes | None, partition: int, value: bytes) -> Any:
    ingest = module.Ingest(CODEC, TOPICS, PARTITIONS)
    message = Message(topic=topic, partition=partition, offset=9, key=key, value=value)
    got = ingest.accept(message, topic, partition, 9)
    if type(got).__name__ == "Rejected":
        return ("dead letter", got.reason, got.payload)
    return ("event", got)


def _session_key(value: bytes) -> bytes | None:
    """The key a producer would give this record: its session id, if it decodes at all."""
    for kind in (RecordType.INTENT, RecordType.ACK, RecordType.RESUME, RecordType.REPAIR):
        try:
            session_id = getattr(CODEC.decode(kind, value), "session_id", None)
        except DecodeError:
            continue
        if isinstance(session_id, str):
            return session_id.encode()
    return None


def test_ingest_gives_what_its_sources_give() -> None:
    pure = PURE["engine.runtime.intake.ingest"]
    cases, events = 0, 0
    for value in _values():
        keys = [None, b"s-other", _session_key(value)]
        for topic in TOPICS.inputs:
            for key in keys:
                for partition in {0, 1, partition_for(key or b"", PARTITIONS)}:
                    running = _accept(running_ingest, topic, key, partition, value)
                    assert running == _accept(pure, topic, key, partition, value)
                    cases += 1
                    events += running[0] == "event"
    assert cases > 1_000
    assert events > 10  # records that pass (16 here), not only dead letters
