"""The supervisor restarts a dead engine with a restart counter; the watchdog times only the
innermost step; /healthz follows loop progress. No Kafka, no sleeping on a clock."""

from __future__ import annotations

import logging
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine.runtime.process.health import serve_health
from engine.runtime.process.metrics import EngineMetrics
from engine.runtime.process.supervisor import RESTARTS_ENV, Backoff, supervise, supervise_all
from engine.runtime.process.watchdog import Expired, Watchdog

CHILD = """
import os, sys
from pathlib import Path
runs = Path(sys.argv[1])
seen = runs.read_text() if runs.exists() else ""
runs.write_text(seen + os.environ["{env}"] + ",")
sys.exit(int(sys.argv[2 + seen.count(",")]))
""".replace("{env}", RESTARTS_ENV)


def test_a_dying_child_is_restarted_with_a_counter_until_it_exits_0(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runs = tmp_path / "runs"
    command = [sys.executable, "-c", CHILD, str(runs), "75", "-9", "0"]
    with caplog.at_level(logging.INFO, logger="reconciler.supervisor"):
        assert supervise(command, backoff=Backoff(initial_s=0.0, max_s=0.0)) == 0
    assert runs.read_text() == "0,1,2,"
    assert "exited with 75" in caplog.text
    assert "restart #2" in caplog.text


def test_bad_settings_are_not_restarted(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    command = [sys.executable, "-c", CHILD, str(runs), "2", "0"]
    assert supervise(command, backoff=Backoff(initial_s=0.0, max_s=0.0)) == 2
    assert runs.read_text() == "0,"


def test_several_children_are_restarted_each_on_its_own(tmp_path: Path) -> None:
    first = [sys.executable, "-c", CHILD, str(tmp_path / "a"), "75", "75", "0"]
    second = [sys.executable, "-c", CHILD, str(tmp_path / "b"), "0"]
    assert supervise_all([first, second], backoff=Backoff(initial_s=0.0, max_s=0.0)) == 0
    assert (tmp_path / "a").read_text() == "0,1,2,"
    assert (tmp_path / "b").read_text() == "0,"


def test_several_children_report_the_first_that_failed_for_good(tmp_path: Path) -> None:
    good = [sys.executable, "-c", CHILD, str(tmp_path / "a"), "0"]
    bad = [sys.executable, "-c", CHILD, str(tmp_path / "b"), "2"]
    assert supervise_all([good, bad], backoff=Backoff(initial_s=0.0, max_s=0.0)) == 2


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(initial_s=0.5, max_s=4.0)
    assert [backoff.delay(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0]


def test_only_the_innermost_step_is_timed_and_its_end_restarts_the_outer_clock() -> None:
    now = [0.0]
    fired: list[Expired] = []
    watchdog = Watchdog(clock=lambda: now[0], on_expired=fired.append)
    with watchdog.guard("poll", 10.0, [1, 0]):
        with watchdog.guard("A1", 100.0, [0]):
            now[0] = 50.0
            assert watchdog.check() is None  # poll's 10 s do not run while A1 runs
            assert watchdog.current_step() == "A1"
        now[0] = 59.0
        assert watchdog.check() is None  # poll's clock restarted when A1 ended (at 50)
        now[0] = 61.0
        expired = watchdog.check()
    assert expired == Expired("poll", (0, 1), 11.0, 10.0)
    assert fired == [expired]
    assert "step poll blocked for 11.0s" in expired.describe()
    assert watchdog.check() is None  # fires once


def test_renew_restarts_the_step_clock() -> None:
    now = [0.0]
    watchdog = Watchdog(clock=lambda: now[0], on_expired=lambda e: None)
    with watchdog.guard("A2", 10.0):
        now[0] = 9.0
        watchdog.renew()
        now[0] = 18.0
        assert watchdog.check() is None
        now[0] = 19.5
        assert watchdog.check() is not None


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_healthz_follows_liveness_and_progress_is_exported() -> None:
    metrics = EngineMetrics()
    alive = [True]
    metrics.liveness = lambda: alive[0]
    server = serve_health(metrics, 0)
    port = server.server_address[1]
    try:
        assert _status(port, "/healthz") == 200
        alive[0] = False
        assert _status(port, "/healthz") == 503
        assert _status(port, "/readyz") == 503
    finally:
        server.shutdown()
    names = {m.name for m in metrics.registry.collect()}
    assert {"reconciler_last_progress_timestamp_seconds", "reconciler_engine_restarts"} <= names
