"""The engine process: one consumer, one transactional producer, one task per partition.

The loop follows COMMIT_PROTOCOL.md step by step: steps 1-6 in `commit_loop.py`, A1-A3,
revoke and lost in `rebalance.py`, the shared state in `engine_state.py`; this file supervises.
`Step` names appear in the logs. The clients come from a `ClientFactory` (fakes in the fault
tests), the transaction's states and error classes live in `transaction.py`, what this process
owns in `assignment.py`, and every call that can block runs under the watchdog (`watchdog.py`).
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
from engine.runtime.clients import ClientFactory, ConsumerLike
from engine.runtime.collector import Collector
from engine.runtime.commit.errors import AbortableError, RejoinError
from engine.runtime.commit.transaction import Transactions
from engine.runtime.fencing import owner_metadata
from engine.runtime.memory import tune_gc
from engine.runtime.metrics import EngineMetrics
from engine.runtime.rebalance import Rebalancing
from engine.runtime.state_codec import StateFormatError
from engine.runtime.supervisor import Backoff
from engine.runtime.watchdog import Watchdog
from engine.settings import Settings
from engine.wire import Codec

log = logging.getLogger("reconciler.engine")
REJOIN_INITIAL_S = 0.5
"""The first pause before new clients rejoin; it doubles per rejoin that follows another with
no committed transaction in between, up to `rejoin_backoff_max_s`."""
PAUSE_SLICE_S = 0.2  # a pause checks for stop() this often (a signal handler cannot wake it)


class Engine(Rebalancing):
    """Runs until `stop()` (or SIGTERM): consume, fold, produce, commit exactly once. This part
    supervises: it creates the clients, rejoins with a backoff after a fatal error, and stops."""

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
    ) -> None:
        super().__init__(settings, codec=codec, metrics=metrics, clients=clients, watchdog=watchdog)
        self.collector = collector
        self.backoff = Backoff(initial_s=REJOIN_INITIAL_S, max_s=settings.rejoin_backoff_max_s)
        self.pause = pause or self._pause_unless_stopped
        self.rejoins = 0  # rejoins in this process (the log's counter)
        self.owned.metadata = owner_metadata(settings)

    def tune_gc(self) -> None:
        """How often the process's cycle collector scans new objects (settings.gc_gen0_threshold;
        what stays alive is frozen after each commit by collector.py): `reconciler run` calls it,
        an engine embedded in another process (tests, the demo) leaves that process's be."""
        tune_gc(self.settings.gc_gen0_threshold)

    def install_signal_handlers(self) -> None:
        def on_term(signum: int, frame: FrameType | None) -> None:
            if self._stopping:
                log.warning("second signal %s: exiting at once", signum)
                os._exit(128 + signum)  # the open transaction is aborted by the next start
            log.info("signal %s: draining, committing and leaving the group", signum)
            self._stopping = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack

    def run(self) -> None:
        """The outer loop: a fatal error recreates the clients and rejoins, backing off while
        rejoins fail in a row; stop() ends it."""
        # A wheel or image without the extensions runs the sources at about twice the CPU.
        log.info("hot path: %s (engine/compiled.py)", compiled.mode())
        failures = 0  # rejoins in a row with no committed transaction in between
        while not self._stopping:
            if failures:
                self._back_off(failures)
                if self._stopping:
                    break
            self._progress()  # trying to start counts: a restart would not reach Kafka sooner
            self._committed_since_rejoin = False
            # a callback's request that the old clients never got to act on (an exception
            # left the loop first) is not the new clients' business
            self._rejoin_requested = False
            try:
                consumer, txn = self._create_clients()
            except (KafkaException, RejoinError, AbortableError) as exc:
                log.error("cannot start the Kafka clients: %s", exc)
                failures += 1
                continue
            self._consumer, self._txn = consumer, txn
            failed = True
            try:
                self._loop(consumer, txn)
                self._commit(txn)  # stop requested: drain (steps 3-6), then leave
                if txn.open:
                    log.warning("shutdown: last transaction aborted; its inputs are read again")
                failed = False
            except (RejoinError, KafkaException, TimeoutError) as exc:
                # Fatal or unclassified (librdkafka: treat as fatal), or a restore that could not
                # finish: drop every task and rejoin with new clients.
                self.metrics.aborts.labels(kind="fatal").inc()
                log.error("fatal Kafka error, recreating clients and rejoining: %s", exc)
                self._drop_all_tasks()
            except (StateFormatError, sqlite3.Error) as exc:
                # Unreadable state or a failing local disk: not Kafka's fault. Stay up (metrics,
                # probes) and rejoin after the backoff: at once would fail the same way.
                self.metrics.aborts.labels(kind="state").inc()
                log.error("local state failure, rejoining: %s", exc)
                self._drop_all_tasks()
            finally:
                self._close(consumer, txn)
                self._consumer, self._txn = None, None
            if failed:
                failures = 1 if self._committed_since_rejoin else failures + 1
        self.metrics.set_ready(False)

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
        while not self._stopping and (left := until - time.monotonic()) > 0:
            self._progress()  # waiting on purpose is not a hang: liveness stays up
            time.sleep(min(PAUSE_SLICE_S, left))

    def _create_clients(self) -> tuple[ConsumerLike, Transactions]:
        txn = Transactions(self.factory.producer(self.settings), self.watchdog, self.budget_s)
        txn.init()
        consumer = self.factory.consumer(self.settings)
        consumer.subscribe(
            list(self.topics.inputs),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        return consumer, txn

    def _close(self, consumer: ConsumerLike, txn: Transactions) -> None:
        try:
            with self.watchdog.guard("close consumer", self.budget_s):
                consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer failed: %s", exc)
        txn.close()
