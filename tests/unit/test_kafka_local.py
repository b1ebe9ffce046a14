"""The local-broker tool fails with a cause and a fix (no broker started here)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tools import kafka_local


def test_port_in_use_from_environment_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv("RECONCILER_KAFKA_PORT", str(port))
        with pytest.raises(kafka_local.SetupError, match=r"in use.*Fix"):
            kafka_local.port_from_env("RECONCILER_KAFKA_PORT")


def test_non_numeric_port_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECONCILER_KAFKA_PORT", "kafka")
    with pytest.raises(kafka_local.SetupError, match="not a TCP port"):
        kafka_local.port_from_env("RECONCILER_KAFKA_PORT")


def test_missing_tool_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(kafka_local.SetupError, match=r"`java` was not found.*Fix"):
        kafka_local.require_tool("java", "install Java 17.")


def test_main_exits_2_on_setup_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kafka_local, "CACHE", tmp_path)
    monkeypatch.setenv("RECONCILER_KAFKA_PORT", "70000")
    monkeypatch.setattr(kafka_local, "read_info", lambda instance: None)
    monkeypatch.setattr(kafka_local, "ensure_jars", lambda: None)
    assert kafka_local.main(["start", "--instance", "unit-never-started"]) == 2
    assert "not a TCP port" in capsys.readouterr().err


def test_stale_pid_file_is_not_a_running_broker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(kafka_local, "CACHE", tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "broker.json").write_text(
        json.dumps({"pid": dead.pid, "port": 1, "controller_port": 2, "kafka_version": "4.1.1"})
    )
    assert kafka_local.read_info("old") is None
    (tmp_path / "old" / "broker.json").write_text(
        json.dumps({"pid": os.getpid(), "port": 1, "controller_port": 2, "kafka_version": "4.1.1"})
    )
    info = kafka_local.read_info("old")
    assert info is not None
    assert info.bootstrap == "127.0.0.1:1"


def test_a_cluster_id_never_starts_with_a_dash() -> None:
    dash_first = bytes([0xF8]) + bytes(15)  # top 6 bits 62: "-" in the URL-safe alphabet
    assert kafka_local.cluster_id_of(dash_first) is None, "kafka-storage would read it as an option"
    draws = iter([dash_first, dash_first, bytes(16)])
    assert kafka_local.new_cluster_id(lambda: next(draws)) == "A" * 22


def _in_memory_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The instance folders under tmp_path/kafka, the RAM root at tmp_path/shm."""
    monkeypatch.setattr(kafka_local, "CACHE", tmp_path / "kafka")
    monkeypatch.setattr(kafka_local, "MEMORY_ROOT", tmp_path / "shm")
    monkeypatch.setattr(kafka_local, "MEMORY_MIN_FREE_BYTES", 1)
    (tmp_path / "shm").mkdir()
    return tmp_path / "kafka" / "mem"


def test_in_memory_data_starts_empty_and_stop_frees_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = _in_memory_paths(monkeypatch, tmp_path)
    target = kafka_local.memory_dir("mem")
    target.mkdir(parents=True)
    (target / "stale-partition-0").mkdir()  # what an earlier run left behind
    home.mkdir(parents=True)
    kafka_local.put_data_in_memory("mem")
    assert (home / "data").is_symlink()
    assert (home / "data").resolve() == target.resolve()
    assert list(target.iterdir()) == [], "an in-memory broker starts from no data"
    (home / "data" / "topic-0").mkdir()
    kafka_local.stop("mem", keep_data=True)  # a restart keeps it
    assert (target / "topic-0").is_dir()
    kafka_local.stop("mem")  # no broker.json: not running, its RAM is freed all the same
    assert not target.exists()
    assert not (home / "data").exists()


def test_in_memory_without_room_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = _in_memory_paths(monkeypatch, tmp_path)
    home.mkdir(parents=True)
    monkeypatch.setattr(kafka_local, "MEMORY_MIN_FREE_BYTES", 1 << 60)
    with pytest.raises(kafka_local.SetupError, match=r"GiB free.*Fix: .*without --in-memory"):
        kafka_local.put_data_in_memory("mem")
    monkeypatch.setattr(kafka_local, "MEMORY_ROOT", tmp_path / "no-shm")
    with pytest.raises(kafka_local.SetupError, match=r"RAM-backed.*Fix"):
        kafka_local.put_data_in_memory("mem")
    assert not (home / "data").exists()
