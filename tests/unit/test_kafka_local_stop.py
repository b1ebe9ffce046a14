"""`kafka_local stop` signals only the broker it started: after a reboot the pid in broker.json
may belong to an unrelated process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import kafka_local


def _write_info(home: Path, pid: int) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "broker.json").write_text(
        json.dumps({"pid": pid, "port": 1, "controller_port": 2, "kafka_version": "4.1.1"})
    )


def _sleeper(*extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", *extra], start_new_session=True
    )
    # Right after exec the kernel can show an empty command line for a moment.
    for _ in range(1000):
        if Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            break
        time.sleep(0.01)
    return proc


def test_stop_leaves_an_unrelated_process_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(kafka_local, "CACHE", tmp_path)
    stranger = _sleeper()
    try:
        _write_info(tmp_path / "rebooted", stranger.pid)
        kafka_local.stop("rebooted")
        assert stranger.poll() is None, "an unrelated process was signalled"
        assert not (tmp_path / "rebooted" / "broker.json").exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_stop_signals_the_broker_of_this_instance(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(kafka_local, "CACHE", tmp_path)
    props = kafka_local.instance_dir("mine") / "server.properties"
    broker = _sleeper("kafka.Kafka", str(props))  # the command line `start` runs names both
    try:
        _write_info(tmp_path / "mine", broker.pid)
        assert kafka_local.is_our_broker(broker.pid, "mine")
        assert not kafka_local.is_our_broker(broker.pid, "other")
        kafka_local.stop("mine")
        assert broker.wait(timeout=30) != 0
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
