"""A Kafka call that never returns: /healthz fails, the watchdog ends the engine with exit 75
(logging the step and every thread's stack), the supervisor of `reconciler run` restarts it and
decisions resume, exactly once.

The hang is injected from outside the engine: a `sitecustomize` on the child's PYTHONPATH wraps
the real producer so that the first `send_offsets_to_transaction` of the first process blocks
forever (librdkafka behaves like this when the group coordinator goes away:
https://github.com/confluentinc/librdkafka/issues/5456).
"""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.engine_harness import EngineProcess, engine_settings, produce, read_decisions
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload

pytestmark = pytest.mark.kafka

HANG = """
import os
import threading
from pathlib import Path

MARKER = os.environ.get("RECONCILER_TEST_HANG_MARKER")
if MARKER:
    from engine.runtime import clients

    real = clients.KafkaClients.producer

    class Hanging:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def send_offsets_to_transaction(self, *args, **kwargs):
            if not Path(MARKER).exists():
                Path(MARKER).write_text(str(os.getpid()))
                threading.Event().wait()
            return self.inner.send_offsets_to_transaction(*args, **kwargs)

    clients.KafkaClients.producer = lambda self, settings: Hanging(real(self, settings))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""  # between two engine processes nothing listens


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not seen within {timeout_s:.0f}s")


def test_a_hung_call_is_cut_restarted_and_decisions_resume(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    port = _free_port()
    settings = engine_settings(
        kafka_bootstrap,
        unique_name,
        tmp_path / "state",
        metrics_port=port,
        watchdog_margin_s=5.0,  # budget: transaction timeout (10 s) + 5 s
        liveness_timeout_s=3.0,
    )
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(HANG)
    marker = tmp_path / "hung"
    env = {
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "inject"), os.environ.get("PYTHONPATH", "")]),
        "RECONCILER_TEST_HANG_MARKER": str(marker),
    }
    log_path = tmp_path / "engine.log"
    events = workload(40, seed=31)
    engine = EngineProcess(settings, log_path, extra_env=env).start()
    try:
        produce(kafka_bootstrap, settings, events[:60])
        _wait_for("the injected hang", marker.exists, 120)
        hung_pid = int(marker.read_text())
        _wait_for("/healthz failing while stuck", lambda: _get(port, "/healthz")[0] == 503, 12)
        _wait_for("a new engine", lambda: engine.engine_pid() != hung_pid, 60)
        produce(kafka_bootstrap, settings, events[60:])
        seen = read_decisions(
            kafka_bootstrap, settings, until=len(events), timeout_s=120, inputs=True
        )
        assert _get(port, "/healthz")[0] == 200
        metrics = _get(port, "/metrics")[1]
        assert "reconciler_engine_restarts_total 1.0" in metrics
        assert engine.terminate() == 0
    finally:
        if engine.alive():
            engine.kill_all()
    log = log_path.read_text()
    assert "watchdog: step 4 send_offsets blocked" in log
    assert "--- thread MainThread" in log, "every thread's stack is logged"
    assert f"engine pid {hung_pid} exited with 75" in log
    assert "restart #1" in log
    assert_exactly_once(events, seen, read_inputs(kafka_bootstrap, settings))
