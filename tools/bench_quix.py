"""Quix Streams 3.28.1 running the engine's own decode + fold + encode, exactly-once, for
`make bench` to compare against `reconciler run` on the same input and broker.

It runs in the bench-only venv `.venv-quix` (quixstreams pins older pydantic and
confluent-kafka than this project), with this repository on PYTHONPATH:
`PYTHONPATH=. .venv-quix/bin/python -m tools.bench_quix --bootstrap-servers B --topic-prefix P`.
The three input topics are concatenated into one dataframe (Quix lines them up by timestamp and
gives them one state store); a session's state lives in Quix's RocksDB store (changelogged) as
the engine's Avro bytes, with the decoded value cached as the engine caches it. Runs until
SIGTERM.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

from quixstreams import Application
from quixstreams.context import message_context
from quixstreams.state.rocksdb import RocksDBOptions

from engine.core.events import AckEvent, IntentEvent, ResumeEvent
from engine.core.fold import fold
from engine.core.state import SessionState
from engine.settings import load_settings
from engine.wire import Codec, RecordType

CODEC = Codec()


def _dumps(data: str | bytes) -> bytes:
    """State keys ("s") and values (the engine's Avro bytes) go to RocksDB as they are."""
    return data.encode() if isinstance(data, str) else data


def _loads(data: bytes) -> bytes:
    return data


class Folder:
    """The per-record step: decode, fold with the state from the store, encode both."""

    def __init__(self) -> None:
        self.decoded: dict[str, tuple[bytes, SessionState]] = {}

    def __call__(self, value: tuple[RecordType, bytes], state: Any) -> list[bytes]:
        kind, data = value
        event = CODEC.decode(kind, data)
        assert isinstance(event, IntentEvent | AckEvent | ResumeEvent)
        stored: bytes | None = state.get("s")
        current: SessionState | None = None
        if stored is not None:
            cached = self.decoded.get(event.session_id)
            if cached is not None and cached[0] == stored:
                current = cached[1]
            else:
                decoded = CODEC.decode(RecordType.SESSION_STATE, stored)
                assert isinstance(decoded, SessionState)
                current = decoded
        result = fold(current, event, message_context().offset)
        encoded = CODEC.encode(result.state)
        state.set("s", encoded)
        self.decoded[event.session_id] = (encoded, result.state)
        return [CODEC.encode(decision) for decision in result.decisions]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic-prefix", required=True)
    parser.add_argument("--commit-ms", type=int, default=100)
    args = parser.parse_args()
    topics = load_settings(environ={}, topic_prefix=args.topic_prefix).topics
    app = Application(
        broker_address=args.bootstrap_servers,
        consumer_group=f"{args.topic_prefix}quix",
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=args.commit_ms / 1000,
        state_dir=tempfile.mkdtemp(prefix="bench-quix-"),
        rocksdb_options=RocksDBOptions(dumps=_dumps, loads=_loads),
        loglevel="WARNING",
    )
    streams = []
    for name, kind in (
        (topics.intents, RecordType.INTENT),
        (topics.acks, RecordType.ACK),
        (topics.resumes, RecordType.RESUME),
    ):
        topic = app.topic(name, key_deserializer="bytes", value_deserializer="bytes")
        streams.append(app.dataframe(topic).apply(lambda data, kind=kind: (kind, data)))
    merged = streams[0].concat(streams[1]).concat(streams[2])
    answers = merged.apply(Folder(), stateful=True, expand=True)
    answers.to_topic(app.topic(topics.decisions, key_serializer="bytes", value_serializer="bytes"))
    app.run()


if __name__ == "__main__":
    main()
