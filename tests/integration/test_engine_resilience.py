"""Rebalances and a broker restart under load keep exactly-once (see exactly_once.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from engine.core.events import Event
from engine.settings import Settings
from tests.integration.engine_harness import EngineProcess, engine_settings, produce, read_decisions
from tests.integration.exactly_once import assert_exactly_once, read_inputs, workload
from tools import kafka_local

pytestmark = pytest.mark.kafka


def _steady_load(
    bootstrap: str, settings: Settings, events: list[Event], chunks: int, pause_s: float
) -> threading.Thread:
    def load() -> None:
        size = max(1, len(events) // chunks)
        for start in range(0, len(events), size):
            for _attempt in range(60):  # the broker may be restarting
                try:
                    produce(bootstrap, settings, events[start : start + size])
                    break
                except AssertionError:
                    time.sleep(1)
            time.sleep(pause_s)

    thread = threading.Thread(target=load)
    thread.start()
    return thread


def test_three_engines_one_killed_one_added(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    base = engine_settings(kafka_bootstrap, unique_name, tmp_path / "unused")
    engines = [
        EngineProcess(
            base.model_copy(
                update={"instance_id": f"engine-{i}", "state_dir": tmp_path / f"pod-{i}"}
            ),
            tmp_path / f"engine-{i}.log",
        )
        for i in range(4)
    ]
    events = workload(240, seed=11)
    for engine in engines[:3]:
        engine.start()
    load = _steady_load(kafka_bootstrap, base, events, chunks=30, pause_s=0.4)
    try:
        time.sleep(5)
        engines[1].kill_all()  # the pod is gone: its partitions move once its session times out
        time.sleep(3)
        engines[3].start()  # a new member joins: another rebalance
        load.join()
        seen = read_decisions(kafka_bootstrap, base, until=len(events), timeout_s=180)
        for engine in (engines[0], engines[2], engines[3]):
            assert engine.terminate() == 0
    finally:
        for engine in engines:
            if engine.alive():
                engine.kill_all()
        load.join()
    assert_exactly_once(events, seen, read_inputs(kafka_bootstrap, base))
    logs = [(tmp_path / f"engine-{i}.log").read_text() for i in (0, 2, 3)]
    assert any("step A2" in log for log in logs[2:]), "the added engine never took a partition"


def test_broker_restart_under_load(
    kafka_bootstrap: str, kafka_instance: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(kafka_bootstrap, unique_name, tmp_path / "state")
    events = workload(120, seed=23)
    engine = EngineProcess(settings, tmp_path / "engine.log").start()
    load = _steady_load(kafka_bootstrap, settings, events, chunks=20, pause_s=0.3)
    try:
        time.sleep(3)
        kafka_local.restart(kafka_instance)
        load.join()
        seen = read_decisions(kafka_bootstrap, settings, until=len(events), timeout_s=240)
        assert engine.alive(), "the engine must survive a broker restart on its own"
        assert engine.terminate() == 0
    finally:
        if engine.alive():
            engine.kill_all()
        load.join()
    assert_exactly_once(events, seen, read_inputs(kafka_bootstrap, settings))
