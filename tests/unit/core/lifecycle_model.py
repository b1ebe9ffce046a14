"""A model of a Session store and of runner processes, driven through the fold.

The runners follow the client contract (durable intent and checkpoint before the append, the
engine's answer obeyed) and suffer every fault a runner can meet: a crash before, inside or after
the append, a lost ack, a definite failure, a store rollback, a partial append, restores from a
checkpoint (one copy or two), a foreign writer that pops, rewrites or appends, held batches that
settle or are dropped. The engine reads the three input topics in time order while the model
runs (runners act on its answers); the logs are kept so the same inputs can be folded again in
another interleaving.

What the model records is what the invariants need: which batch every runner append wrote,
which items a foreign writer removed, and every decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from msgspec.structs import replace

from engine.core.digest import item_facts
from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Binding,
    CausalContext,
    Cause,
    Decision,
    Event,
    IntentEvent,
    IntentKind,
    ItemFacts,
    PendingRecord,
    RepairEvent,
    RepairResolution,
    ResumeEvent,
    RunnerAction,
    Verdict,
)
from engine.core.fold import fold
from engine.core.state import LEASE_MS, SessionState

SID = "s-life"
BINDING = Binding(backend_id="model-store", namespace="lifecycle")
BEFORE_WINDOW = 2  # how many tail digests a runner records as `before`
STORE_PRODUCER = "store:model-store"  # the producer id of the store's own acks


def causal(producer: str, seq: int, *after: tuple[str, int]) -> CausalContext:
    """The causal context of `producer`'s event number `seq`, naming the events `after`
    ((producer, seq) pairs) it follows."""
    return CausalContext(
        producer=producer, seq=seq, after=[Cause(producer=p, seq=n) for p, n in after]
    )


def repair_event(
    event_id: str,
    session_id: str,
    time_ms: int,
    resolution: RepairResolution,
    intent_id: str | None,
    *,
    actor: str = "ops@example",
    reason: str = "checked the store",
) -> RepairEvent:
    """An operator's repair of a session (or, by the model, one naming no intent it holds)."""
    return RepairEvent(
        event_id=event_id,
        session_id=session_id,
        event_time_ms=time_ms,
        resolution=resolution,
        actor=actor,
        reason=reason,
        intent_id=intent_id,
    )


def fold_placed(
    state: SessionState | None, placed: Iterable[tuple[Event, int]]
) -> tuple[list[SessionState], list[Decision]]:
    """Folds each event at its offset in its topic, from `state`: the state after each event,
    and every decision in order."""
    states: list[SessionState] = []
    decisions: list[Decision] = []
    for event, offset in placed:
        result = fold(state, event, offset)
        state = result.state
        states.append(state)
        decisions.extend(result.decisions)
    return states, decisions


class Topic(StrEnum):
    INTENTS = "intents"
    ACKS = "acks"
    RESUMES = "resumes"


class Fault(StrEnum):
    """What happens to one append."""

    OK = "ok"
    NOT_WRITTEN = "not_written"  # the store refused; NOT_WRITTEN reported, the runner stops
    ROLLBACK = "rollback"  # written, then rolled back by the store; NOT_WRITTEN reported
    LOST_ACK = "lost_ack"  # written; the runner crashes before it can say so
    UNKNOWN_LANDED = "unknown_landed"  # written; the call failed opaquely (UNKNOWN), crash
    UNKNOWN_ABSENT = "unknown_absent"  # not written; the call failed opaquely (UNKNOWN), crash
    CRASH_BEFORE = "crash_before"  # crash after the intent, before the append
    PARTIAL = "partial"  # a prefix landed; the call failed opaquely (UNKNOWN), crash
    RETRY_IN_PLACE = "retry_in_place"  # NOT_WRITTEN, then the same runner re-arms the intent
    # under the same fence and appends again, successfully (first attempts only, see README)


class Foreign(StrEnum):
    POP = "pop"
    REWRITE = "rewrite"
    APPEND = "append"


@dataclass(frozen=True)
class Write:
    fault: Fault


@dataclass(frozen=True)
class ForeignWrite:
    kind: Foreign


@dataclass(frozen=True)
class Restore:
    copies: int  # 1, or 2: a second restored copy of the same checkpoint
    fault: Fault  # what happens to an APPEND_ONCE the winner makes


@dataclass(frozen=True)
class Hold:
    pass


@dataclass(frozen=True)
class Settle:
    drop: bool  # DISCARD instead of RELEASE


