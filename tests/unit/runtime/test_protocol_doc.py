"""COMMIT_PROTOCOL.md says what the code does: the deadline steps 4-5 share, and text that
speaks of the code (no internal issue or session numbers; librdkafka defects by their link)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

import engine.runtime
from engine.runtime.commit import commit as commit_module
from engine.runtime.commit import transaction as transaction_module
from engine.runtime.commit.calls import STEP_DEADLINE_S
from engine.runtime.commit.errors import RejoinError
from engine.runtime.commit.transaction import CALL_TIMEOUT_S, Transactions
from engine.runtime.process.watchdog import Watchdog

RUNTIME = Path(engine.runtime.__file__).parent
PROTOCOL = RUNTIME / "commit" / "COMMIT_PROTOCOL.md"


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _SlowProducer:
    """flush takes `flush_s`; send_offsets fails retriably after 5 s, every time."""

    def __init__(self, clock: _Clock, flush_s: float) -> None:
        self.clock, self.flush_s = clock, flush_s
        self.offsets_attempts = 0

    def flush(self, timeout: float = -1) -> int:
        self.clock.now += self.flush_s
        return 0

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.offsets_attempts += 1
        self.clock.now += 5.0
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True))

    def begin_transaction(self) -> None: ...

    def commit_transaction(self, timeout: float = -1) -> None:
        raise AssertionError("step 5 must not run after step 4 failed")


@pytest.mark.parametrize("flush_s", [1.0, 30.0])
def test_steps_4_and_5_share_one_deadline(flush_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow flush (step 4) leaves the retries of send_offsets only what is left of the one
    deadline, counted from step 4's start: they do not get a fresh one."""
    clock = _Clock()
    monkeypatch.setattr(transaction_module, "time", clock)
    monkeypatch.setattr(commit_module, "time", clock)
    producer = _SlowProducer(clock, flush_s)
    watchdog = Watchdog(clock=clock.monotonic, on_expired=lambda expired: None)
    commit = Transactions(producer, watchdog, 1_000.0).for_outputs()  # type: ignore[arg-type]
    commit.write_changelog("changelog", [], [TopicPartition("t", 0, 1)], lambda: object())
    with pytest.raises(RejoinError, match="deadline"):
        commit.commit_steps()
    assert clock.now <= STEP_DEADLINE_S + CALL_TIMEOUT_S
    assert clock.now >= STEP_DEADLINE_S - CALL_TIMEOUT_S
    assert producer.offsets_attempts < (STEP_DEADLINE_S - flush_s) / 5 + 2


def test_the_protocol_states_the_deadline_the_code_gives() -> None:
    text = " ".join(PROTOCOL.read_text().split())
    assert f"steps 4-5 share one {STEP_DEADLINE_S:.0f} s deadline" in text
    assert "steps 3-5 share" not in text


def _runtime_texts() -> list[tuple[Path, str]]:
    return [
        (path, path.read_text())
        for path in sorted(RUNTIME.rglob("*"))
        if path.suffix in (".py", ".md") and path.is_file()
    ]


def test_runtime_text_names_no_session_or_issue_numbers_of_ours() -> None:
    own = re.compile(r"\b(sessions?|issues?)\s+#?\d+", re.IGNORECASE)
    found = [
        f"{path.relative_to(RUNTIME)}: {m.group(0)}"
        for path, text in _runtime_texts()
        for m in own.finditer(text)
    ]
    assert found == []


def test_librdkafka_defects_carry_their_link() -> None:
    """Every librdkafka issue the runtime names (a four-digit number next to `librdkafka`,
    or `#NNNN`) appears in the same file as its GitHub link."""
    mention = re.compile(r"librdkafka#(\d{4})|librdkafka issues? (\d{4})")
    missing = []
    for path, text in _runtime_texts():
        for m in mention.finditer(text):
            number = m.group(1) or m.group(2)
            if f"https://github.com/confluentinc/librdkafka/issues/{number}" not in text:
                missing.append(f"{path.relative_to(RUNTIME)}: {m.group(0)}")
    assert missing == []
