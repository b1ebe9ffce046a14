"""The watchdog's budget per transactional call: send_offsets_to_transaction (librdkafka 5456
can hang it past its own timeout) is cut at its timeout + 5 s, the other calls at the general
budget. A fake clock, no Kafka, no sleeping."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from engine.runtime.transaction import OWN_BUDGET_MARGIN_S, SEND_OFFSETS_TIMEOUT_S, Transaction
from engine.runtime.watchdog import Expired, Watchdog

GENERAL_BUDGET_S = 45.0


class _Producer:
    """Each call reports what the watchdog says when the call has run for `elapsed_s`."""

    def __init__(self, watchdog: Watchdog, now: list[float], elapsed_s: float) -> None:
        self.watchdog, self.now, self.elapsed_s = watchdog, now, elapsed_s
        self.seen: dict[str, tuple[float, Expired | None]] = {}

    def _run(self, name: str, timeout: float) -> None:
        self.now[0] += self.elapsed_s
        self.seen[name] = (timeout, self.watchdog.check())

    def produce(self, topic: str, **kwargs: Any) -> None: ...
    def poll(self, timeout: float = -1) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        self._run("flush", timeout)
        return 0

    def init_transactions(self, timeout: float = -1) -> None: ...
    def begin_transaction(self) -> None: ...
    def abort_transaction(self, timeout: float = -1) -> None: ...

    def commit_transaction(self, timeout: float = -1) -> None:
        self._run("commit", timeout)

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self._run("send_offsets", timeout)


def _commit_with_calls_lasting(elapsed_s: float) -> dict[str, tuple[float, Expired | None]]:
    now = [0.0]
    fired: list[Expired] = []
    watchdog = Watchdog(clock=lambda: now[0], on_expired=fired.append)
    producer = _Producer(watchdog, now, elapsed_s)
    txn = Transaction(producer, watchdog, GENERAL_BUDGET_S)
    txn.commit([TopicPartition("t", 0, 5)], lambda: object())
    return producer.seen


def test_send_offsets_is_cut_soon_after_its_own_timeout() -> None:
    own_budget = SEND_OFFSETS_TIMEOUT_S + OWN_BUDGET_MARGIN_S
    assert own_budget < GENERAL_BUDGET_S
    seen = _commit_with_calls_lasting(own_budget + 0.5)
    timeout, expired = seen["send_offsets"]
    assert timeout == SEND_OFFSETS_TIMEOUT_S
    assert expired is not None
    assert (expired.step, expired.budget_s) == ("4 send_offsets", own_budget)
    # flush keeps the general budget: the same wait is not cut there
    assert seen["flush"][1] is None


def test_send_offsets_within_its_own_budget_is_not_cut() -> None:
    seen = _commit_with_calls_lasting(SEND_OFFSETS_TIMEOUT_S + OWN_BUDGET_MARGIN_S - 0.5)
    assert seen["send_offsets"][1] is None


def test_the_other_calls_are_cut_at_the_general_budget() -> None:
    seen = _commit_with_calls_lasting(GENERAL_BUDGET_S + 0.5)
    flush = seen["flush"][1]
    assert flush is not None
    assert (flush.step, flush.budget_s) == ("4 flush", GENERAL_BUDGET_S)
