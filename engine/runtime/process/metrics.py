"""Prometheus metrics and the health endpoints (/metrics, /healthz, /readyz) of one engine.

Each engine owns its registry, so several engines in one test process do not collide.
Readiness is 1 only while the process holds restored tasks; liveness is loop progress.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from confluent_kafka import KafkaException, TopicPartition
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from engine.core.events import Decision, Reason, Verdict
from engine.core.state import Health
from engine.runtime.clients import ConsumerLike
from engine.runtime.tasks.corrupt import detecting
from engine.runtime.tasks.store import LocalStore
from engine.wire.errors import DecodeReason

LAG_INTERVAL_S = 5.0
SESSIONS_INTERVAL_S = 1.0  # the session gauges cost a COUNT(*) per store: not every commit
LAG_QUERY_TIMEOUT_S = 0.2
LAG_QUERY_BUDGET_S = 1.0
DEAD_LETTER_REFUSED = "DEAD_LETTER_REFUSED"  # the dead-letter produce itself failed
ABORT_KINDS = ("abortable", "fatal", "state")
STAGES = ("consume_wait", "fold", "produce", "commit", "persist", "fold_ahead", "commit_wait")
STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _HasStore(Protocol):
    partition: int
    store: LocalStore


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "reconciler_events", "Input events folded", ["topic", "kind"], registry=r
        )
        self.decisions = Counter(
            "reconciler_decisions", "Decisions produced", ["verdict", "reason"], registry=r
        )
        self.dead_letters = Counter(
            "reconciler_dead_letters", "Inputs sent to dead letters", ["reason"], registry=r
        )
        self.pending_writes = Gauge(
            "reconciler_pending_writes", "Unresolved pending writes", ["state"], registry=r
        )
        self.oldest_pending_age = Gauge(
            "reconciler_oldest_pending_write_age_seconds",
            "Wall time since the event time of the oldest unresolved pending write",
            registry=r,
        )
        self.decision_latency = Histogram(
            "reconciler_decision_latency_seconds",
            "Event time of the input to the commit of its decision",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "reconciler_transaction_commit_seconds", "commit_transaction duration", registry=r
        )
        self.stage_seconds = Histogram(
            "reconciler_stage_seconds",
            "Time per consumed batch in each stage: consume_wait (in consume()), fold (decode,"
            " fold, encode, decisions queued), produce (changelog queued and flushed), commit"
            " (offsets sent, transaction committed), persist (step 6); with the commit"
            " overlapped: fold_ahead (folds while steps 4-5 run in the worker) and commit_wait"
            " (the loop waiting for the worker, then step 6)",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.aborts = Counter(
            "reconciler_transaction_aborts", "Aborted transactions", ["kind"], registry=r
        )
        self.restore_seconds = Histogram(
            "reconciler_restore_seconds", "Restore time per task (step A2)", registry=r
        )
        self.task_corrupted = Counter(
            "reconciler_task_corrupted", "Unreadable local stores wiped", ["partition"], registry=r
        )
        self.sessions = Gauge("reconciler_sessions", "Sessions in local state", registry=r)
        self.lag = Gauge(
            "reconciler_consumer_lag", "Records behind the high watermark", ["topic"], registry=r
        )
        self.rebalances = Counter(
            "reconciler_rebalances", "Rebalance callbacks", ["kind"], registry=r
        )
        self.lease_conflicts = Counter(
            "reconciler_lease_conflicts",
            "Resumes withheld because another runner holds "
            "authority or the checkpoint was already resumed",
            registry=r,
        )
        self.gate_violations = Counter(
            "reconciler_gate_violations",
            "Held batches seen in the Session before release",
            registry=r,
        )
        self.alerts = Counter(
            "reconciler_alerts", "Decisions flagged for an operator", ["reason"], registry=r
        )
        self.ready = Gauge("reconciler_ready", "1 when restored and processing", registry=r)
        self.last_progress = Gauge(
            "reconciler_last_progress_timestamp_seconds",
            "Wall time at which the engine loop last completed an iteration",
            registry=r,
        )
        self.engine_restarts = Counter(
            "reconciler_engine_restarts",
            "Times the supervisor restarted the engine process before this one",
            registry=r,
        )
        self.rejoins = Counter(
            "reconciler_rejoins",
            "Times this process recreated its Kafka clients and rejoined after a fatal error",
            registry=r,
        )
        self.sessions_by_health = Gauge(
            "reconciler_sessions_by_health",
            "Sessions in local state by health (AMBIGUOUS and VIOLATED wait for a repair)",
            ["health"],
            registry=r,
        )
        self.duplicate_instance = Gauge(
            "reconciler_duplicate_instance",
            "1 while another live process holds this --instance-id and this one waits",
            registry=r,
        )
        self.duplicate_detections = Counter(
            "reconciler_duplicate_instance_detections",
            "Looks before a rejoin that found another live process with this --instance-id",
            registry=r,
        )
        self._zero_known_series()
        self.is_ready = False
        self.restoring: tuple[int, ...] = ()  # partitions whose tasks restore; /readyz names them
        # Why the brokers refuse the engine's writes, while they do (engine/admin/isr_watch.py).
        self.writes_refused: str | None = None
        self.unready_reason = ""  # /readyz names it when set (duplicate.py)
        # /healthz: replaced by the engine with "the loop made progress recently".
        self.liveness: Callable[[], bool] = lambda: True
        self._last_lag = 0.0
        self._last_sessions = 0.0
        self.sessions_stale = False  # set by a commit; `maybe_observe_sessions` clears it
        # Per input the loop only tallies here (the fold step into these dicts directly);
        # `flush` publishes once per consumed batch (a labelled Counter costs a label lookup
        # and a lock per call).
        self.events_tally: dict[tuple[str, str], int] = {}
        self.decisions_tally: dict[tuple[Verdict, Reason, bool], int] = {}

    def _zero_known_series(self) -> None:
        """A series for every known label value from the start: `increase(...) > 0` then sees
        the first dead letter or alert too (a series born at 1 shows no increase)."""
        for dead_reason in [*DecodeReason, DEAD_LETTER_REFUSED]:
            self.dead_letters.labels(reason=dead_reason)
        for reason in Reason:
            self.alerts.labels(reason=reason)
        for kind in ABORT_KINDS:
            self.aborts.labels(kind=kind)
        for kind in ("assign", "revoke", "lost"):
            self.rebalances.labels(kind=kind)
        for health in Health:
            self.sessions_by_health.labels(health=health).set(0)
        for stage in STAGES:
            self.stage_seconds.labels(stage=stage)

    def observe_sessions(self, tasks: Iterable[_HasStore]) -> None:
        """Session count and sessions by health, from the local stores (after a commit)."""
        total, unhealthy = 0, {health: 0 for health in Health}
        for task in tasks:
            with detecting(task.partition):  # a full scan: it may find a corrupted page
                total += task.store.count()
                for health, count in task.store.health_summary().items():
                    if health in unhealthy:
                        unhealthy[Health(health)] += count
        self.sessions.set(total)
        for health in (Health.AMBIGUOUS, Health.VIOLATED):
            self.sessions_by_health.labels(health=health).set(unhealthy[health])
        clear = total - unhealthy[Health.AMBIGUOUS] - unhealthy[Health.VIOLATED]
        self.sessions_by_health.labels(health=Health.CLEAR).set(clear)

    def set_ready(self, ready: bool) -> None:
        self.is_ready = ready
        self.ready.set(1 if ready and not self.restoring else 0)

    def set_restoring(self, partitions: list[int]) -> None:
        """The partitions whose tasks restore (step A2): not ready while there are any."""
        self.restoring = tuple(partitions)
        self.set_ready(self.is_ready)

    def count_fold(self, topic: str, kind: str, decisions: Iterable[Decision]) -> None:
        """Tally one folded input and its decisions (published by `flush`)."""
        events = self.events_tally
        events[topic, kind] = events.get((topic, kind), 0) + 1
        self.count_decisions(decisions)

    def count_decisions(self, decisions: Iterable[Decision]) -> None:
        """Tally decisions that answer no input folded now (the watermark's final answers)."""
        tally = self.decisions_tally
        for decision in decisions:
            key = (decision.verdict, decision.reason, decision.alert)
            tally[key] = tally.get(key, 0) + 1

    def flush(self) -> None:
        """Publish the tallies of `count_fold` (once per consumed batch)."""
        for (topic, kind), count in self.events_tally.items():
            self.events.labels(topic=topic, kind=kind).inc(count)
        for (verdict, reason, alert), count in self.decisions_tally.items():
            self.decisions.labels(verdict=verdict, reason=reason).inc(count)
            if reason in (Reason.HELD_BY_OTHER, Reason.CHECKPOINT_ALREADY_RESUMED):
                self.lease_conflicts.inc(count)
            if reason is Reason.GATE_VIOLATION:
                self.gate_violations.inc(count)
            if alert:
                self.alerts.labels(reason=reason).inc(count)
        self.events_tally.clear()
        self.decisions_tally.clear()

    def observe_decision_latencies(self, now_ms: float, event_times_ms: Sequence[int]) -> None:
        """The decision latency of every input a commit answered, in one histogram update."""
        observe_many(self.decision_latency, [max(0.0, (now_ms - t) / 1000) for t in event_times_ms])

    def maybe_observe_sessions(self, tasks: Iterable[_HasStore]) -> None:
        """`observe_sessions` if a commit changed the stores, at most once a second."""
        now = time.monotonic()
        if not self.sessions_stale or now - self._last_sessions < SESSIONS_INTERVAL_S:
            return
        self._last_sessions = now
        self.sessions_stale = False
        self.observe_sessions(tasks)

    def maybe_observe_lag(
        self, consumer: ConsumerLike, tasks: Mapping[int, _HasStore], topics: Iterable[str]
    ) -> None:
        """Every few seconds: lag per input topic and pending writes from the local stores."""
        now = time.monotonic()
        if now - self._last_lag < LAG_INTERVAL_S or not tasks:
            return
        self._last_lag = now
        wanted = [TopicPartition(t, p) for p in tasks for t in topics]
        lag: dict[str, int] = {}
        ask_until = now + LAG_QUERY_BUDGET_S
        for tp in consumer.position(wanted):
            _, high = consumer.get_watermark_offsets(tp, cached=True) or (0, 0)
            if high < 0 and time.monotonic() < ask_until:
                # No fetch response cached yet for this partition (librdkafka answers -1001):
                # ask the broker, within a small budget so a slow broker cannot stall the loop.
                try:
                    _, high = consumer.get_watermark_offsets(tp, timeout=LAG_QUERY_TIMEOUT_S)
                except KafkaException:
                    high = -1
            if tp.offset >= 0 and high >= 0:
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, high - tp.offset)
        for topic, behind in lag.items():
            self.lag.labels(topic=topic).set(behind)
        summary: dict[str, tuple[int, int]] = {}
        for p, task in tasks.items():
            with detecting(p):
                for status, (count, oldest) in task.store.pending_summary().items():
                    prior = summary.get(status, (0, oldest))
                    summary[status] = (prior[0] + count, min(prior[1], oldest))
        self.pending_writes.clear()
        for status, (count, _) in summary.items():
            self.pending_writes.labels(state=status).set(count)
        oldest_ms = min((oldest for _, oldest in summary.values()), default=None)
        self.oldest_pending_age.set(
            0 if oldest_ms is None else max(0.0, time.time() - oldest_ms / 1000)
        )


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for each value, with one lock per bucket rather than two per
    value (prometheus_client has no batch call; a commit answers ~1,000 inputs). Same bucket
    rule: the first upper bound >= v. For an unlabelled histogram (or a `.labels()` child)."""
    if not values:
        return
    bounds = histogram._upper_bounds
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect_left(bounds, value)] += 1
    histogram._sum.inc(sum(values))
    for bucket, count in zip(histogram._buckets, counts, strict=True):
        if count:
            bucket.inc(count)
