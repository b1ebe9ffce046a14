"""kill -9 the engine at random points under load; after restarts every input has exactly one
decision, none lost, none duplicated, equal to a replay through the pure fold.

`make test` runs a few kills; `make soak` sets RECONCILER_SOAK_KILLS for the long loop.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from tests.integration.engine_harness import (
    EngineProcess,
    engine_settings,
    produce,
    read_decisions,
)
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload

pytestmark = pytest.mark.kafka

KILLS = int(os.environ.get("RECONCILER_SOAK_KILLS", "3"))
SESSIONS = int(os.environ.get("RECONCILER_SOAK_SESSIONS", "150"))


# The soak's size scales its run time (about 3 s per kill); `make test`'s 3 kills keep the default.
@pytest.mark.timeout(max(300, 120 + 6 * KILLS))
def test_kill_9_under_load_keeps_exactly_once(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    events = workload(SESSIONS * max(1, KILLS // 3), seed=KILLS)
    rng = random.Random(7)
    engine = EngineProcess(settings, tmp_path / "engine.log").start()

    def load() -> None:  # a steady stream for as long as the kills go on
        chunk = max(1, len(events) // (KILLS * 4 + 4))
        for start in range(0, len(events), chunk):
            produce(kafka_bootstrap, settings, events[start : start + chunk])
            time.sleep(0.25)

    producer = threading.Thread(target=load)
    producer.start()
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.0, 4.0))  # the engine takes ~2 s to start: some kills
            # land during start-up or restore, most while it folds and commits
            engine.kill()  # the supervisor restarts it, as the pod would
        producer.join()
        seen = read_decisions(
            kafka_bootstrap, settings, until=len(events), timeout_s=180, inputs=True
        )
        assert engine.terminate() == 0, "SIGTERM must drain and exit 0"
    finally:
        if engine.alive():
            engine.kill_all()
        producer.join()
    inputs = read_inputs(kafka_bootstrap, settings)
    assert len(inputs) == len(events)
    assert_exactly_once(events, seen, inputs)
    log = (tmp_path / "engine.log").read_text()
    assert log.count("step A2") >= 2, "no restart got as far as restoring its state"
