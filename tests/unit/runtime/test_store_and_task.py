"""The local store and the partition task without Kafka: atomic writes, the offset kept with
the states, commit/abort of the write cache (COMMIT_PROTOCOL.md steps 2, 3, 6 and abort)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from msgspec.structs import replace

from engine.core.events import AckOutcome, Reason, Verdict
from engine.core.state import PARK_MS
from engine.runtime.tasks.headers import (
    parse_pending_header,
    parse_watermark_source,
    pending_header,
)
from engine.runtime.tasks.read_cache import DECODED_BYTES_PER_ENCODED
from engine.runtime.tasks.restore import _store_write
from engine.runtime.tasks.state_codec import StateFormatError, decode_state
from engine.runtime.tasks.store import NO_OFFSET, LocalStore, StoreWrite
from engine.runtime.tasks.task import PartitionTask
from tests.unit.core.builders import ack, call, intent, msg, out, record, resume

U, C, OUT = msg("u"), call("c1"), out("c1")


def test_store_keeps_states_and_offset_together(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "p0.sqlite")
    assert store.changelog_offset() == NO_OFFSET
    store.apply([StoreWrite("a", b"1", "PENDING", 5), StoreWrite("b", b"2")], changelog_offset=7)
    assert (store.get("a"), store.get("b"), store.changelog_offset()) == (b"1", b"2", 7)
    assert store.pending_summary() == {"PENDING": (1, 5)}
    store.apply([StoreWrite("a", None)], changelog_offset=9)
    assert store.get("a") is None
    store.close()
    reopened = LocalStore(tmp_path / "p0.sqlite")
    assert (reopened.get("b"), reopened.changelog_offset(), reopened.count()) == (b"2", 9, 1)


def test_a_failing_write_batch_changes_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "p0.sqlite")
    store.apply([StoreWrite("a", b"1")], changelog_offset=1)

    def broken() -> list[StoreWrite]:
        raise RuntimeError("disk gone")

    class Exploding:
        def __iter__(self) -> Iterator[StoreWrite]:
            yield StoreWrite("a", b"2")
            yield from broken()

    with pytest.raises(RuntimeError):
        store.apply(Exploding(), changelog_offset=2)
    assert (store.get("a"), store.changelog_offset()) == (b"1", 1)


def test_lazy_writes_are_read_at_once_and_reach_the_disk_together(tmp_path: Path) -> None:
    """Step 6's writes: this store reads them at once; another reader (a restart after a
    crash) sees the older copy, states and offset alike, until they are synced."""
    path = tmp_path / "p0.sqlite"

    def on_disk(*sessions: str) -> tuple[object, ...]:
        other = LocalStore(path)
        seen = (*[other.get(s) for s in sessions], other.changelog_offset(), other.watermark())
        other.close()
        return seen

    store = LocalStore(path, sync_after_s=3600)
    store.apply([StoreWrite("a", b"1")], changelog_offset=1)
    store.apply_lazily([StoreWrite("a", b"2"), StoreWrite("b", b"3")], changelog_offset=4)
    store.apply_lazily([StoreWrite("b", None, watermark_ms=9)], changelog_offset=6)
    assert (store.get("a"), store.get("b"), store.changelog_offset()) == (b"2", None, 6)
    assert on_disk("a", "b") == (b"1", None, 1, None)
    store.sync()
    assert on_disk("a", "b") == (b"2", None, 6, 9)
    store.apply_lazily([StoreWrite("c", b"5")], changelog_offset=7)
    store.apply([StoreWrite("d", b"6")], changelog_offset=8)  # durable: the open batch too
    assert on_disk("c", "d") == (b"5", b"6", 8, 9)
    store.apply_lazily([StoreWrite("e", b"7")], changelog_offset=9)
    store.close()
    assert on_disk("e") == (b"7", 9, 9)


def test_lazy_writes_are_synced_after_their_interval(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "p0.sqlite", sync_after_s=0)
    store.apply_lazily([StoreWrite("a", b"1")], changelog_offset=1)
    other = LocalStore(tmp_path / "p0.sqlite")
    assert (other.get("a"), other.changelog_offset()) == (b"1", 1)


def test_an_old_batch_is_synced_without_a_next_write(tmp_path: Path) -> None:
    """A partition with no writes in later commits: the commit loop syncs its batch by age."""
    path = tmp_path / "p0.sqlite"
    store = LocalStore(path, sync_after_s=60)
    store.apply_lazily([StoreWrite("a", b"1")], changelog_offset=1)

    def on_disk() -> tuple[bytes | None, int]:
        other = LocalStore(path)
        seen = (other.get("a"), other.changelog_offset())
        other.close()
        return seen

    store.sync_if_due(time.monotonic())  # not due yet
    assert on_disk() == (None, NO_OFFSET)
    store.sync_if_due(time.monotonic() + 60)
    assert on_disk() == (b"1", 1)


def test_an_abandoned_store_drops_its_batch_and_frees_the_file(tmp_path: Path) -> None:
    """What a crash does: the open batch is lost whole, and the next process's store writes
    at once (held open, the batch would keep SQLite's write lock)."""
    path = tmp_path / "p0.sqlite"
    store = LocalStore(path, sync_after_s=3600)
    store.apply([StoreWrite("a", b"1")], changelog_offset=1)
    store.apply_lazily([StoreWrite("a", b"2")], changelog_offset=2)
    store.abandon()
    next_process = LocalStore(path)
    assert (next_process.get("a"), next_process.changelog_offset()) == (b"1", 1)
    next_process.apply([StoreWrite("b", b"3")], changelog_offset=3)
    assert next_process.changelog_offset() == 3
    next_process.close()


def test_a_failed_lazy_write_keeps_none_of_its_batch(tmp_path: Path) -> None:
    """Half of a batch on disk would put states and offset out of step: after a failure the
    store refuses writes, and closing it drops the whole open batch."""
    store = LocalStore(tmp_path / "p0.sqlite", sync_after_s=3600)
    store.apply([StoreWrite("a", b"1")], changelog_offset=1)
    store.apply_lazily([StoreWrite("b", b"2")], changelog_offset=2)
    unbindable = StoreWrite("c", b"5", object())  # type: ignore[arg-type]
    with pytest.raises(sqlite3.Error):  # after "a" is written, in the same statement
        store.apply_lazily([StoreWrite("a", b"3"), unbindable], changelog_offset=3)
    for write in (store.apply_lazily, store.apply):
        with pytest.raises(sqlite3.OperationalError, match="close this store"):
            write([StoreWrite("d", b"4")], 4)
    store.close()
    reopened = LocalStore(tmp_path / "p0.sqlite")
    assert [reopened.get(s) for s in "abc"] == [b"1", None, None]
    assert reopened.changelog_offset() == 1


def test_the_last_write_of_a_session_in_one_batch_wins(tmp_path: Path) -> None:
    # A restore batch can name a session twice (the changelog before compaction).
    store = LocalStore(tmp_path / "p0.sqlite")
    store.apply([StoreWrite("a", b"1"), StoreWrite("b", b"1")], changelog_offset=1)
    store.apply(
        [
            StoreWrite("a", None),
            StoreWrite("a", b"2", "PENDING", 7),
            StoreWrite("b", b"2"),
            StoreWrite("b", None),
            StoreWrite("c", b"3", watermark_ms=9),
            StoreWrite("c", b"4", watermark_ms=5),
        ],
        changelog_offset=6,
    )
    assert [store.get(s) for s in "abc"] == [b"2", None, b"4"]
    assert store.pending_since("a") == 7
    assert (store.changelog_offset(), store.watermark()) == (6, 9)


def test_commit_persists_and_abort_forgets(tmp_path: Path) -> None:
    task = PartitionTask(partition=0, store=LocalStore(tmp_path / "p0.sqlite"))
    task.fold(intent("e1", [OUT], [U, C]), offset=0)
    records = task.changelog_records()  # step 3
    assert [w.session_id for w in records] == ["s1"]
    assert records[0].pending_status == "PENDING"
    task.changelog_high = 41  # as the delivery reports would say
    task.persist()  # step 6
    assert task.store.changelog_offset() == 41
    stored = task.store.get("s1")
    assert stored is not None
    assert decode_state(stored).slot is not None

    _, decisions, _ = task.fold(ack("e2", AckOutcome.COMMITTED), offset=1)
    assert decisions[0].verdict is Verdict.RECORDED
    task.discard()  # abort: the ack is forgotten, the committed intent stays
    state = task.state_of("s1")
    assert state is not None
    assert state.slot is not None
    assert state.slot.status == "PENDING"


def test_replaying_after_abort_gives_the_same_decisions(tmp_path: Path) -> None:
    task = PartitionTask(partition=0, store=LocalStore(tmp_path / "p0.sqlite"))
    task.fold(intent("e1", [OUT], [U, C]), offset=0)
    task.changelog_records()
    task.persist()
    event = resume("e3", record([OUT], [U, C]), [U, C, OUT])
    _, first, _ = task.fold(event, offset=5)
    task.discard()
    _, again, _ = task.fold(event, offset=5)
    assert first == again
    assert first[0].verdict is Verdict.CONTINUE


def test_pending_header_round_trip() -> None:
    (header,) = pending_header(StoreWrite("s", b"", "HELD", 1234))
    assert parse_pending_header(header[1]) == ("HELD", 1234)
    assert pending_header(StoreWrite("s", b"")) == []


def test_unreadable_state_names_the_fix() -> None:
    with pytest.raises(StateFormatError, match="rebuild the partition"):
        decode_state(b"\x00garbage")


def test_read_cache_is_an_lru_bounded_by_estimated_bytes(tmp_path: Path) -> None:
    task = PartitionTask(partition=0, store=LocalStore(tmp_path / "p0.sqlite"))
    for n in range(40):
        task.fold(replace(intent(f"e{n}", [OUT], [U, C]), session_id=f"s{n}"), n)
    task.changelog_records()
    task.persist()
    sizes = [len(task.store.get(f"s{n}") or b"") * DECODED_BYTES_PER_ENCODED for n in range(40)]
    assert task.read_cache_used == sum(sizes)  # everything fits the default budget
    one = max(sizes)
    small = PartitionTask(partition=0, store=task.store, read_cache_bytes=10 * one)
    for n in range(10):
        assert small.state_of(f"s{n}") is not None
    assert small.state_of("s0") is not None  # s0 is now the most recently used
    for n in range(10, 30):
        assert small.state_of(f"s{n}") is not None
        assert small.read_cache_used <= 10 * one
    assert set(small.committed) == {f"s{n}" for n in range(20, 30)}
    small.state_of("s25")
    small.state_of("s30")  # evicts the least recently used (s20), not the oldest inserted
    assert "s20" not in small.committed
    assert "s25" in small.committed


class _Message:
    """The two things `restore._store_write` reads from a changelog message."""

    def __init__(self, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        self._value, self._headers = value, headers

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


def test_an_orphan_resume_is_answered_when_other_sessions_intents_pass_its_deadline(
    tmp_path: Path,
) -> None:
    """Nothing else ever arrives for the resume's session; the partition's intents watermark,
    kept in the store with the changelog offset, answers it, also after a restart."""
    store = LocalStore(tmp_path / "p0.sqlite")
    task = PartitionTask(partition=0, store=store)
    orphan = resume("r1", record([OUT], [U, C], intent_id="never"), [U, C], t=10_000)
    _, first, _ = task.fold(orphan, offset=0)
    assert [d.verdict for d in first] == [Verdict.DEFERRED]
    other = replace(intent("e1", [OUT], [U, C], t=10_000 + PARK_MS - 1), session_id="s2")
    task.fold(other, offset=0)
    assert task.expire_overdue() == []  # one millisecond short of the deadline
    task.changelog_records()
    task.persist()
    assert (store.watermark(), store.parked_due(10_000 + PARK_MS)) == (10_000 + PARK_MS - 1, ["s1"])
    store.close()  # a stop: step 6's last writes reach the disk

    restarted = PartitionTask(partition=0, store=LocalStore(tmp_path / "p0.sqlite"))
    assert restarted.watermark == 10_000 + PARK_MS - 1
    later = replace(other, event_id="e2", event_time_ms=10_000 + PARK_MS)
    restarted.fold(later, offset=1)
    answers = restarted.expire_overdue()
    assert [(d.decision_id, d.reason) for d, _ in answers] == [
        ("r1/final", Reason.INTENT_NEVER_ARRIVED)
    ]
    assert restarted.watermark_source() == f"watermark:0:{10_000 + PARK_MS}"
    assert parse_watermark_source(restarted.watermark_source()) == 10_000 + PARK_MS
    assert parse_watermark_source("reconciler.intents/0/17") is None
    assert restarted.expire_overdue() == []  # answered once
    writes = {w.session_id: w for w in restarted.changelog_records()}
    assert writes["s1"].park_deadline_ms is None
    assert writes["s1"].watermark_ms == 10_000 + PARK_MS


def test_an_abort_forgets_the_watermark_the_aborted_inputs_moved(tmp_path: Path) -> None:
    task = PartitionTask(partition=0, store=LocalStore(tmp_path / "p0.sqlite"))
    task.fold(intent("e1", [OUT], [U, C], t=5_000), offset=0)
    task.changelog_records()
    task.persist()
    task.fold(intent("e2", [OUT], [U, C], intent_id="i2", seq=2, t=9_000), offset=1)
    assert task.watermark == 9_000
    task.discard()
    assert task.watermark == 5_000


def test_restore_reads_the_park_deadline_and_the_watermark_from_changelog_headers(
    tmp_path: Path,
) -> None:
    write = StoreWrite("s1", b"x", park_deadline_ms=70_000, watermark_ms=12_345)
    restored = _store_write(b"s1", _Message(b"x", pending_header(write)))
    assert restored == write
    store = LocalStore(tmp_path / "p0.sqlite")
    store.apply([restored, StoreWrite("s2", b"y", watermark_ms=1)], changelog_offset=4)
    assert (store.watermark(), store.parked_due(69_999), store.parked_due(70_000)) == (
        12_345,
        [],
        ["s1"],
    )
    assert store.next_park_deadline() == 70_000
    assert store.next_park_deadline(after=70_000) is None


class _CountingStore(LocalStore):
    """Counts the index rows the sweeps read (the cost that grew with the transaction)."""

    rows_read = 0

    def parked_due(self, watermark: int, after: int | None = None) -> list[str]:
        rows = super().parked_due(watermark, after)
        self.rows_read += len(rows)
        return rows


def test_sweeps_read_each_due_session_once_per_transaction(tmp_path: Path) -> None:
    """60 orphans committed, then one transaction whose intents pass their deadlines one by
    one: every orphan is answered once, and the store's index is read once per orphan (the
    store lists answered sessions until step 6, so re-reading them made a long transaction
    quadratic: a 200,000-session run outlived the transaction timeout)."""
    store = _CountingStore(tmp_path / "p0.sqlite")
    task = PartitionTask(partition=0, store=store)
    orphans = 60
    for n in range(orphans):
        lost = resume("r", record([OUT], [U, C], intent_id="never"), [U, C], t=1_000 + n)
        task.fold(replace(lost, session_id=f"o{n:03d}", event_id=f"o{n:03d}/r"), offset=n)
    task.changelog_records()
    task.persist()

    answered: list[str] = []
    for n in range(orphans):
        tick = intent("e", [OUT], [U, C], t=1_000 + n + PARK_MS)
        task.fold(replace(tick, session_id=f"s{n:03d}", event_id=f"s{n:03d}/e"), offset=n)
        answered += [d.decision_id for d, _ in task.expire_overdue()]
    assert answered == [f"o{n:03d}/r/final" for n in range(orphans)]
    assert store.rows_read == orphans

    task.discard()  # an abort: the next transaction sweeps the committed index again
    task.fold(replace(tick, event_id="again"), offset=orphans)
    assert len(task.expire_overdue()) == orphans


def test_get_many_reads_stored_states_and_none_for_the_rest(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "p0.sqlite")
    ids = [f"s{n}" for n in range(1_200)]  # more than one query's worth
    store.apply([StoreWrite(s, s.encode()) for s in ids[::2]], changelog_offset=1)
    found = store.get_many([*ids, "nobody"])
    assert found == {s: store.get(s) for s in [*ids, "nobody"]}
    assert sum(v is not None for v in found.values()) == 600


def test_a_prefetched_batch_is_read_without_a_query_per_session(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "p0.sqlite")
    writer = PartitionTask(partition=0, store=store)
    writer.fold(intent("e1", [OUT], [U, C]), offset=0)
    writer.changelog_records()
    writer.persist()
    task = PartitionTask(partition=0, store=store)
    task.prefetch(["s1", "nobody"])

    def no_single_reads(session_id: str) -> bytes | None:
        raise AssertionError(f"read {session_id} one by one")

    task.store.get = no_single_reads  # type: ignore[method-assign]
    assert task.state_of("nobody") is None
    state = task.state_of("s1")
    assert state is not None
    assert state == writer.state_of("s1")


def test_step_6_drops_what_was_prefetched_before_the_store_changed(tmp_path: Path) -> None:
    task = PartitionTask(partition=0, store=LocalStore(tmp_path / "p0.sqlite"))
    task.prefetch(["s1", "s2"])  # neither stored yet; s2 is not folded in this transaction
    task.fold(intent("e1", [OUT], [U, C]), offset=0)
    task.changelog_records()
    task.persist()
    reads: list[str] = []
    single_read = task.store.get

    def counted(session_id: str) -> bytes | None:
        reads.append(session_id)
        return single_read(session_id)

    task.store.get = counted  # type: ignore[method-assign]
    assert task.state_of("s2") is None
    assert reads == ["s2"]  # read from the store as it is after step 6, not the batch's copy


def test_an_overlapped_commit_persists_only_what_it_sealed(tmp_path: Path) -> None:
    """COMMIT_PROTOCOL "Overlap": folds after step 3 (while steps 4-5 run) read the sealed
    states, and step 6 writes the sealed generation only, never a state folded ahead."""
    task = PartitionTask(partition=0, store=LocalStore(tmp_path / "p0.sqlite"))
    task.fold(intent("e1", [OUT], [U, C]), offset=0)
    sealed = task.changelog_records()  # step 3 of transaction N
    task.seal()
    # folded ahead into N+1: the ack reads N's (sealed) state, a new session starts
    _, decisions, _ = task.fold(ack("e2", AckOutcome.COMMITTED), offset=1)
    assert decisions[0].verdict is Verdict.RECORDED
    task.fold(replace(intent("e3", [OUT], [U, C]), session_id="s2"), offset=2)
    assert task.store.get("s1") is None, "nothing reaches the store before step 6"
    task.changelog_high = 7
    task.persist_sealed()  # step 6 of N
    stored = task.store.get("s1")
    assert stored is not None
    assert stored == sealed[0].state, "the store holds N's state, not the one folded ahead"
    assert task.store.get("s2") is None
    assert task.store.changelog_offset() == 7
    # N+1's step 3 carries exactly what was folded ahead
    ahead = {w.session_id: w for w in task.changelog_records()}
    assert set(ahead) == {"s1", "s2"}
    assert ahead["s1"].state != stored
    assert ahead["s1"].pending_status is None  # the ack resolved the intent N left PENDING


def test_a_failed_overlapped_commit_drops_what_was_folded_ahead(tmp_path: Path) -> None:
    task = PartitionTask(partition=0, store=LocalStore(tmp_path / "p0.sqlite"))
    task.fold(intent("e1", [OUT], [U, C]), offset=0)
    task.changelog_records()
    task.seal()
    task.fold(ack("e2", AckOutcome.COMMITTED), offset=1)
    task.discard()  # commit N failed: abort drops N and everything folded ahead
    assert task.state_of("s1") is None
    assert task.changelog_records() == []
    assert task.store.get("s1") is None
    # folded again from the committed offsets: the intent starts from nothing, as first
    before, _, _ = task.fold(intent("e1", [OUT], [U, C]), offset=0)
    assert before is None
    assert [w.session_id for w in task.changelog_records()] == ["s1"]
