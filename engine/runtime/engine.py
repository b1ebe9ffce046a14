"""The engine process: one consumer, one transactional producer, one task per partition.

`Engine` builds the parts once (`Parts`: settings, metrics, the assignment, the order buffer,
the step guards) and, per pair of clients, one `Loop` (loop.py) that composes the intake, the
fold, the committer (steps 3-6 around `Commit`, commit/) and the rebalance callbacks. This
file supervises: it creates the clients, rejoins with a backoff after a fatal error, and
stops. The clients come from a `ClientFactory` (fakes in the fault tests), and every call that
can block runs under the watchdog (`watchdog.py`).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from types import FrameType

from confluent_kafka import KafkaException

from engine import compiled
from engine.runtime.clients import ClientFactory, KafkaClients
from engine.runtime.commit.errors import AbortableError, RejoinError
from engine.runtime.commit.fencing import owner_metadata
from engine.runtime.commit.transaction import Transactions
from engine.runtime.intake.ingest import Ingest
from engine.runtime.intake.ordering import InputOrder
from engine.runtime.loop import Loop
from engine.runtime.parts import Consumed, Flags, Parts
from engine.runtime.process.collector import Collector
from engine.runtime.process.duplicate import DuplicateWatch, Holders, no_holders, other_holders
from engine.runtime.process.memory import Trimmer, tune_gc
from engine.runtime.process.metrics import EngineMetrics
from engine.runtime.process.steps import Steps
from engine.runtime.process.supervisor import Backoff
from engine.runtime.process.trace import LatencyTrace
from engine.runtime.process.watchdog import Watchdog
from engine.runtime.tasks.assignment import Assignment
from engine.runtime.tasks.state_codec import StateFormatError
from engine.runtime.tasks.task import PartitionTask
from engine.settings import Settings
from engine.wire import Codec
from engine.wire.registry import codec_for

log = logging.getLogger("reconciler.engine")
REJOIN_INITIAL_S = 0.5
"""The first pause before new clients rejoin; it doubles per rejoin that follows another with
no committed transaction in between, up to `rejoin_backoff_max_s`."""
PAUSE_SLICE_S = 0.2  # a pause checks for stop() this often (a signal handler cannot wake it)


class Engine:
    """Runs until `stop()` (or SIGTERM): consume, fold, produce, commit exactly once. It
    creates the clients, rejoins with a backoff after a fatal error, and stops."""

    def __init__(
        self,
        settings: Settings,
        *,
        codec: Codec | None = None,
        metrics: EngineMetrics | None = None,
        clients: ClientFactory | None = None,
        watchdog: Watchdog | None = None,
        pause: Callable[[float], None] | None = None,
        collector: Collector | None = None,
        holders: Holders | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or EngineMetrics()
        self.watchdog = watchdog or Watchdog()
        self.metrics.liveness = self.alive
        codec = codec or codec_for(settings.schema_registry_url, write_registry=False)
        self.owned = Assignment(settings.topics.inputs)
        self.owned.metadata = owner_metadata(settings)
        path = settings.latency_trace_path
        trace = LatencyTrace(path) if path is not None else None
        budget_s = settings.transaction_timeout_ms / 1000 + settings.watchdog_margin_s
        factory = clients or KafkaClients()
        self.parts = Parts(
            settings=settings,
            codec=codec,
            metrics=self.metrics,
            factory=factory,
            steps=Steps(self.watchdog, budget_s, self.metrics, trace, lambda: self.owned.tasks),
            ingest=Ingest(codec, settings.topics, settings.partitions),
            owned=self.owned,
            trimmer=Trimmer(settings.memory_trim_interval_s),
            trace=trace,
            collector=collector,  # the process's (collector.py); tests: none
        )
        self.flags: Flags = self.parts.flags
        self.backoff = Backoff(initial_s=REJOIN_INITIAL_S, max_s=settings.rejoin_backoff_max_s)
        self.pause = pause or self._pause_unless_stopped
        self.rejoins = 0  # rejoins in this process (the log's counter)
        self.loop: Loop | None = None  # the current clients' (None between them)
        # The lookup asks the clients' cluster; injected clients (the fault tests' fake broker)
        # have no coordinator to ask, and a real lookup there would wait out its timeout.
        default_holders = other_holders if clients is None else no_holders
        self.duplicates = DuplicateWatch(
            settings, self.parts.joined, self.metrics, self.pause, holders or default_holders
        )

    @property
    def tasks(self) -> dict[int, PartitionTask]:
        return self.owned.tasks

    @property
    def order(self) -> InputOrder[Consumed]:
        return self.parts.order

    @property
    def trace(self) -> LatencyTrace | None:
        return self.parts.trace

    @property
    def transactions(self) -> Transactions | None:
        """The current producer's commits (None between clients)."""
        return self.loop.txns if self.loop is not None else None

    def stop(self) -> None:
        self.flags.stopping = True

    def alive(self) -> bool:
        """Liveness: the loop completed an iteration within `liveness_timeout_s`."""
        return self.watchdog.since_progress_s() <= self.settings.liveness_timeout_s

    def tune_gc(self) -> None:
        """How often the process's cycle collector scans new objects (settings.gc_gen0_threshold;
        what stays alive is frozen after each commit by collector.py): `reconciler run` calls it,
        an engine embedded in another process (tests, the demo) leaves that process's be."""
        tune_gc(self.settings.gc_gen0_threshold)

    def install_signal_handlers(self) -> None:
        def on_term(signum: int, frame: FrameType | None) -> None:
            if self.flags.stopping:
                log.warning("second signal %s: exiting at once", signum)
                os._exit(128 + signum)  # the open transaction is aborted by the next start
            log.info("signal %s: draining, committing and leaving the group", signum)
            self.flags.stopping = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack

    def run(self) -> None:
        """The outer loop: a fatal error recreates the clients and rejoins, backing off while
        rejoins fail in a row; stop() ends it."""
        # A wheel or image without the extensions runs the sources at about twice the CPU.
        log.info("hot path: %s (engine/compiled.py)", compiled.mode())
        flags = self.flags
        failures = 0  # rejoins in a row with no committed transaction in between
        while not flags.stopping:
            if failures:
                self._back_off(failures)
                # another live process with our instance id: wait it out, not fence it again
                self.duplicates.wait_out(lambda: flags.stopping)
                if flags.stopping:
                    break
            self.parts.steps.progress()  # trying to start counts: a restart is no sooner
            flags.committed_since_rejoin = False
            # a callback's request that the old clients never got to act on (an exception
            # left the loop first) is not the new clients' business
            flags.rejoin_requested = False
            try:
                loop = self._create_clients()
            except (KafkaException, RejoinError, AbortableError) as exc:
                log.error("cannot start the Kafka clients: %s", exc)
                failures += 1
                continue
            if not self._run_clients(loop):
                failures = 1 if flags.committed_since_rejoin else failures + 1
        self.metrics.set_ready(False)

    def _run_clients(self, loop: Loop) -> bool:
        """One pair of clients until stop() (True) or a fatal error (False)."""
        try:
            loop.run()
            loop.committer.commit()  # stop requested: drain (steps 3-6), then leave
            if loop.txns.open:
                log.warning("shutdown: last transaction aborted; its inputs are read again")
            return True
        except (RejoinError, KafkaException, TimeoutError) as exc:
            # Fatal or unclassified (librdkafka: treat as fatal), or a restore that could not
            # finish: drop every task and rejoin with new clients.
            self.metrics.aborts.labels(kind="fatal").inc()
            log.error("fatal Kafka error, recreating clients and rejoining: %s", exc)
            loop.committer.drop_all()
        except (StateFormatError, sqlite3.Error) as exc:
            # Unreadable state or a failing local disk: not Kafka's fault. Stay up (metrics,
            # probes) and rejoin after the backoff: at once would fail the same way.
            self.metrics.aborts.labels(kind="state").inc()
            log.error("local state failure, rejoining: %s", exc)
            loop.committer.drop_all()
        finally:
            self._close(loop)
        return False

    def _back_off(self, failures: int) -> None:
        delay = self.backoff.delay(failures)
        self.rejoins += 1
        self.metrics.rejoins.inc()
        log.error(
            "rejoin #%d (%d in a row without a commit) in %.1fs",
            self.rejoins,
            failures,
            delay,
        )
        self.pause(delay)

    def _pause_unless_stopped(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while not self.flags.stopping and (left := until - time.monotonic()) > 0:
            self.parts.steps.progress()  # waiting on purpose is not a hang: liveness stays up
            time.sleep(min(PAUSE_SLICE_S, left))

    def _create_clients(self) -> Loop:
        settings, factory, steps = self.settings, self.parts.factory, self.parts.steps
        txns = Transactions(factory.producer(settings), self.watchdog, steps.budget_s)
        txns.init()
        consumer = factory.consumer(settings)
        loop = Loop(self.parts, consumer, txns)
        consumer.subscribe(
            list(settings.topics.inputs),
            on_assign=loop.rebalance.on_assign,
            on_revoke=loop.rebalance.on_revoke,
            on_lost=loop.rebalance.on_lost,
        )
        self.loop, self.parts.consumer = loop, consumer
        return loop

    def _close(self, loop: Loop) -> None:
        self.loop, self.parts.consumer = None, None
        try:
            loop.restorer.close()  # RESTORING tasks close, the changelog reader with them
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the changelog reader failed: %s", exc)
        self.parts.joined.note(loop.intake.consumer)  # the duplicate check's, after a close
        try:
            with self.watchdog.guard("close consumer", self.parts.steps.budget_s):
                loop.intake.consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer failed: %s", exc)
        loop.txns.close()
