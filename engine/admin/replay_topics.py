"""The replay steps of a partition range, read from the topics (`reconciler replay --verify`).

The decisions partition, read from its first offset to its end (read_committed), gives the
order the engine folded in: consecutive decisions with one `source` header are one step. Each
input a `topic/partition/offset` source names is then read from its input topic and decoded
exactly as the engine does (`runtime.ingest.Ingest`). The fold starts from empty states, so the
range is always whole partitions from their first offset: every session's history must still be
in the decisions and input topics (their retention). A partition whose first records were
deleted (low watermark above 0) is refused before anything is folded, since folding what is
left from empty states would report differences that are only the missing head.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from engine.admin.brokers import DEFAULT_TIMEOUT_S, quiet_config, require_topics
from engine.admin.explain import READ_TIMEOUT_S, read_partition
from engine.admin.replay import ReplayLogError, ReplaySourceError, Step, parse_watermark
from engine.core.events import Decision
from engine.errors import KafkaUnavailableError
from engine.runtime.intake.ingest import Ingest, Rejected
from engine.settings import Settings
from engine.wire import Codec, DecodeError, RecordType

SOURCE_HEADER = "source"


def partitions_to_replay(
    settings: Settings, wanted: Sequence[int], timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[list[int], int]:
    """The partitions to replay, ``wanted`` (checked) or every partition of the decisions, and
    the topics' partition count; `EngineError` within ``timeout_s`` when the brokers do not
    answer or the topics are missing."""
    topics = settings.topics
    counts = require_topics(settings, [topics.decisions, *topics.inputs], timeout_s)
    count = counts[topics.decisions]
    bad = [p for p in wanted if not 0 <= p < count]
    if bad:
        raise ReplayLogError(
            f"partition(s) {', '.join(map(str, bad))} do not exist: {topics.decisions} has "
            f"{count}.",
            f"pass --partition between 0 and {count - 1}.",
        )
    return (sorted(set(wanted)) if wanted else list(range(count))), count


def replay_steps(
    settings: Settings, partition: int, partition_count: int, read_timeout_s: float = READ_TIMEOUT_S
) -> Iterator[Step]:
    """The steps of one partition, in the engine's fold order. ``read_timeout_s`` bounds the
    wait for the next record of a read (an idle deadline), not a whole read."""
    codec = Codec()
    require_whole_history(settings, partition, read_timeout_s)
    groups = _decision_groups(settings, codec, partition, read_timeout_s)
    wanted: dict[str, set[int]] = {}
    for source, _ in groups:
        if parse_watermark(source) is None:
            topic, offset = _input_position(source, partition)
            wanted.setdefault(topic, set()).add(offset)
    inputs: dict[tuple[str, int], Message] = {}
    for topic, offsets in wanted.items():
        if topic not in settings.topics.inputs:
            raise ReplaySourceError(
                f"a decision names {topic!r} as its source, not one of the input topics.",
                "check --topic-prefix: it must be the engine's.",
            )
        for message in read_partition(settings, topic, partition, read_timeout_s, idle=True):
            offset = message.offset() or 0
            if offset in offsets:
                inputs[topic, offset] = message
    ingest = Ingest(codec, settings.topics, partition_count)
    for source, decisions in groups:
        watermark = parse_watermark(source)
        session_id = decisions[0].session_id
        if watermark is not None:
            yield Step(source, session_id, decisions, watermark_ms=watermark)
            continue
        topic, offset = _input_position(source, partition)
        found = inputs.get((topic, offset))
        if found is None:
            raise ReplaySourceError(
                f"input {source} (session {session_id}) is no longer in {topic}.",
                "the topic's retention dropped it: replay only topics that keep every input.",
            )
        event = ingest.accept(found, topic, partition, offset)
        if isinstance(event, Rejected):
            raise ReplaySourceError(
                f"input {source} was answered by the engine but does not decode now "
                f"({event.reason}).",
                "replay with the engine version that wrote the decisions, or check the topic.",
            )
        yield Step(source, session_id, decisions, event=event, position=offset)


def require_whole_history(settings: Settings, partition: int, timeout_s: float) -> None:
    """`ReplayLogError` when the decisions or an input partition no longer starts at offset 0."""
    topics = settings.topics
    consumer = Consumer(quiet_config(settings, **{"group.id": "reconciler-replay-offsets"}))
    try:
        for topic in (topics.decisions, *topics.inputs):
            try:
                low, _ = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout_s
                )
            except KafkaException as exc:
                raise KafkaUnavailableError(
                    f"the first offset of {topic}[{partition}] is unknown: {exc}.",
                    "check that the brokers are healthy, then run the command again.",
                ) from exc
            if low > 0:
                raise ReplayLogError(
                    f"{topic}[{partition}]: history truncated at offset {low} (retention "
                    "deleted the records before it); a replay folds from offset 0 and cannot "
                    "verify this partition.",
                    "verify only partitions whose topics keep every record (retention.ms=-1 "
                    "on the decisions and input topics), or verify a corpus file (--inputs).",
                )
    finally:
        consumer.close()


def _decision_groups(
    settings: Settings, codec: Codec, partition: int, read_timeout_s: float
) -> list[tuple[str, list[Decision]]]:
    """Consecutive decisions of one source (and, for a sweep, of one session)."""
    groups: list[tuple[str, list[Decision]]] = []
    topic = settings.topics.decisions
    for message in read_partition(settings, topic, partition, read_timeout_s, idle=True):
        where = f"{topic}/{partition}/{message.offset()}"
        headers = dict(message.headers() or [])
        raw = headers.get(SOURCE_HEADER)
        if raw is None:
            raise ReplaySourceError(
                f"decision at {where} carries no {SOURCE_HEADER!r} header.",
                "replay only decisions written by an engine that sets it (SPEC.md §6).",
            )
        try:
            decision = codec.decode(RecordType.DECISION, message.value() or b"")
        except DecodeError as exc:
            raise ReplaySourceError(
                f"decision at {where} does not decode: {exc}.", "check the topic prefix."
            ) from exc
        source = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
        last = groups[-1] if groups else None
        if last is not None and last[0] == source and last[1][0].session_id == decision.session_id:
            last[1].append(decision)
        else:
            groups.append((source, [decision]))
    return groups


def _input_position(source: str, partition: int) -> tuple[str, int]:
    topic, _, rest = source.rpartition("/")
    topic, _, part = topic.rpartition("/")
    try:
        offset, at = int(rest), int(part)
    except ValueError:
        raise ReplaySourceError(
            f"source header {source!r} is not topic/partition/offset.",
            "replay only decisions written by this engine.",
        ) from None
    if at != partition:
        raise ReplaySourceError(
            f"a decision in partition {partition} names input {source} of partition {at}.",
            "the topics are not co-partitioned: run `reconciler topics verify`.",
        )
    return topic, offset
