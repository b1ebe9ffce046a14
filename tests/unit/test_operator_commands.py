"""`explain` and `repair` against brokers that are not there: exit 1, one line, no client noise.

The unreachable broker is a bound socket that never listens, so every connection is refused.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version

import pytest

from engine.cli import main

REFUSED_AFTER_S = 60  # a safety net for a hung command, not a measurement


@pytest.fixture
def dead_bootstrap() -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        timeout=REFUSED_AFTER_S,
        check=False,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["explain", "s1"],
        ["repair", "s1", "--resolution", "ABANDON", "--reason", "test", "--actor", "ops"],
    ],
)
def test_unreachable_brokers_end_in_one_line_and_exit_1(
    dead_bootstrap: str, command: list[str]
) -> None:
    done = _cli(*command, "--bootstrap-servers", dead_bootstrap, "--timeout", "1.5")
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"reconciler: no answer from the brokers at {dead_bootstrap}")
    assert "within 1.5 s" in lines[0]
    assert "Fix: check --bootstrap-servers" in lines[0]


def test_version_is_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"reconciler {version('reconciler')}"


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["repair", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 5.0)" in text  # --timeout
    assert "(default: 30.0)" in text  # --wait
    assert "default: 127.0.0.1:9092, or RECONCILER_BOOTSTRAP_SERVERS" in text
    assert "default: reconciler., or RECONCILER_TOPIC_PREFIX" in text
