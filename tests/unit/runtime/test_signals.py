"""SIGTERM drains (the loop sees `stop`), a second SIGTERM exits at once with 143."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

SCRIPT = """
import os, signal, time
from engine.runtime.engine import Engine
from engine.settings import load_settings
engine = Engine(load_settings(environ={}, metrics_port=0))
engine.install_signal_handlers()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print("stopping" if engine.flags.stopping else "running", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
print("still alive", flush=True)
"""


def test_first_sigterm_drains_second_exits_at_once() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.splitlines() == ["stopping"]
    assert done.returncode == 143
