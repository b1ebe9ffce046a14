"""Where `reconciler run` spends its CPU on the throughput bench's input (not a test).

Pre-produces tools/bench_fold.py's mix into fresh topics, starts `reconciler run` as `make
bench` does, and prints CPU per input answered (between the first and the last answer) of the
engine processes, the broker JVM and the answer counter. With `--py-spy PATH` (py-spy is not a
project dependency: `pip install py-spy` anywhere) it also samples the engine and prints the
share of each step of the loop, e.g.

    flock /tmp/reconciler-kafka.lock .venv/bin/python -m tools.profile_engine \\
        --bootstrap-servers 127.0.0.1:9092 --sessions 20000 --py-spy /path/to/py-spy

The breakdown is of samples in `Engine._loop` (wall time of the loop thread, which on a
loaded machine includes time waiting for a core), by callee, `--depth` frames deep.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from tools.bench_fold import build_log
from tools.bench_kafka import (
    AnswerCounter,
    CpuSampler,
    broker_pid,
    cpu_s,
    encode_inputs,
    fresh_settings,
    produce_inputs,
    start_engine,
    stop,
    tree_cpu_s,
)

LOOP_FRAME = "Loop.run (loop.py)"  # py-spy names a method by its qualname
_FRAME = re.compile(r" \((?:.*/)?([^/]*?):\d+\)$")


def breakdown(raw: Path, root: str = LOOP_FRAME, depth: int = 1) -> tuple[int, Counter[str]]:
    """Samples under `root` in py-spy's raw (collapsed) output, by the callee path below it."""
    shares: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_FRAME.sub(r" (\1)", frame) for frame in stack.split(";")]
        if root not in frames:
            continue
        at = frames.index(root)
        total += int(count)
        shares[" > ".join(frames[at + 1 : at + 1 + depth]) or "<self>"] += int(count)
    return total, shares


STAGE_SUM = re.compile(r'^reconciler_stage_seconds_sum\{stage="([a-z_]+)"\} (\S+)$', re.M)


def stage_seconds(port: int) -> dict[str, float]:
    """Loop wall time per stage so far (`reconciler_stage_seconds`), from the engine's metrics
    endpoint; empty if it cannot be read."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    return {stage: float(value) for stage, value in STAGE_SUM.findall(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--py-spy", help="path of a py-spy binary: sample the engine too")
    parser.add_argument("--out", default="", help="py-spy raw output (default: a temp file)")
    parser.add_argument("--depth", type=int, default=1)
    args = parser.parse_args()

    inputs = encode_inputs(build_log(args.sessions))
    settings = fresh_settings(args.bootstrap_servers, 6, 100)
    produce_inputs(settings, inputs)
    log = Path(tempfile.mkdtemp(prefix="profile-log-")) / "engine.log"
    counter = AnswerCounter(settings, {i.event_id for i in inputs}, fetch_wait_ms=100).start()
    broker = broker_pid(settings.bootstrap_servers)
    broker_cpu = CpuSampler(lambda: cpu_s(broker) if broker else 0.0).start()
    client_cpu = CpuSampler(lambda: cpu_s(os.getpid(), reaped=False)).start()
    proc = start_engine(settings, log, processes=args.processes)
    engine_cpu = CpuSampler(lambda: tree_cpu_s(proc.pid)).start()
    raw = Path(args.out or tempfile.mkstemp(prefix="py-spy-", suffix=".txt")[1])
    spy = None
    if args.py_spy:
        time.sleep(0.3)  # the supervisor has started its engine child
        command = [args.py_spy, "record", "--subprocesses", "-r", "200", "-f", "raw"]
        spy = subprocess.Popen(
            [*command, "-o", str(raw), "-p", str(proc.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    answered = counter.wait(600)
    for sampler in (engine_cpu, broker_cpu, client_cpu):
        sampler.stop()
    stages = stage_seconds(settings.metrics_port) if args.processes == 1 else {}
    stop(proc)
    if spy is not None:
        spy.wait(60)
    if not answered:
        raise SystemExit(f"not every input was answered within 600 s; see {log}")
    steady = max(1, len(inputs) - counter.first_batch)

    def per_input(sampler: CpuSampler) -> float:
        return (sampler.at(counter.done_at) - sampler.at(counter.first_at)) / steady * 1e6

    print(
        f"{len(inputs):,} inputs, {args.processes} engine process(es): {counter.rate():,.0f} "
        f"inputs/s; CPU us/input: engine {per_input(engine_cpu):.0f}, broker "
        f"{per_input(broker_cpu):.0f}, bench client {per_input(client_cpu):.0f}; "
        f"decisions/input {counter.decisions / len(inputs):.3f}"
    )
    if stages:  # since the start, idle consume waits included
        waited = ", ".join(f"{k} {v * 1e6 / len(inputs):.0f}" for k, v in sorted(stages.items()))
        print(f"loop wall us/input by stage: {waited}")
    if spy is not None:
        total, shares = breakdown(raw, depth=args.depth)
        print(f"py-spy: {total} samples in {LOOP_FRAME} ({raw})")
        for name, count in shares.most_common(25):
            print(f"  {100 * count / max(1, total):5.1f}%  {name}")


if __name__ == "__main__":
    main()
