"""Event-time order across the input topics of a partition (ordering.py), and the engine
folding a backlog in that order so resumes and acks are not parked behind unread intents."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Message

from engine.core.events import Decision, Reason
from engine.runtime.clients import ConsumerLike
from engine.runtime.engine import Engine
from engine.runtime.intake.ordering import FIRST, Buffered, InputOrder
from engine.settings import Settings, load_settings
from engine.wire import RecordType
from tests.integration.engine_harness import CODEC
from tests.unit.runtime.fakes import FakeBroker, FakeClients, FakeConsumer, Faults
from tools.bench_fold import build_log

INPUTS = ("intents", "acks", "resumes")


def _order(wait_s: float = 1.0, max_buffered: int = 4) -> InputOrder[str]:
    return InputOrder(INPUTS, wait_s, max_buffered)


def _push(order: InputOrder[str], topic: str, offset: int, at: int, partition: int = 0) -> bool:
    return order.push(Buffered(topic, partition, offset, at, f"{topic}@{at}"))


def _items(records: list[Buffered[str]]) -> list[str]:
    return [r.item for r in records]


def test_the_earliest_head_goes_first_once_every_input_has_a_record() -> None:
    order = _order()
    _push(order, "resumes", 0, 30)
    _push(order, "acks", 0, 20)
    assert order.ready(0.0, drained=False) == []  # intents may still hold an earlier record
    _push(order, "intents", 0, 10)
    _push(order, "intents", 1, 40)
    # acks is empty again and not at its end: resumes@30 waits for a possibly earlier ack
    assert _items(order.ready(0.0, drained=False)) == ["intents@10", "acks@20"]
    order.at_end("acks", 0)
    assert _items(order.ready(0.0, drained=False)) == ["resumes@30"]
    assert len(order) == 1  # intents@40 waits for the resumes after it


def test_an_input_at_its_end_is_not_waited_for() -> None:
    order = _order()
    _push(order, "resumes", 0, 30)
    _push(order, "intents", 0, 10)
    order.at_end("acks", 0)
    order.at_end("intents", 0)
    assert _items(order.ready(0.0, drained=False)) == ["intents@10", "resumes@30"]
    _push(order, "acks", 0, 50)  # a new record clears the end: wait for it again
    _push(order, "resumes", 1, 60)
    assert _items(order.ready(0.0, drained=False)) == ["acks@50"]


def test_the_wait_is_bounded_but_runs_only_once_nothing_more_was_fetched() -> None:
    order = _order(wait_s=0.05)
    _push(order, "resumes", 0, 30)
    assert order.ready(0.0, drained=True) == []
    assert order.ready(10.0, drained=False) == [], "a backlog is still being read"
    assert _items(order.ready(10.0, drained=True)) == ["resumes@30"]
    assert order.waited == 1


def test_a_record_without_event_time_goes_first() -> None:
    order = _order()
    for topic in INPUTS:
        _push(order, topic, 0, 10)
    _push(order, "acks", 1, FIRST)
    assert _items(order.ready(0.0, drained=False))[0] == "intents@10"
    # the malformed ack is behind acks@10 in its own topic; it goes first after that
    assert _items(order.ready(0.0, drained=False)) == []


def test_refetched_records_are_buffered_once_and_partitions_stay_apart() -> None:
    order = _order()
    assert _push(order, "intents", 5, 10)
    assert not _push(order, "intents", 5, 10)
    assert not _push(order, "intents", 4, 10)
    _push(order, "acks", 0, 1, partition=1)
    order.at_end("intents", 1)
    order.at_end("resumes", 1)
    assert _items(order.ready(0.0, drained=False)) == ["acks@1"]


def test_the_input_that_is_ahead_is_paused_and_resumed_at_half() -> None:
    order = _order(max_buffered=4)
    for offset in range(4):
        _push(order, "resumes", offset, 100 + offset)
    flow = order.flow()
    assert (flow.pause, flow.resume) == ([("resumes", 0)], [])
    assert order.flow().pause == [], "paused once"
    for topic in ("intents", "acks"):
        _push(order, topic, 0, 101)
        order.at_end(topic, 0)
    assert len(order.ready(0.0, drained=False)) == 6  # the others are at their end
    assert order.flow().resume == [("resumes", 0)]
    _push(order, "resumes", 9, 200)
    assert order.drop([0]) == []
    assert len(order) == 0


def test_drop_hands_back_what_it_paused() -> None:
    order = _order(max_buffered=1)
    _push(order, "intents", 0, 1, partition=2)
    assert order.flow().pause == [("intents", 2)]
    assert order.drop([2]) == [("intents", 2)]
    assert _push(order, "intents", 0, 1, partition=2), "offsets forgotten: read again"


def test_the_engine_folds_a_backlog_in_event_time_order(tmp_path: Path) -> None:
    """The fake consumer hands over the acks topic first (as librdkafka may on a backlog):
    every partition's inputs are still folded in event-time order, so no ack or resume is
    parked waiting for an intent that was already in the log."""
    settings = load_settings(
        environ={},
        partitions=2,
        state_dir=tmp_path / "state",
        metrics_port=0,
        commit_interval_ms=60_000,
        transaction_timeout_ms=65_000,  # the interval + TXN_TIMEOUT_MARGIN_MS
        order_wait_ms=10_000,  # the fake reports every partition's end: no wait runs out
    )
    broker = FakeBroker(2, Faults())
    events = sorted(build_log(40), key=lambda e: e.event_time_ms)
    times: dict[str, int] = {}
    for event in events:
        topic = settings.topics.topic_for(event)
        broker.append(topic, event.session_id.encode(), CODEC.encode(event))
    for topic in settings.topics.inputs:
        for p in range(2):
            for offset, record in enumerate(broker.log(topic, p)):
                kind = {
                    settings.topics.intents: RecordType.INTENT,
                    settings.topics.acks: RecordType.ACK,
                }.get(topic, RecordType.RESUME)
                decoded = CODEC.decode(kind, record.value)
                times[f"{topic}/{p}/{offset}"] = decoded.event_time_ms  # type: ignore[union-attr]
    clients = FakeClients(broker, batch=8)
    engine = Engine(settings, clients=clients)
    clients.on_idle = engine.stop
    engine.run()
    parked = 0
    for p in range(2):
        folded: list[str] = []
        for record in broker.log(settings.topics.decisions, p):
            decision = CODEC.decode(RecordType.DECISION, record.value)
            assert isinstance(decision, Decision)
            parked += decision.reason is Reason.PARKED
            source = dict(record.headers)["source"].decode()
            if not folded or folded[-1] != source:
                folded.append(source)
        at = [times[source] for source in folded]
        assert at == sorted(at), f"partition {p} folded out of event-time order"
        assert folded
    assert parked == 0


def test_a_batch_is_bounded_and_the_rest_stays_in_order() -> None:
    order = _order(max_buffered=100)
    for n in range(6):
        _push(order, "intents", n, n)
        _push(order, "intents", n, n, partition=1)
    for topic in ("acks", "resumes"):
        for p in (0, 1):
            order.at_end(topic, p)
    first = order.ready(0.0, drained=False, limit=4)
    assert [(r.partition, r.offset) for r in first] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    rest = order.ready(0.0, drained=False)
    assert [(r.partition, r.offset) for r in rest] == [(p, n) for n in range(2, 6) for p in (0, 1)]


def test_the_oldest_record_of_any_partition_goes_first_into_a_bounded_batch() -> None:
    # A fixed partition order would fill every bounded batch from partition 0 while partition
    # 1's older records wait (on a backlog, batch after batch).
    order = _order(max_buffered=100)
    for n in range(4):
        _push(order, "intents", n, 100 + n)
    _push(order, "intents", 0, 5, partition=1)
    for topic in ("acks", "resumes"):
        for p in (0, 1):
            order.at_end(topic, p)
    first = order.ready(0.0, drained=False, limit=2)
    assert [(r.partition, r.offset) for r in first] == [(1, 0), (0, 0)]


def test_an_input_read_up_to_its_known_end_is_not_waited_for() -> None:
    ends = {("intents", 0): 3}
    asked: list[tuple[str, int, int]] = []

    def caught_up(topic: str, partition: int, after: int) -> bool:
        asked.append((topic, partition, after))
        return after >= ends.get((topic, partition), 1 << 62)

    order: InputOrder[str] = InputOrder(INPUTS, 1.0, 100, caught_up)
    order.at_end("acks", 0)
    for n in range(3):
        _push(order, "intents", n, n)
    _push(order, "resumes", 0, 50)
    # intents 0-2 (all up to the known end) are folded; the resume does not wait for a fourth
    assert _items(order.ready(0.0, drained=False)) == [
        "intents@0",
        "intents@1",
        "intents@2",
        "resumes@50",
    ]
    assert asked == [("intents", 0, 3)], "asked once per call, only for the empty input"
    ends[("intents", 0)] = 5  # the consumer heard of two more intents: wait for them
    _push(order, "resumes", 1, 60)
    assert order.ready(0.0, drained=False) == []
    assert order.waited == 0


def test_an_input_never_read_is_waited_for_when_its_end_is_unknown() -> None:
    order: InputOrder[str] = InputOrder(INPUTS, 1.0, 100, lambda t, p, after: True)
    order.at_end("acks", 0)
    _push(order, "resumes", 0, 50)
    # nothing buffered from intents yet: its position is unknown here, so no claim of an end
    assert order.ready(0.0, drained=False) == []


def test_records_put_back_come_first_again_in_order() -> None:
    order = _order()
    for n in range(3):
        _push(order, "intents", n, 10 + n)
    order.at_end("acks", 0)
    order.at_end("resumes", 0)
    batch = order.ready(0.0, drained=False)
    order.put_back(batch[1:])
    _push(order, "intents", 3, 13)
    assert _items(order.ready(0.0, drained=False)) == ["intents@11", "intents@12", "intents@13"]


class _RebalancingConsumer(FakeConsumer):
    """Rebalances once, while the order buffer holds a paused partition."""

    rebalanced = False

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if self.positions is not None and self.paused and not self.rebalanced:
            self.rebalanced = True
            self.rebalance()
        return super().consume(num_messages, timeout)


def test_a_partition_paused_for_order_is_not_left_paused_by_a_rebalance(tmp_path: Path) -> None:
    """The order buffer pauses the input that is ahead; a rebalance drops the buffer. librdkafka
    keeps the pause flag of a partition that comes back, so unless the engine resumes it the
    partition is never read again (two `--processes` stalled so). Every input is answered."""
    settings = load_settings(
        environ={},
        partitions=1,
        state_dir=tmp_path / "state",
        metrics_port=0,
        commit_interval_ms=60_000,
        transaction_timeout_ms=65_000,  # the interval + TXN_TIMEOUT_MARGIN_MS
        order_wait_ms=10_000,
        order_max_buffered=4,  # an input that is ahead is paused almost at once
    )
    broker = FakeBroker(1, Faults())
    events = build_log(30)
    for event in events:
        topic = settings.topics.topic_for(event)
        broker.append(topic, event.session_id.encode(), CODEC.encode(event))
    clients = FakeClients(broker, batch=8)
    made: list[_RebalancingConsumer] = []

    def consumer(_: Settings) -> ConsumerLike:
        made.append(_RebalancingConsumer(broker, lambda: clients.on_idle(), clients.batch))
        return made[-1]

    clients.consumer = consumer  # type: ignore[method-assign,assignment]
    engine = Engine(settings, clients=clients)

    def on_idle() -> None:  # consumed and folded everything, nothing left open
        txn = engine.transactions
        if not len(engine.order) and (txn is None or not txn.open):
            engine.stop()

    clients.on_idle = on_idle
    engine.run()
    assert made[0].rebalanced, "the order buffer never paused an input: nothing was tested"
    answered = set()
    for record in broker.log(settings.topics.decisions, 0):
        decision = CODEC.decode(RecordType.DECISION, record.value)
        assert isinstance(decision, Decision)
        answered.add(decision.decision_id.removesuffix("/final"))
    assert {e.event_id for e in events} <= answered
