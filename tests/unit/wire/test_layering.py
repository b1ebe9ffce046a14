"""``engine.wire`` is imported by runner libraries: it must stay free of runtime imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROBE = """
import json, sys
import engine.wire
print(json.dumps(sorted(sys.modules)))
"""


def test_importing_engine_wire_pulls_in_no_kafka_client_registry_or_runtime() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = json.loads(result.stdout)
    forbidden = [
        name
        for name in loaded
        if name.startswith(("confluent_kafka", "agents", "engine.runtime", "httpx", "authlib"))
    ]
    assert forbidden == []
