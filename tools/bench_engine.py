"""`make bench`: one table from one run against the local broker; prints figures, asserts nothing.

1. throughput, rounds interleaved (pipe, reconciler x1, reconciler x2, Quix, then again), each
   system on the same pre-produced input (tools/bench_fold.py's mix) in fresh topics: inputs
   answered per second, each input counted once, at its final answer, by the bench client;
   median and range over rounds, and ratios taken within each round;
2. resume-to-decision latency at two resume rates (tools/bench_latency.py);
3. RSS, restart and restore at 200,000 sessions, a cold restore of 1,000,000, and failover
   when one of three instances is killed (tools/bench_restore.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import bench_latency, bench_restore
from tools.bench_fold import build_log
from tools.bench_kafka import (
    REPO,
    AnswerCounter,
    Input,
    encode_inputs,
    fresh_settings,
    produce_inputs,
    start,
    start_engine,
    stop,
)

PIPE, ONE, TWO, QUIX = "raw EOS pipe", "reconciler run", "reconciler run --processes 2", "Quix"
SYSTEMS = (PIPE, ONE, TWO, QUIX)


@dataclass(frozen=True)
class Run:
    """One system in one round. `rate`: inputs answered per second once answers flow
    (AnswerCounter.rate); `launch_rate`: all inputs / time from the process launch to the last
    final answer (start-up included)."""

    rate: float
    launch_rate: float
    cpu_us: float
    decisions_per_input: float


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_system(system: str, args: argparse.Namespace, inputs: Sequence[Input]) -> Run | None:
    settings = fresh_settings(args.bootstrap_servers, args.partitions, args.commit_ms)
    produce_inputs(settings, inputs)
    log = Path(tempfile.mkdtemp(prefix="bench-log-")) / "system.log"
    flags = [
        "--bootstrap-servers",
        settings.bootstrap_servers,
        "--topic-prefix",
        settings.topic_prefix,
        "--commit-ms",
        str(args.commit_ms),
    ]
    counter = AnswerCounter(
        settings, {i.event_id for i in inputs}, count_records=system == PIPE
    ).start()
    cpu_before, launched = _cpu_children(), time.monotonic()
    if system == PIPE:
        proc = start([sys.executable, "-m", "tools.bench_pipe", *flags], log)
    elif system == QUIX:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = start([args.quix_python, "-m", "tools.bench_quix", *flags], log, env)
    else:
        proc = start_engine(settings, log, processes=2 if system == TWO else 1)
    answered = counter.wait(args.timeout)
    stop(proc)
    cpu = _cpu_children() - cpu_before
    if not answered:
        print(f"  {system}: not every input answered within {args.timeout:.0f} s; see {log}")
        return None
    n = len(inputs)
    return Run(
        rate=counter.rate(),
        launch_rate=n / (counter.done_at - launched),
        cpu_us=cpu / n * 1e6,
        decisions_per_input=counter.decisions / n,
    )


def _spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def _int(value: float) -> str:
    return f"{value:,.0f}"


def _ratio(value: float) -> str:
    return f"{value:.2f}"


def throughput(args: argparse.Namespace) -> None:
    events = build_log(args.sessions)
    inputs = encode_inputs(events)
    systems = [s for s in SYSTEMS if s != QUIX or Path(args.quix_python).exists()]
    print(
        f"throughput: {len(inputs):,} inputs ({args.sessions:,} sessions, tools/bench_fold.py "
        f"mix), {args.partitions} partitions, commit every {args.commit_ms} ms, exactly-once, "
        f"{args.rounds} rounds interleaved"
    )
    if QUIX not in systems:
        print(f"  (no Quix: {args.quix_python} does not exist; `make bench` creates it)")
    runs: dict[str, list[Run | None]] = {s: [] for s in systems}
    for round_no in range(args.rounds):
        for system in systems:
            run = run_system(system, args, inputs)
            runs[system].append(run)
            shown = f"{run.rate:,.0f} inputs/s" if run else "failed"
            print(f"  round {round_no + 1}: {system}: {shown}", flush=True)
    label = {
        PIPE: "raw EOS pipe (no decode/fold)",
        ONE: "reconciler run, 1 process",
        TWO: "reconciler run --processes 2",
        QUIX: "Quix Streams 3.28.1, same fold",
    }
    print()
    print("| system | inputs/s, median (range) | from launch | CPU us/input | decisions/input |")
    print("|---|---|---|---|---|")
    for system in systems:
        done = [r for r in runs[system] if r is not None]
        print(
            f"| {label[system]} | {_spread([r.rate for r in done], _int)} "
            f"| {_spread([r.launch_rate for r in done], _int)} "
            f"| {_spread([r.cpu_us for r in done], _int)} "
            f"| {_spread([r.decisions_per_input for r in done], _ratio)} |"
        )
    for top, bottom in ((ONE, PIPE), (ONE, QUIX), (TWO, ONE), (TWO, QUIX)):
        if top not in runs or bottom not in runs:
            continue
        ratios = [
            a.rate / b.rate
            for a, b in zip(runs[top], runs[bottom], strict=True)
            if a is not None and b is not None
        ]
        print(f"| ratio {label[top]} / {label[bottom]} | {_spread(ratios, _ratio)} | | | |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--sessions", type=int, default=20_000, help="for the throughput runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--commit-ms", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600, help="per run, seconds")
    parser.add_argument("--quix-python", default=str(REPO / ".venv-quix" / "bin" / "python"))
    parser.add_argument("--rates", default="200,1000", help="resumes/s for the latency runs")
    parser.add_argument("--seconds", type=int, default=15, help="per latency run")
    parser.add_argument("--live-sessions", type=int, default=200_000)
    parser.add_argument("--restore-sessions", type=int, default=1_000_000)
    parser.add_argument("--failover-seconds", type=float, default=25, help="load after the kill")
    parser.add_argument("--only", choices=["throughput", "latency", "restore"])
    args = parser.parse_args()
    if args.only in (None, "throughput"):
        throughput(args)
    if args.only in (None, "latency"):
        bench_latency.report(args)
    if args.only in (None, "restore"):
        bench_restore.report(args)


if __name__ == "__main__":
    main()
