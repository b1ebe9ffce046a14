"""What a `Commit` needs of its producer (`Calls`, which `Transactions` provides), the deadline
steps 4-5 share, and the shape of an output held until its commit begins."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from confluent_kafka import TopicPartition

T = TypeVar("T")

STEP_DEADLINE_S = 40.0
"""Steps 4-5 together (from step 4's flush to step 5's return), and any other transactional
call with its retries: well under `max.poll.interval.ms` (60 s). Step 3 is not under it."""

# An output produced before its commit began: topic, key, value, step, optional, the caller's
# outcome callback, the producer's extra arguments.
Held = tuple[str, bytes | None, bytes, str, bool, Callable[[bool], None] | None, dict[str, Any]]
Record = tuple[bytes | None, bytes, Any]  # key, value, headers: one output of `produce_all`


class Calls(Protocol):
    """What a commit needs of its producer (transaction.py): classified calls and produce."""

    def call(
        self,
        step: str,
        fn: Callable[[float], T],
        deadline: float | None = None,
        *,
        own_budget: bool = False,
    ) -> T: ...

    def begin_transaction(self) -> None: ...
    def flush(self, timeout_s: float) -> None: ...
    def send_offsets(
        self, offsets: list[TopicPartition], metadata: Any, timeout_s: float
    ) -> None: ...
    def commit_transaction(self, timeout_s: float) -> None: ...
    def abort_transaction(self, timeout_s: float) -> None: ...

    def produce_now(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        step: str,
        optional: bool,
        extra: dict[str, Any],
    ) -> bool: ...

    def produce_all(
        self, topic: str, records: Sequence[Record], step: str, partition: int, last: Any
    ) -> None: ...
