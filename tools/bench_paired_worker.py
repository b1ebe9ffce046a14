"""One commit's side of tools/bench_paired.py: that commit's bench generator and engine.

Not run from this clone: tools/bench_paired.py starts it as ``python -c <this file's text>``
with the python of another commit's build and that build's source folder as the working
directory, so every `tools.*` and `engine.*` import below is that commit's own. It therefore uses
only what `make bench`'s throughput run has offered since before the runtime's redesign:
`tools.bench_fold.build_log`, `tools.bench_kafka.encode_inputs` and
`tools.bench_engine.run_system`.

Protocol, one JSON document per line: argv[1] holds the settings (sessions, partitions,
commit_ms, timeout); the worker builds and encodes the input once and writes
``{"ready": {...}}`` (what the workload is: counts, schema versions, sizes, a digest of the event
ids); then for each line ``{"bootstrap": "host:port"}`` on stdin it runs the engine once on
fresh topics and writes ``{"run": {...}}`` or ``{"failed": "why"}``. It ends at end of input.
Everything else it or its libraries print goes to stderr (the run's log).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import traceback
from collections import Counter, defaultdict
from typing import Any


def _schema_versions(data_by_kind: dict[str, bytes]) -> dict[str, str]:
    """The schema version each kind's first record was written with, from its header."""
    try:
        from engine.wire.schema_store import SHIPPED_SCHEMAS

        by_fingerprint = SHIPPED_SCHEMAS.by_fingerprint
    except Exception:  # an older layout: the versions are then unknown, not a failure
        return {kind: "?" for kind in data_by_kind}
    found: dict[str, str] = {}
    for kind, data in data_by_kind.items():
        schema = by_fingerprint.get(bytes(data[2:10]))
        found[kind] = f"v{schema.version}" if schema is not None else "?"
    return found


def describe(inputs: list[Any]) -> dict[str, Any]:
    """What the encoded workload is, for the comparison table."""
    kinds: Counter[str] = Counter()
    sizes: dict[str, list[int]] = defaultdict(list)
    first: dict[str, bytes] = {}
    ids = hashlib.sha256()
    for record in inputs:
        kind = str(getattr(record.kind, "value", record.kind))
        kinds[kind] += 1
        sizes[kind].append(len(record.value))
        first.setdefault(kind, record.value)
        ids.update(f"{kind}\t{record.event_id}\n".encode())
    from engine import compiled

    return {
        "inputs": len(inputs),
        "kinds": dict(sorted(kinds.items())),
        "bytes": {k: statistics.fmean(v) for k, v in sorted(sizes.items())},
        "versions": dict(sorted(_schema_versions(first).items())),
        "events_sha256": ids.hexdigest()[:12],
        "mode": compiled.mode(),
    }


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a stray print, here or in a child, goes to the log, not into the protocol
    sys.stdout = sys.stderr
    settings = json.loads(sys.argv[1])
    from tools.bench_engine import ONE, run_system
    from tools.bench_fold import build_log
    from tools.bench_kafka import encode_inputs

    inputs = encode_inputs(build_log(settings["sessions"]))
    protocol.write(json.dumps({"ready": describe(inputs)}) + "\n")
    for line in sys.stdin:
        args = argparse.Namespace(
            bootstrap_servers=json.loads(line)["bootstrap"],
            partitions=settings["partitions"],
            commit_ms=settings["commit_ms"],
            timeout=settings["timeout"],
        )
        try:
            run = run_system(ONE, args, inputs)
        except Exception:
            traceback.print_exc()
            reply: dict[str, Any] = {"failed": traceback.format_exc(limit=1).strip()[-300:]}
        else:
            if run is None:
                reply = {"failed": f"not every input answered within {args.timeout:.0f} s"}
            else:
                reply = {
                    "run": {
                        "rate": run.rate,
                        "cpu_us": run.cpu_us,
                        "launch_rate": run.launch_rate,
                        "decisions_per_input": run.decisions_per_input,
                    }
                }
        protocol.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