@dataclass(frozen=True)
class LateCopy:
    """An exact copy of an earlier input (same event id, content and time) arrives again, out
    of the de-duplication window: a producer retry, a runner re-sending after a crash, a lagging
    copy. ``back`` picks which of the inputs older than the window."""

    back: int


Op = Write | ForeignWrite | Restore | Hold | Settle | LateCopy


@dataclass
class Checkpoint:
    checkpoint_id: str
    sequence: int
    pending: PendingRecord | None
    batch: int | None  # the batch number of the pending record
    causes: list[Cause] = field(default_factory=list)  # what its runner had published


@dataclass
class Runner:
    runner_id: str
    fence: int | None
    checkpoint: Checkpoint
    held: int | None = None  # batch number of a held batch this runner carries
    published: int = -1  # causal seq of the last event it published (-1: none)


@dataclass
class Input:
    topic: Topic
    event: Event
    copy: bool = False  # a late copy of an earlier input (`LateCopy`)


@dataclass
class World:
    """The store, the runners, the engine (time-ordered) and everything that happened."""

    store_acks: bool
    causal: bool = False  # producers fill the causal context (intent/ack/resume v3)
    store_published: int = -1  # causal seq of the store's last ack (-1: none)
    store: list[dict[str, Any]] = field(default_factory=list)
    time_ms: int = 1_000
    ids: int = 0
    batches: int = 0
    runners: int = 0
    sequence: int = -1  # the last write sequence published (-1: none), as the client counts
    live: Runner | None = None
    stopped: bool = False
    state: SessionState | None = None
    log: list[Input] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    appended: list[int] = field(default_factory=list)  # batch numbers, one per landed append
    started: set[int] = field(default_factory=set)  # batches a checkpoint recorded
    foreign_touched: set[str] = field(default_factory=set)  # digests a foreign writer removed
    batch_items: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    latest: Checkpoint | None = None
    topic_offsets: dict[Topic, int] = field(default_factory=lambda: dict.fromkeys(Topic, 0))
    violations: list[str] = field(default_factory=list)
    copy_answers: list[Decision] = field(default_factory=list)  # what late copies were answered

    # --- plumbing ------------------------------------------------------------------------

    def _id(self, prefix: str) -> str:
        self.ids += 1
        return f"{prefix}{self.ids}"

    def _tick(self, ms: int = 10) -> int:
        self.time_ms += ms
        return self.time_ms

    def publish(self, topic: Topic, event: Event) -> list[Decision]:
        """The engine folds the input now (time order); its answers go back to the runner."""
        position = self.topic_offsets[topic]
        self.topic_offsets[topic] += 1
        self.log.append(Input(topic, event))
        result = fold(self.state, event, position)
        self.state = result.state
        self.decisions.extend(result.decisions)
        return list(result.decisions)

    def late_copy(self, back: int) -> None:
        """Re-send an earlier input as it was, once it is out of the de-duplication window.

        Where fewer than `RECENT_EVENT_IDS` inputs followed it, inputs that change nothing
        (repairs naming an intent the session never had: REJECTED UNKNOWN_INTENT) push it out
        first. Their answers and the copy's go to nobody (the copy's producer acted on the
        first copy's answer); they take positions, but no time.
        """
        originals = [i for i in self.log if not i.copy]
        if not originals:
            return
        original = originals[back % len(originals)]
        while self.state is not None and original.event.event_id in self.state.recent_event_ids:
            filler = repair_event(
                f"noise{len(self.log)}",  # not from `_id`: the run without copies must
                # number its inputs alike
                SID,
                self.time_ms,
                RepairResolution.ABANDON,
                "never-registered",
                actor="model",
                reason="noise",
            )
            self._fold_unseen(Input(Topic.INTENTS, filler, copy=True))
        self._fold_unseen(Input(original.topic, original.event, copy=True))

    def _fold_unseen(self, item: Input) -> None:
        position = self.topic_offsets[item.topic]
        self.topic_offsets[item.topic] += 1
        self.log.append(item)
        result = fold(self.state, item.event, position)
        self.state = result.state
        self.copy_answers.extend(result.decisions)

    def digests(self, items: Sequence[dict[str, Any]]) -> list[str]:
        return [item_facts(i, ignore_ids=False).digest for i in items]

    def tail(self, size: int) -> list[str]:
        return self.digests(self.store[len(self.store) - size :] if size else [])

    def facts(self, items: Sequence[dict[str, Any]]) -> list[ItemFacts]:
        return [item_facts(i, ignore_ids=False) for i in items]

    # --- runner actions --------------------------------------------------------------------

    def _new_batch(self, held: bool) -> int:
        self.batches += 1
        k = self.batches
        if held:
            items = [{"type": "function_call", "call_id": f"c{k}", "name": "t", "arguments": "{}"}]
        else:
            items = [{"role": "assistant", "content": f"b{k}.{j}"} for j in range(1 + k % 2)]
        self.batch_items[k] = items
        return k

    def _intent(
        self,
        runner: Runner,
        kind: IntentKind,
        intent_id: str,
        items: list[dict[str, Any]],
        before: list[str] | None,
    ) -> Decision:
        answers = self.publish(
            Topic.INTENTS,
            IntentEvent(
                event_id=self._id("i"),
                session_id=SID,
                event_time_ms=self._tick(),
                kind=kind,
                intent_id=intent_id,
                runner_id=runner.runner_id,
                fence_token=runner.fence,
                binding=BINDING,
                before=before,
                items=self.facts(items),
                persisted_count=len(items),
                sequence=self.sequence,
                causal=self._next_cause(runner),
            ),
        )
        return answers[0]

    def _next_cause(self, runner: Runner) -> CausalContext | None:
        """The causal context of the runner's next event: it follows its own previous one."""
        if not self.causal:
            return None
        previous = runner.published
        runner.published += 1
        if previous < 0:
            return causal(runner.runner_id, runner.published)
        return causal(runner.runner_id, runner.published, (runner.runner_id, previous))

    def _store_cause(self, runner: Runner) -> CausalContext | None:
        """The store numbers its own acks per session (the outbox row it writes with the
        append), and names the runner's event the append followed (its intent or re-arm),
        which the runner hands the store adapter with the fence token."""
        if not self.causal:
            return None
        self.store_published += 1
        seq = self.store_published
        after = [(STORE_PRODUCER, seq - 1)] if seq > 0 else []
        if runner.published >= 0:
            after.append((runner.runner_id, runner.published))
        return causal(STORE_PRODUCER, seq, *after)

    def _ack(
        self,
        runner: Runner,
        intent_id: str,
        outcome: AckOutcome,
        source: AckSource,
        observed_tail: list[str] | None = None,
    ) -> None:
        self.publish(
            Topic.ACKS,
            AckEvent(
                event_id=self._id("a"),
                session_id=SID,
                event_time_ms=self._tick(),
                intent_id=intent_id,
                runner_id=runner.runner_id if source is AckSource.RUNNER else "",
                outcome=outcome,
                source=source,
                fence_token=runner.fence,
                observed_tail=observed_tail,
                causal=self._next_cause(runner)
                if source is AckSource.RUNNER
                else self._store_cause(runner),
            ),
        )

    def _both_acks(self, runner: Runner, intent_id: str, outcome: AckOutcome) -> None:
        if self.store_acks and outcome is not AckOutcome.UNKNOWN:
            self._ack(runner, intent_id, outcome, AckSource.STORE)
        self._ack(runner, intent_id, outcome, AckSource.RUNNER)

    def _checkpoint(
        self, runner: Runner | None, pending: PendingRecord | None, batch: int | None
    ) -> Checkpoint:
        causes = []
        if runner is not None and runner.published >= 0:
            # What the runner had published, every event acknowledged (it publishes in order
            # and waits for each): the checkpoint names its last one.
            causes = [Cause(producer=runner.runner_id, seq=runner.published)]
        checkpoint = Checkpoint(self._id("c"), self.sequence, pending, batch, causes)
        self.latest = checkpoint
        return checkpoint

    def _land(self, k: int, items: list[dict[str, Any]]) -> None:
        self.store.extend(items)
        self.appended.append(k)

    def _append(self, runner: Runner, k: int, intent_id: str, fault: Fault) -> bool:
        """One append attempt of batch ``k`` under ``fault``. Returns whether the runner lives."""
        items = self.batch_items[k]
        if fault is Fault.CRASH_BEFORE:
            return False
        if fault is Fault.NOT_WRITTEN:
            self._both_acks(runner, intent_id, AckOutcome.NOT_WRITTEN)
            return True
        if fault is Fault.ROLLBACK:
            self._land(k, items)
            del self.store[len(self.store) - len(items) :]
            self.appended.pop()
            self._both_acks(runner, intent_id, AckOutcome.NOT_WRITTEN)
            return True
        if fault is Fault.UNKNOWN_ABSENT:
            self._ack(runner, intent_id, AckOutcome.UNKNOWN, AckSource.RUNNER)
            return False
        if fault is Fault.PARTIAL and len(items) > 1:
            self.store.extend(items[:1])
            self.appended.append(k)
            self._ack(runner, intent_id, AckOutcome.UNKNOWN, AckSource.RUNNER)
            return False
        self._land(k, items)
        if self.store_acks:  # the tail as of the append's transaction (SPEC.md §6)
            tail = self.tail(min(len(items) + 1, len(self.store)))
            self._ack(runner, intent_id, AckOutcome.COMMITTED, AckSource.STORE, tail)
        if fault in (Fault.LOST_ACK, Fault.PARTIAL):
            return False
        if fault is Fault.UNKNOWN_LANDED:
            self._ack(runner, intent_id, AckOutcome.UNKNOWN, AckSource.RUNNER)
            return False
        self._ack(runner, intent_id, AckOutcome.COMMITTED, AckSource.RUNNER)
        return True

    def write(self, fault: Fault) -> None:
        runner = self.live
        if runner is None or runner.held is not None:
            return
        k = self._new_batch(held=False)
        self.sequence += 1
        items = self.batch_items[k]
        intent_id = f"w{k}"
        before = self.tail(min(BEFORE_WINDOW, len(self.store)))
        answer = self._intent(runner, IntentKind.REGISTER, intent_id, items, before)
        if answer.verdict is not Verdict.RECORDED:
            self.live = None  # the engine refused the write: the runner stops
            self.stopped = True
            return
        record = PendingRecord(
            intent_id=intent_id,
            items=self.facts(items),
            before=before,
            persisted_count=len(items),
        )
        self.started.add(k)
        runner.checkpoint = self._checkpoint(runner, record, k)
        self._finish(runner, k, intent_id, fault, record)

    def _finish(
        self, runner: Runner, k: int, intent_id: str, fault: Fault, record: PendingRecord
    ) -> None:
        if fault is Fault.RETRY_IN_PLACE:
            self._both_acks(runner, intent_id, AckOutcome.NOT_WRITTEN)
            items = self.batch_items[k]
            answer = self._intent(runner, IntentKind.REGISTER, intent_id, items, record.before)
            if answer.verdict is not Verdict.RECORDED:
                self.live = None
                self.stopped = True
                return
            fault = Fault.OK
        alive = self._append(runner, k, intent_id, fault)
        if fault in (Fault.NOT_WRITTEN, Fault.ROLLBACK):
            # After a definite failure the runner stops and is resumed: the grant's fence marks
            # the new attempt, so its evidence cannot be confused with the failed one's in any
            # interleaving (a retry in place under the same fence could be, README "Attempts").
            alive = False
        if not alive:
            self.live = None
            return
        runner.checkpoint = self._checkpoint(runner, None, None)

    def foreign(self, kind: Foreign) -> None:
        self._tick()
        if kind is Foreign.APPEND or not self.store:
            self.store.append({"role": "user", "content": self._id("f")})
            return
        removed = self.store.pop()
        self.foreign_touched.update(self.digests([removed]))
        if kind is Foreign.REWRITE:
            self.store.append({**removed, "edited": True})

    def hold(self) -> None:
        runner = self.live
        if runner is None or runner.held is not None:
            return
        k = self._new_batch(held=True)
        self.sequence += 1
        intent_id = f"w{k}"
        answer = self._intent(runner, IntentKind.HELD, intent_id, self.batch_items[k], None)
        if answer.verdict is not Verdict.RECORDED:
            self.live = None
            self.stopped = True
            return
        record = PendingRecord(
            intent_id=intent_id,
            items=self.facts(self.batch_items[k]),
            persisted_count=len(self.batch_items[k]),
            held=True,
        )
        self.started.add(k)
        runner.held = k
        runner.checkpoint = self._checkpoint(runner, record, k)

    def settle(self, drop: bool) -> None:
        runner = self.live
        if runner is None or runner.held is None:
            return
        k = runner.held
        intent_id = f"w{k}"
        self.sequence += 1  # every intent takes the next number, as the client counts
        if drop:
            self._intent(runner, IntentKind.DISCARD, intent_id, self.batch_items[k], None)
            self.started.discard(k)
            runner.held = None
            runner.checkpoint = self._checkpoint(runner, None, None)
            return
        output = {"type": "function_call_output", "call_id": f"c{k}", "output": "ok"}
        self.batch_items[k] = [*self.batch_items[k], output]
        before = self.tail(min(BEFORE_WINDOW, len(self.store)))
        answer = self._intent(runner, IntentKind.RELEASE, intent_id, self.batch_items[k], before)
        runner.held = None
        if answer.verdict is not Verdict.RECORDED:
            self.live = None
            self.stopped = True
            return
        record = PendingRecord(
            intent_id=intent_id,
            items=self.facts(self.batch_items[k]),
            before=before,
            persisted_count=len(self.batch_items[k]),
        )
        runner.checkpoint = self._checkpoint(runner, record, k)
        self._finish(runner, k, intent_id, Fault.OK, record)

    def restore(self, copies: int, fault: Fault) -> None:
        if self.stopped or self.latest is None:
            return
        self.live = None  # whoever ran is dead now
        checkpoint = self.latest
        self._tick(LEASE_MS + 1_000)  # the old holder's lease lapsed
        winners: list[tuple[Runner, Decision]] = []
        for _ in range(copies):
            self.runners += 1
            runner = Runner(f"r{self.runners}", None, checkpoint)
            record = checkpoint.pending
            size = 0 if record is None else len(record.before or []) + len(record.items)
            answers = self.publish(
                Topic.RESUMES,
                ResumeEvent(
                    event_id=self._id("q"),
                    session_id=SID,
                    event_time_ms=self._tick(),
                    runner_id=runner.runner_id,
                    checkpoint_id=checkpoint.checkpoint_id,
                    binding=BINDING,
                    pending=record,
                    observed_tail=self.tail(min(size, len(self.store))),
                    checkpoint_sequence=checkpoint.sequence,
                    checkpoint_session_id=SID,
                    causal=self._resume_cause(runner, checkpoint),
                ),
            )
            answer = answers[0]
            if answer.grants:
                winners.append((runner, answer))
        if len(winners) > 1:
            self.violations.append("two restored copies were both granted")
        if not winners:
            self.stopped = True
            return
        runner, answer = winners[0]
        runner.fence = answer.fence_token
        self._obey(runner, answer, checkpoint, fault)

    def _resume_cause(self, runner: Runner, checkpoint: Checkpoint) -> CausalContext | None:
        """A resume follows what its checkpoint's runner had published and the store's last
        ack as read with the tail (a store that publishes acks writes their outbox rows in the
        append's transaction, so the tail and its ack number are read together)."""
        if not self.causal:
            return None
        after = [(cause.producer, cause.seq) for cause in checkpoint.causes]
        if self.store_published >= 0:
            after.append((STORE_PRODUCER, self.store_published))
        runner.published = 0
        return causal(runner.runner_id, 0, *after)

    def _obey(self, runner: Runner, answer: Decision, checkpoint: Checkpoint, fault: Fault) -> None:
        record, k = checkpoint.pending, checkpoint.batch
        self.live = runner
        if answer.runner_action is RunnerAction.DO_NOT_REPLAY or record is None or k is None:
            runner.checkpoint = self._checkpoint(runner, None, None)
            return
        if answer.runner_action is RunnerAction.RELEASE_HELD:
            runner.held = k
            runner.checkpoint = self._checkpoint(
                runner, record, k
            )  # the resumed run checkpoints again
            return
        if answer.runner_action is not RunnerAction.APPEND_ONCE:
            self.violations.append(f"grant with action {answer.runner_action}")
            return
        before = self.tail(min(BEFORE_WINDOW, len(self.store)))
        if record.before is not None and before != record.before:
            self.violations.append("APPEND_ONCE granted on a tail that is not `before`")
        armed = replace(record, before=before)
        self._intent(runner, IntentKind.REGISTER, record.intent_id, self.batch_items[k], before)
        runner.checkpoint = self._checkpoint(runner, armed, k)
        self._finish(runner, k, record.intent_id, fault, armed)

    def run(self, ops: Iterable[Op]) -> None:
        self.runners += 1
        self.live = Runner(f"r{self.runners}", None, self._checkpoint(None, None, None))
        for op in ops:
            if self.stopped:
                break
            if isinstance(op, Write):
                self.write(op.fault)
            elif isinstance(op, ForeignWrite):
                self.foreign(op.kind)
            elif isinstance(op, Restore):
                self.restore(op.copies, op.fault)
            elif isinstance(op, Hold):
                self.hold()
            elif isinstance(op, LateCopy):
                self.late_copy(op.back)
            else:
                self.settle(op.drop)
        # Reconcile whatever is still open: one more restore, then the held batch settles.
        for _ in range(3):
            live = self.live
            if self.stopped or (
                live is not None and (live.checkpoint.pending is None or live.held is not None)
            ):
                break
            self.restore(1, Fault.OK)
        if not self.stopped and self.live is not None and self.live.held is not None:
            self.settle(drop=False)
